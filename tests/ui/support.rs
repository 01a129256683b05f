//! The fixture: a migrated SQLite store, a frozen clock, seeded actions and schedules, and
//! helpers to send requests to a router and read the answer.

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::Router;
use chrono::{DateTime, Duration, TimeZone, Utc};
use dockhand::store::{ClaimRequest, Finish};
use dockhand::ui::{router, Access, UiConfig};
use dockhand::{ActionSpec, DynStore, Queue, Recurrence, ScheduleSpec, TestClock};
use serde_json::json;
use std::sync::Arc;
use tower::ServiceExt;

/// 2026-03-27 12:00 UTC.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap()
}

/// What the fixture seeded.
pub struct Seeded {
    /// A pending action due now (group `mail`).
    pub pending: i64,
    /// A `webhook.call` action that ran once on `w1` and failed with `fatal: bad address`.
    pub failed: i64,
    /// A fixed-rate schedule, every 5 minutes, enabled.
    pub every: i64,
    /// A cron schedule (`0 9 * * *`, Europe/Paris), disabled.
    pub cron: i64,
}

/// A store with seeded data and the clock it was seeded with.
pub struct Fixture {
    pub store: DynStore,
    pub clock: TestClock,
    pub seeded: Seeded,
    _dir: tempfile::TempDir,
}

impl Fixture {
    pub async fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite:{}", dir.path().join("ui.db").display());
        let store = dockhand::store::connect(&url).await.expect("open sqlite");
        store.migrate().await.expect("migrate");
        let clock = TestClock::at(t0());
        let queue = Queue::with_clock(Arc::clone(&store), Arc::new(clock.clone()));
        let pending = queue
            .enqueue(ActionSpec::new("email.send", json!({"to": "a@example.com"})).group("mail"))
            .await
            .expect("enqueue");
        let failed = queue
            .enqueue(ActionSpec::new("webhook.call", json!({"to": "broken"})).max_attempts(1))
            .await
            .expect("enqueue");
        let now = t0();
        let hooks = ["webhook.call".to_string()];
        let claimed = store
            .claim(&ClaimRequest {
                owner: "w1",
                limit: 1,
                now,
                lease_until: now + Duration::seconds(30),
                hooks: Some(&hooks),
                routing: None,
            })
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].id, failed);
        let lease = claimed[0].lease();
        let r = store
            .finish(
                lease,
                &Finish::Fail {
                    error: "fatal: bad address".into(),
                },
                now + Duration::seconds(1),
            )
            .await
            .expect("finish");
        assert_eq!(r, dockhand::store::FinishResult::Applied);
        let every = queue
            .schedule(
                ScheduleSpec::new(
                    "report.build",
                    json!({"kind": "hourly"}),
                    Recurrence::every(Duration::minutes(5)).expect("every"),
                )
                .name("reports-every-5m")
                .starting_at(now + Duration::minutes(5)),
            )
            .await
            .expect("schedule");
        let cron = queue
            .schedule(
                ScheduleSpec::new(
                    "digest.send",
                    json!({}),
                    Recurrence::cron("0 9 * * *", "Europe/Paris").expect("cron"),
                )
                .name("morning-digest"),
            )
            .await
            .expect("schedule");
        assert!(store
            .set_schedule_enabled(cron, false)
            .await
            .expect("disable"));
        Fixture {
            store,
            clock,
            seeded: Seeded {
                pending,
                failed,
                every,
                cron,
            },
            _dir: dir,
        }
    }

    /// The dashboard configuration with this fixture's clock.
    pub fn config(&self, access: Access) -> UiConfig {
        UiConfig {
            access,
            clock: Arc::new(self.clock.clone()),
            csrf_key: Some([7; 32]),
            ..UiConfig::default()
        }
    }

    /// The router over this store.
    pub fn app(&self, cfg: UiConfig) -> Router {
        router(Arc::clone(&self.store), cfg)
    }

    /// An action's status as stored.
    pub async fn status(&self, id: i64) -> String {
        let a = self.store.get(id).await.expect("get").expect("exists");
        a.status.as_str().to_string()
    }
}

/// An answer, read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The value of the `dh_csrf` cookie this answer sets.
    pub fn csrf_cookie(&self) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| c.strip_prefix("dh_csrf="))
            .map(|rest| rest.split(';').next().unwrap_or("").to_string())
    }

    /// The CSRF token rendered in the page's forms.
    pub fn form_token(&self) -> Option<String> {
        let text = self.text();
        let at = text.find("name=\"_csrf\" value=\"")? + "name=\"_csrf\" value=\"".len();
        let end = text[at..].find('"')?;
        Some(text[at..at + end].to_string())
    }
}

/// Sends one request.
pub async fn send(app: &Router, req: Request<Body>) -> Answer {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body")
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// The `Host` a browser on the dashboard's machine sends (the router does not know its port,
/// so the loopback names pass at any port by default).
pub const HOST: &str = "localhost";

/// `headers`, with `Host: localhost` unless they name a `host`.
fn with_host<'a>(headers: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = headers.to_vec();
    if !all.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        all.push(("host", HOST));
    }
    all
}

/// A GET of `path` with these extra headers (and `Host: localhost` unless they give one).
pub async fn get(app: &Router, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::builder().method("GET").uri(path);
    for (k, v) in with_host(headers) {
        b = b.header(k, v);
    }
    send(app, b.body(Body::empty()).expect("request")).await
}

/// A form POST of `path` with `body` and these extra headers (and `Host: localhost` unless
/// they give one).
pub async fn post_form(app: &Router, path: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (k, v) in with_host(headers) {
        b = b.header(k, v);
    }
    send(app, b.body(Body::from(body.to_string())).expect("request")).await
}

/// A browser session: the CSRF cookie and token a first GET of `page` gives.
pub struct Session {
    pub cookie: String,
    pub token: String,
}

impl Session {
    pub async fn open(app: &Router, page: &str, headers: &[(&str, &str)]) -> Session {
        let a = get(app, page, headers).await;
        assert_eq!(a.status, StatusCode::OK, "{page}: {}", a.text());
        let cookie = a.csrf_cookie().expect("the first GET sets dh_csrf");
        let token = a.form_token().expect("an operator page renders a form");
        Session { cookie, token }
    }

    /// The `Cookie` header value.
    pub fn cookie_header(&self) -> String {
        format!("dh_csrf={}", self.cookie)
    }

    /// A same-origin form POST with the token, as a browser sends it.
    pub async fn post(&self, app: &Router, path: &str, extra: &[(&str, &str)]) -> Answer {
        let cookie = self.cookie_header();
        let defaults = [
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", "same-origin"),
            ("origin", "null"),
            ("host", "localhost"),
        ];
        // `extra` replaces a default of the same name.
        let mut headers: Vec<(&str, &str)> = defaults
            .into_iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .collect();
        headers.extend_from_slice(extra);
        post_form(app, path, &format!("_csrf={}", self.token), &headers).await
    }

    /// [`Session::post`] with more form fields (`a=1&b=2`, already encoded) after the token.
    pub async fn post_fields(
        &self,
        app: &Router,
        path: &str,
        fields: &str,
        extra: &[(&str, &str)],
    ) -> Answer {
        let cookie = self.cookie_header();
        let defaults = [
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", "same-origin"),
            ("origin", "null"),
            ("host", "localhost"),
        ];
        // `extra` replaces a default of the same name.
        let mut headers: Vec<(&str, &str)> = defaults
            .into_iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .collect();
        headers.extend_from_slice(extra);
        let body = format!("_csrf={}&{fields}", self.token);
        post_form(app, path, &body, &headers).await
    }
}

/// `&amp;` and friends back to text (the HTML attribute values maud escapes).
pub fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The `href` of the first `<a rel="{rel}" …>` in `html`, unescaped.
pub fn link(html: &str, rel: &str) -> Option<String> {
    let needle = format!(r#"<a rel="{rel}" href=""#);
    let at = html.find(&needle)? + needle.len();
    let end = html[at..].find('"')?;
    Some(unescape(&html[at..at + end]))
}

/// The ids of the rows of a table whose first link is `<td><a href="{prefix}{id}">`.
pub fn row_ids(html: &str, prefix: &str) -> Vec<i64> {
    let needle = format!(r#"<td><a href="{prefix}"#);
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            let end = rest.find('"')?;
            rest[..end].parse().ok()
        })
        .collect()
}

/// The audit events of the whole test process: one process-wide subscriber (installed on the
/// first call), so no event is lost to tracing's callsite-interest cache, which a thread-local
/// subscriber suffers from when other test threads hit the audit callsite first. Each test
/// keeps the lines of its own user ([`Captured::lines_of`], [`basic_auth`]).
pub fn audit_capture() -> &'static Captured {
    static CAPTURE: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c = Captured::default();
        tracing::subscriber::set_global_default(c.subscriber())
            .expect("the ui tests install the only global subscriber");
        c
    })
}

/// Operator credentials for `user` and the `Authorization` header value that sends them.
pub fn basic_auth(user: &str) -> ((String, String), String) {
    use base64::Engine as _;
    let header = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:pw"))
    );
    ((user.to_string(), "pw".to_string()), header)
}

/// Collects what a `tracing` subscriber writes.
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A subscriber writing every event of the audit target, at any level, here.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                dockhand::telemetry::UI_AUDIT_TARGET,
            ))
            .finish()
    }

    /// The lines written so far by requests of `user`.
    pub fn lines_of(&self, user: &str) -> Vec<String> {
        let mine = format!("user={user} ");
        self.lines()
            .into_iter()
            .filter(|l| l.contains(&mine))
            .collect()
    }

    /// The lines written so far.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_string)
            .collect()
    }
}
