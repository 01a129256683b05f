//! The route table, the state shared by every handler ([`AppState`]), the per-request view
//! context ([`Ctx`]) and the helpers every handler uses to answer: [`Ctx::respond`] (a page,
//! or an error page naming what was wrong), [`Ctx::done`] (a POST's answer: 303 to a plain
//! form, a fragment to htmx) and [`audit`].

use super::auth::Credentials;
use super::host::{self, HostRule};
use super::layers::{self, CsrfCookie};
use super::pages::{self, layout};
use super::{assets, csrf, Access, UiConfig, UiUser};
use crate::error::Error;
use crate::store::DynStore;
use crate::telemetry::UI_AUDIT_TARGET;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use maud::Markup;
use std::net::SocketAddr;
use std::sync::Arc;

/// What every handler shares: the store, the configuration and the derived secrets.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The store the pages read and the buttons write.
    pub(crate) store: DynStore,
    /// The configuration as given.
    pub(crate) cfg: Arc<UiConfig>,
    /// The base path without a trailing slash (`""` for `/`).
    pub(crate) base: Arc<str>,
    /// The CSRF cookie's `Path`.
    pub(crate) cookie_path: Arc<str>,
    /// The CSRF HMAC key.
    pub(crate) csrf_key: [u8; 32],
    /// The accepted basic-auth credentials.
    pub(crate) creds: Arc<Credentials>,
    /// The `Host` names this router answers to; `None` when it does not check.
    pub(crate) host_rule: Option<Arc<HostRule>>,
    /// The overview's single-flight cached reads.
    pub(crate) overview: Arc<pages::overview::OverviewCache>,
}

/// The dashboard's router, to nest under `cfg.base_path` in a host's router (or to serve as
/// it is when the base path is `/`). A configuration that [`try_router`] refuses gives a
/// router that answers every request with 500 and the reason (and logs it), so a
/// misconfiguration is seen, not a panic.
pub fn router(store: DynStore, cfg: UiConfig) -> Router {
    match try_router(store, cfg) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("dashboard misconfigured: {e}");
            let message = format!("dashboard misconfigured: {e}\n");
            Router::new()
                .fallback(move || {
                    let m = message.clone();
                    async move { (StatusCode::INTERNAL_SERVER_ERROR, m) }
                })
                .layer(axum::middleware::from_fn(layers::security_headers))
        }
    }
}

/// [`router`], or the error naming the configuration field that is wrong (`base_path`, see
/// [`super::validate_base_path`]; `allowed_hosts`, see [`super::validate_allowed_host`]).
pub fn try_router(store: DynStore, cfg: UiConfig) -> crate::Result<Router> {
    let st = state(store, cfg)?;
    Ok(layered(routes(), st))
}

/// The router `dockhand ui` serves: the dashboard under `cfg.base_path`, and for every path
/// outside it the dashboard's 404 page, through the same layers (`Host` check, security
/// headers). For mounting in your own application use [`router`]; its 404s outside the base
/// path are your router's.
pub fn standalone_router(store: DynStore, cfg: UiConfig) -> crate::Result<Router> {
    let st = state(store, cfg)?;
    let routes = if st.base.is_empty() {
        routes()
    } else {
        Router::new().nest(&st.base, routes())
    };
    Ok(layered(routes, st))
}

/// The shared state of a router over `store` with `cfg`, the configuration checked.
fn state(store: DynStore, cfg: UiConfig) -> crate::Result<AppState> {
    let base = cfg.base()?;
    let creds = Credentials::new(
        cfg.basic_auth.as_ref(),
        cfg.read_only_auth.as_ref(),
        cfg.access,
    );
    let host_rule = HostRule::new(cfg.host_check, &cfg.allowed_hosts, creds.required())?;
    Ok(AppState {
        store,
        csrf_key: cfg.csrf_key.unwrap_or_else(csrf::random_key),
        cookie_path: if base.is_empty() {
            "/".into()
        } else {
            base.as_str().into()
        },
        base: base.into(),
        creds: Arc::new(creds),
        host_rule: host_rule.map(Arc::new),
        overview: Arc::new(pages::overview::OverviewCache::new()),
        cfg: Arc::new(cfg),
    })
}

/// `routes` with the dashboard's 404 page for what they do not match, behind the layers,
/// outermost first: security headers, `Host` check, authentication, CSRF guard, error pages.
fn layered(routes: Router<AppState>, st: AppState) -> Router {
    use axum::middleware::{from_fn, from_fn_with_state};
    routes
        .fallback(not_found)
        .layer(from_fn_with_state(st.clone(), layers::error_pages))
        .layer(from_fn_with_state(st.clone(), layers::guard))
        .layer(from_fn_with_state(st.clone(), layers::authenticate))
        .layer(from_fn_with_state(st.clone(), host::check))
        .layer(from_fn(layers::security_headers))
        .with_state(st)
}

fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/metrics", get(metrics))
        .route("/actions/{id}", get(pages::action::page))
        .route("/actions/{id}/args.json", get(pages::action::args_json))
        .route("/actions/{id}/retry", post(pages::action::retry))
        .route("/actions/{id}/cancel", post(pages::action::cancel))
        .route("/actions", get(pages::actions::page))
        .route("/actions/bulk", post(pages::bulk::selected))
        .route("/actions/bulk/preview", post(pages::bulk::preview))
        .route("/actions/bulk/all", post(pages::bulk::all))
        .route("/groups", get(pages::groups::page))
        .route("/groups/pause", post(pages::groups::pause))
        .route("/groups/resume", post(pages::groups::resume))
        .route("/groups/limit", post(pages::group_limits::set))
        .route("/groups/unlimit", post(pages::group_limits::clear))
        .route("/jobs", get(pages::jobs::list))
        .route("/jobs/{id}", get(pages::jobs::page))
        .route("/jobs/{id}/fail", post(pages::jobs::fail))
        .route("/jobs/{id}/cancel", post(pages::jobs::cancel))
        .route("/batches", get(pages::batches::list))
        .route("/batches/{id}", get(pages::batches::page))
        .route("/batches/{id}/cancel", post(pages::batches::cancel))
        .route("/batches/{id}/rerun", post(pages::batches::rerun))
        .route("/claims", get(pages::claims::page))
        .route("/schedules", get(pages::schedules::page))
        .route("/schedules/{id}/run", post(pages::schedules::run_now))
        .route("/schedules/{id}/enable", post(pages::schedules::enable))
        .route("/schedules/{id}/disable", post(pages::schedules::disable))
        .merge(assets::routes())
}

/// `GET /metrics`: the Prometheus text of [`UiConfig::metrics`], never cached; 404 when the
/// router has none.
async fn metrics(axum::extract::State(st): axum::extract::State<AppState>, ctx: Ctx) -> Response {
    match &st.cfg.metrics {
        Some(h) => (
            [
                (header::CONTENT_TYPE, crate::prometheus::CONTENT_TYPE),
                (header::CACHE_CONTROL, "no-store"),
            ],
            h.render(),
        )
            .into_response(),
        None => not_found(ctx).await,
    }
}

async fn not_found(ctx: Ctx) -> Response {
    ctx.respond(Err(Error::NotFound {
        what: "page",
        id: 0,
    }))
}

/// Light or dark, from the `dh_theme` cookie; `None` follows `prefers-color-scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Theme {
    /// Light colours.
    Light,
    /// Dark colours.
    Dark,
}

/// Everything a page needs to know about the request it answers.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// The base path without a trailing slash.
    pub(crate) base: Arc<str>,
    /// What the caller may do.
    pub(crate) access: Access,
    /// Who the caller is (audit).
    pub(crate) user: String,
    /// The CSRF token for forms and `hx-headers`.
    pub(crate) csrf: String,
    /// The timezone times are shown in (`dh_tz` cookie); `None` is UTC.
    pub(crate) tz: Option<Tz>,
    /// The `dh_theme` cookie.
    pub(crate) theme: Option<Theme>,
    /// The `dh_refresh` cookie: live refresh every n seconds (0 = off); `None` = the page's
    /// default.
    pub(crate) refresh: Option<u32>,
    /// The request came from htmx (`HX-Request`): answer with a fragment.
    pub(crate) hx: bool,
    /// The current time, from the configured clock.
    pub(crate) now: DateTime<Utc>,
    /// The peer address, when the server gives it.
    pub(crate) remote: Option<SocketAddr>,
}

impl FromRequestParts<AppState> for Ctx {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, Self::Rejection> {
        Ok(Ctx::of(&parts.headers, &parts.extensions, st))
    }
}

impl Ctx {
    /// The context of a request with these headers and extensions (what the layers have set
    /// so far: [`Access`], [`UiUser`], the CSRF cookie). Without an [`Access`] the caller is
    /// read-only.
    pub(crate) fn of(headers: &HeaderMap, extensions: &Extensions, st: &AppState) -> Ctx {
        let access = extensions
            .get::<Access>()
            .copied()
            .unwrap_or(Access::ReadOnly);
        let user = extensions
            .get::<UiUser>()
            .map(|u| u.0.clone())
            .unwrap_or_default();
        let cookie = extensions
            .get::<CsrfCookie>()
            .map(|c| c.0.clone())
            .unwrap_or_default();
        let cookies = headers
            .get(header::COOKIE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let tz = csrf::cookie_value(cookies, "dh_tz")
            .filter(|v| !v.eq_ignore_ascii_case("utc"))
            .and_then(|v| v.replace("%2F", "/").parse::<Tz>().ok());
        let theme = match csrf::cookie_value(cookies, "dh_theme") {
            Some("dark") => Some(Theme::Dark),
            Some("light") => Some(Theme::Light),
            _ => None,
        };
        let refresh = csrf::cookie_value(cookies, "dh_refresh")
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|s| *s <= 3600);
        Ctx {
            refresh,
            base: Arc::clone(&st.base),
            access,
            csrf: csrf::token(&st.csrf_key, &cookie, &user),
            user,
            tz,
            theme,
            hx: headers.contains_key("hx-request"),
            now: st.cfg.clock.now(),
            remote: extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0),
        }
    }

    /// An absolute link to `path` (which starts with `/`) under the base path.
    pub(crate) fn href(&self, path: &str) -> String {
        match (&*self.base, path) {
            ("", p) => p.to_string(),
            (b, "/") => b.to_string(),
            (b, p) => format!("{b}{p}"),
        }
    }

    /// Whether the caller may act.
    pub(crate) fn operator(&self) -> bool {
        self.access == Access::Operator
    }

    /// A rendered page, or the error page: 400 naming the field for bad input, 404 for
    /// what does not exist, 500 (logged) for everything else.
    pub(crate) fn respond(&self, result: crate::Result<Response>) -> Response {
        match result {
            Ok(r) => r,
            Err(e) => {
                let status = match &e {
                    Error::InvalidInput { .. } => StatusCode::BAD_REQUEST,
                    Error::NotFound { .. } => StatusCode::NOT_FOUND,
                    _ => {
                        tracing::error!(target: "dockhand::ui", "page failed: {e}");
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                };
                let message = match &e {
                    Error::NotFound { what: "page", .. } => "page not found".to_string(),
                    other => other.to_string(),
                };
                (status, layout::error_page(self, status, &message)).into_response()
            }
        }
    }

    /// A POST's answer: to htmx, the fragment `fragment` renders (the new content of
    /// `<main>`); to a plain form, 303 to `to` (a path under the base, may hold a query) with
    /// `msg=<notice>` added.
    ///
    /// Called once the change is made, so it never answers an error (the result is always
    /// `Ok`): a fragment that fails to render becomes the notice and a line saying the page
    /// could not be shown again (logged), and a `to` that is no valid `Location` becomes the
    /// overview.
    pub(crate) async fn done<F, Fut>(
        &self,
        to: &str,
        notice: layout::Notice,
        fragment: F,
    ) -> crate::Result<Response>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = crate::Result<Markup>>,
    {
        if self.hx {
            return Ok(match fragment().await {
                Ok(markup) => layout::html(markup),
                Err(e) => {
                    tracing::error!(target: "dockhand::ui", "re-rendering after a change failed: {e}");
                    layout::html(layout::changed_but_not_shown(self, notice, to, &e))
                }
            });
        }
        let sep = if to.contains('?') { '&' } else { '?' };
        let mut location = format!("{}{sep}msg={}", self.href(to), notice.code());
        if HeaderValue::from_str(&location).is_err() {
            tracing::error!(target: "dockhand::ui", "not a valid Location after a change: {location:?}");
            location = format!("{}?msg={}", self.href("/"), notice.code());
        }
        Ok(Redirect::to(&location).into_response())
    }
}

impl AppState {
    /// The job handle: the configured one (with pipelines, for step names), or one that knows
    /// none.
    pub(crate) fn jobs(&self) -> crate::jobs::api::Jobs {
        self.cfg.jobs.clone().unwrap_or_else(|| {
            crate::jobs::api::Jobs::without_pipelines(
                Arc::clone(&self.store),
                Arc::clone(&self.cfg.clock),
            )
        })
    }
}

/// Writes the audit event of one bulk operator POST: a dry run (`dry_run`, `count` = rows
/// matching) or a change (`count` = rows given, with the changed and skipped counts).
pub(crate) fn audit_bulk(
    ctx: &Ctx,
    op: &'static str,
    what: &str,
    dry_run: bool,
    count: u64,
    outcome: &crate::store::BulkOutcome,
) {
    let remote = ctx.remote.map(|r| r.to_string()).unwrap_or_default();
    tracing::info!(
        target: UI_AUDIT_TARGET,
        user = %ctx.user,
        access = ctx.access.as_str(),
        remote = %remote,
        op,
        ids = what,
        dry_run,
        count,
        changed = outcome.changed.len(),
        skipped = outcome.skipped.len(),
        "dashboard bulk {op}"
    );
}

/// Writes the audit event of one operator POST (target [`UI_AUDIT_TARGET`]).
pub(crate) fn audit(ctx: &Ctx, op: &'static str, ids: &str, count: u64, changed: u64) {
    let remote = ctx.remote.map(|r| r.to_string()).unwrap_or_default();
    tracing::info!(
        target: UI_AUDIT_TARGET,
        user = %ctx.user,
        access = ctx.access.as_str(),
        remote = %remote,
        op,
        ids,
        dry_run = false,
        count,
        changed,
        skipped = count.saturating_sub(changed),
        "dashboard {op}"
    );
}
