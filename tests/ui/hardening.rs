//! Issue 18's hardening: the base path is validated; every response, the outer router's 404
//! and axum's extractor rejections included, carries the security headers and is the
//! dashboard's error page; a bulk change with a bad `back` is a 400 with nothing changed, and
//! a change that was made is never answered with an error.

use crate::support::{get, send, Answer, Fixture, Session};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::ui::{router, standalone_router, try_router, validate_base_path, Access, UiConfig};
use std::sync::Arc;

/// The headers every dashboard response carries, as an ordinary page has them.
const SECURITY_HEADERS: [&str; 4] = [
    "content-security-policy",
    "x-content-type-options",
    "referrer-policy",
    "cache-control",
];

/// `a` is the dashboard's error page with `status`, mentioning `needle`, with the same
/// security headers as `page` (an ordinary page of the same router).
fn assert_error_page(a: &Answer, page: &Answer, status: StatusCode, needle: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    for h in SECURITY_HEADERS {
        assert!(!page.header(h).is_empty(), "the page has {h}");
        assert_eq!(a.header(h), page.header(h), "{h}");
    }
    assert!(a.header("content-type").starts_with("text/html"));
    let html = a.text();
    assert!(
        html.contains(&format!("<h1>{} ", status.as_u16())) && html.contains("role=\"alert\""),
        "{html}"
    );
    assert!(
        html.contains("class=\"topbar\""),
        "the dashboard's frame: {html}"
    );
    assert!(html.contains(needle), "{needle}: {html}");
}

#[test]
fn base_paths_are_validated() {
    for (ok, base) in [
        ("/", ""),
        ("/queue", "/queue"),
        ("/queue/", "/queue"),
        ("/ops/queue-1.v2_~", "/ops/queue-1.v2_~"),
    ] {
        assert_eq!(validate_base_path(ok).ok().as_deref(), Some(base), "{ok}");
    }
    for (bad, why) in [
        ("//evil.example", "empty segment"),
        ("//", "empty segment"),
        ("/queue//x", "empty segment"),
        ("", "must start with `/`"),
        ("queue", "must start with `/`"),
        ("https://evil.example", "must start with `/`"),
        ("/.", "`.` segment"),
        ("/queue/..", "`..` segment"),
        ("/a/../b", "`..` segment"),
        ("/a b", "only letters"),
        ("/a%2Fb", "only letters"),
        ("/a\\b", "only letters"),
        ("/a?b", "only letters"),
        ("/a#b", "only letters"),
        ("/é", "only letters"),
        ("/a\r\nb", "only letters"),
        ("/{id}", "only letters"),
    ] {
        let e = validate_base_path(bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("invalid base_path") && e.contains(why),
            "{bad:?}: {e}"
        );
    }
}

#[tokio::test]
async fn a_bad_base_path_is_a_configuration_error() {
    let f = Fixture::new().await;
    let cfg = UiConfig {
        base_path: "//evil.example".into(),
        ..f.config(Access::Operator)
    };
    for e in [
        try_router(Arc::clone(&f.store), cfg.clone()).err(),
        standalone_router(Arc::clone(&f.store), cfg.clone()).err(),
    ] {
        let e = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("base_path") && e.contains("//evil.example"),
            "{e}"
        );
    }
    // `router` never renders a link with it: every request gets the reason.
    let a = get(&router(Arc::clone(&f.store), cfg), "/", &[]).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(a.text().contains("base_path") && !a.text().contains("href"));
    assert!(!a.header("content-security-policy").is_empty());
}

#[tokio::test]
async fn paths_outside_the_base_path_get_the_dashboards_404() {
    let f = Fixture::new().await;
    let cfg = UiConfig {
        base_path: "/queue".into(),
        ..f.config(Access::Operator)
    };
    let app = standalone_router(Arc::clone(&f.store), cfg).expect("router");
    let page = get(&app, "/queue", &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text());
    assert!(page.text().contains("href=\"/queue/actions\""));
    for path in [
        "/",
        "/elsewhere",
        "/actions",
        "/queuex",
        "/assets/htmx-2.0.11.min.js",
        "/queue/nope",
    ] {
        let a = get(&app, path, &[]).await;
        assert_error_page(&a, &page, StatusCode::NOT_FOUND, "page not found");
        assert!(
            a.text().contains("href=\"/queue\""),
            "{path}: links stay under the base"
        );
    }
    // The typed path under the base path too.
    let a = get(&app, "/queue/actions/abc", &[]).await;
    assert_error_page(&a, &page, StatusCode::BAD_REQUEST, "abc");
}

#[tokio::test]
async fn extractor_rejections_are_the_dashboards_error_page() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let page = get(&app, "/", &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    for (path, needle) in [
        ("/actions/abc", "abc"),
        ("/actions/1.5/args.json", "1.5"),
        ("/actions/99999999999999999999", "99999999999999999999"),
        ("/jobs/abc", "abc"),
        ("/batches/%3Cscript%3E", "&lt;script&gt;"),
    ] {
        let a = get(&app, path, &[]).await;
        assert_error_page(&a, &page, StatusCode::BAD_REQUEST, needle);
        assert!(!a.text().contains("<script>"), "{path}: escaped");
    }
    // A typed query: `changed` is a number.
    let a = get(
        &app,
        &format!("/actions/{}?changed=lots", f.seeded.pending),
        &[],
    )
    .await;
    assert_error_page(&a, &page, StatusCode::BAD_REQUEST, "changed");
    // Hx requests get the fragment, still with the headers.
    let a = get(&app, "/actions/abc", &[("hx-request", "true")]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().starts_with("<h1>400 "), "{}", a.text());
    assert_eq!(
        a.header("content-security-policy"),
        page.header("content-security-policy")
    );

    // Writes: a typed path behind a valid session, a GET-only route, a non-form body.
    let s = Session::open(&app, &format!("/actions/{}", f.seeded.pending), &[]).await;
    let a = s.post(&app, "/actions/abc/cancel", &[]).await;
    assert_error_page(&a, &page, StatusCode::BAD_REQUEST, "abc");
    let a = s.post(&app, "/groups", &[]).await;
    assert_error_page(
        &a,
        &page,
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed",
    );
    assert!(!a.header("allow").is_empty(), "the Allow header is kept");
    let req = Request::builder()
        .method("POST")
        .uri("/actions/bulk")
        .header("host", "localhost")
        .header("cookie", s.cookie_header())
        .header("x-csrf-token", s.token.as_str())
        .header("content-type", "text/plain")
        .body(Body::from(format!("id={}&op=cancel", f.seeded.pending)))
        .expect("request");
    let a = send(&app, req).await;
    assert!(a.status.is_client_error(), "{}", a.status);
    assert_error_page(&a, &page, a.status, "Content-Type");
    assert_eq!(f.status(f.seeded.pending).await, "pending");
}

#[tokio::test]
async fn refusals_are_the_dashboards_error_page() {
    let f = Fixture::new().await;
    let mut cfg = f.config(Access::Operator);
    cfg.basic_auth = Some(("admin".into(), "s3cret".into()));
    let app = f.app(cfg);
    let a = get(&app, "/", &[]).await;
    let page = a.headers.clone();
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.header("www-authenticate").starts_with("Basic "));
    assert!(a.text().contains("<h1>401 ") && a.text().contains("authentication required"));
    assert!(page.get("content-security-policy").is_some());

    let ro = f.app(f.config(Access::ReadOnly));
    let ok = get(&ro, "/", &[]).await;
    let s = Session::open(&f.app(f.config(Access::Operator)), "/schedules", &[]).await;
    let a = s
        .post(&ro, &format!("/actions/{}/cancel", f.seeded.pending), &[])
        .await;
    assert_error_page(&a, &ok, StatusCode::FORBIDDEN, "read-only");
}

/// `back` values a bulk change must refuse, form-encoded.
const BAD_BACKS: [&str; 9] = [
    "%2Factions%0D%0ASet-Cookie%3A%20x%3Dy",
    "%2Factions%3Fstatus%3Dpending%0A",
    "%2Factions%00",
    "%2Factions%7F",
    "%2F%2Fevil.example%2Factions",
    "https%3A%2F%2Fevil.example%2Factions",
    "%2Factions%2F..%2F..%2Fgroups",
    "%2Factions%3Fa%3D%C3%A9",
    "%2Fgroups",
];

#[tokio::test]
async fn a_bad_back_is_refused_before_anything_changes() {
    let f = Fixture::new().await;
    let app = f.app(UiConfig {
        bulk_pause: std::time::Duration::ZERO,
        ..f.config(Access::Operator)
    });
    let page = get(&app, "/actions", &[]).await;
    let s = Session::open(&app, "/actions", &[]).await;
    for back in BAD_BACKS {
        for hx in [false, true] {
            let extra: &[(&str, &str)] = if hx { &[("hx-request", "true")] } else { &[] };
            let a = s
                .post_fields(
                    &app,
                    "/actions/bulk",
                    &format!(
                        "id={}&id={}&op=cancel&back={back}",
                        f.seeded.pending, f.seeded.failed
                    ),
                    extra,
                )
                .await;
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{back}: {}", a.text());
            assert!(a.text().contains("invalid back"), "{back}: {}", a.text());
            assert!(a.text().contains("nothing was changed"));
            if !hx {
                assert_error_page(&a, &page, StatusCode::BAD_REQUEST, "invalid back");
            }
            let a = s
                .post_fields(
                    &app,
                    "/actions/bulk/all",
                    &format!("status=pending&op=delete&max_id=1000000&back={back}"),
                    extra,
                )
                .await;
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{back}: {}", a.text());
            assert_eq!(f.status(f.seeded.pending).await, "pending", "{back}");
            assert_eq!(f.status(f.seeded.failed).await, "failed", "{back}");
        }
    }
    // A good `back` still takes the change (and keeps the list's filter).
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!(
                "id={}&op=cancel&back=%2Factions%3Fstatus%3Dpending",
                f.seeded.pending
            ),
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(
        a.header("location"),
        "/actions?status=pending&changed=1&skipped=0&msg=bulk"
    );
    assert_eq!(f.status(f.seeded.pending).await, "canceled");
}

#[tokio::test]
async fn a_change_that_was_made_is_never_answered_with_an_error() {
    let f = Fixture::new().await;
    let faulty = FaultyStore::wrap(Arc::clone(&f.store));
    let store: dockhand::DynStore = faulty.clone();
    let app = router(store, f.config(Access::Operator));
    let s = Session::open(&app, "/actions", &[]).await;
    // Every list read from now on fails: the change commits, re-rendering the list does not.
    faulty.fail_from("search_actions", 1, FaultMode::FailBefore);
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!("id={}&op=cancel&back=%2Factions", f.seeded.pending),
            &[("hx-request", "true")],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert!(
        a.text().contains("The change was made") && a.text().contains("href=\"/actions?changed=1"),
        "{}",
        a.text()
    );
    assert_eq!(f.status(f.seeded.pending).await, "canceled");
    assert!(faulty.injected() > 0, "the re-render was faulted");
}
