//! Every page answers 200 with the security headers, a fragment to htmx, and what it shows.

use crate::support::{get, Fixture};
use axum::http::StatusCode;
use dockhand::ui::Access;

/// The pages the fixture has, by path.
fn pages(f: &Fixture) -> Vec<String> {
    vec![
        "/".into(),
        format!("/actions/{}", f.seeded.pending),
        format!("/actions/{}", f.seeded.failed),
        "/schedules".into(),
    ]
}

const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

#[tokio::test]
async fn every_page_answers_with_the_security_headers() {
    let f = Fixture::new().await;
    for access in [Access::ReadOnly, Access::Operator] {
        let app = f.app(f.config(access));
        for path in pages(&f) {
            let a = get(&app, &path, &[]).await;
            assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text());
            assert_eq!(a.header("content-security-policy"), CSP, "{path}");
            assert_eq!(a.header("x-content-type-options"), "nosniff", "{path}");
            assert_eq!(a.header("referrer-policy"), "no-referrer", "{path}");
            assert_eq!(a.header("cache-control"), "no-store", "{path}");
            assert!(a.header("vary").contains("HX-Request"), "{path}");
            assert!(a.header("content-type").starts_with("text/html"), "{path}");
            let html = a.text();
            assert!(html.starts_with("<!DOCTYPE html>"), "{path}");
            // CSP: nothing inline.
            for banned in [" style=", "<style", " onclick=", " onload=", "<script>"] {
                assert!(!html.contains(banned), "{path} has {banned}");
            }
            assert!(html.contains(
                r#"<meta name="htmx-config" content="{&quot;includeIndicatorStyles&quot;:false,&quot;allowEval&quot;:false, &quot;allowScriptTags&quot;:false,&quot;selfRequestsOnly&quot;:true,&quot;historyCacheSize&quot;:0}">"#
            ), "{path}: {html}");
            assert!(html.contains(r#"<script src="/assets/htmx-2.0.11.min.js" defer>"#));
            assert!(html.contains(&format!(
                r#"<link rel="stylesheet" href="/assets/{}/app.css">"#,
                env!("CARGO_PKG_VERSION")
            )));
            assert!(html.contains(concat!("dockhand ", env!("CARGO_PKG_VERSION"))));
        }
    }
}

#[tokio::test]
async fn htmx_requests_get_the_fragment_only() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    for path in pages(&f) {
        let a = get(&app, &path, &[("hx-request", "true")]).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        let html = a.text();
        assert!(
            !html.contains("<html") && !html.contains("<nav"),
            "{path}: {html}"
        );
        assert!(html.starts_with("<h1>"), "{path}: {html}");
        assert!(a.header("vary").contains("HX-Request"));
    }
}

#[tokio::test]
async fn overview_counts_statuses_and_groups() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let html = get(&app, "/", &[]).await.text();
    // One pending, one failed; the `mail` group (the failed action has no group and is not
    // pending or running, so no ungrouped row).
    assert!(html.contains(r#"<a class="card" href="/actions?status=pending"><div class="label"><span class="badge s-pending">pending</span></div><div class="value">1</div></a>"#), "{html}");
    assert!(html.contains(r#"href="/actions?status=failed"><div class="label"><span class="badge s-failed">failed</span></div><div class="value">1</div>"#), "{html}");
    assert!(
        html.contains(r#"<a href="/actions?status=pending&amp;group=mail">mail</a>"#),
        "{html}"
    );
    assert!(!html.contains("(none)"), "{html}");
    // Due now: the pending action is due at t0.
    assert!(
        html.contains(r#"<div class="label">Due now</div><div class="value">1</div>"#),
        "{html}"
    );
    // The failed action finished at t0 + 1 s, inside the last hour and day.
    assert!(
        !html.contains("No finished actions in this window."),
        "{html}"
    );
    assert!(html.contains("0 completed, 1 failed"), "{html}");
    assert!(html.contains(r#"aria-current="page">Overview"#));
}

#[tokio::test]
async fn action_page_shows_attempts_lease_args_and_log() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let html = get(&app, &format!("/actions/{}", f.seeded.failed), &[])
        .await
        .text();
    // Attempt 1 on w1, failed with the error, 1 s long.
    assert!(
        html.contains(r#"<td class="num">1</td><td><time datetime="2026-03-27T12:00:00.000Z""#),
        "{html}"
    );
    assert!(html.contains("<code>w1</code>"), "{html}");
    assert!(
        html.contains("<td>failed</td><td class=\"wrap\">fatal: bad address</td>"),
        "{html}"
    );
    assert!(html.contains("<td class=\"num\">1s</td>"), "{html}");
    assert!(html.contains("Heartbeats move the lease expiry forward"));
    assert!(
        html.contains("&quot;to&quot;: &quot;broken&quot;"),
        "{html}"
    );
    assert!(html.contains(&format!(r#"href="/actions/{}/args.json""#, f.seeded.failed)));
    for event in ["created", "started", "failed"] {
        assert!(html.contains(&format!("<code>{event}</code>")), "{event}");
    }
    // Times in UTC by default, in the cookie's zone otherwise.
    assert!(html.contains("2026-03-27 12:00:00 UTC"));
    let paris = get(
        &app,
        &format!("/actions/{}", f.seeded.failed),
        &[("cookie", "dh_tz=Europe%2FParis")],
    )
    .await
    .text();
    assert!(paris.contains("2026-03-27 13:00:00 CET"), "{paris}");
    assert!(paris.contains(r#"data-tz="Europe/Paris""#));
    // Dark theme from the cookie, on <html>.
    let dark = get(&app, "/", &[("cookie", "dh_theme=dark")]).await.text();
    assert!(dark.contains(r#"<html lang="en" class="dark""#), "{dark}");

    let json = get(
        &app,
        &format!("/actions/{}/args.json", f.seeded.failed),
        &[],
    )
    .await;
    assert_eq!(json.status, StatusCode::OK);
    assert!(json.header("content-type").starts_with("application/json"));
    assert_eq!(json.header("cache-control"), "no-store");
    let v: serde_json::Value = serde_json::from_slice(&json.body).expect("json");
    assert_eq!(v, serde_json::json!({"to": "broken"}));
}

#[tokio::test]
async fn unknown_records_and_bad_ids_are_refused() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let a = get(&app, "/actions/999999", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.text().contains("action 999999 not found"));
    assert_eq!(a.header("content-security-policy"), CSP);
    let a = get(&app, "/actions/999999/args.json", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&app, "/actions/abc", &[]).await.status,
        StatusCode::BAD_REQUEST
    );
    let a = get(&app, "/no/such/page", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.text().contains("page not found"));
}

#[tokio::test]
async fn schedules_page_lists_recurrence_state_and_next_runs() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let html = get(&app, "/schedules", &[]).await.text();
    assert!(html.contains(&format!(r#"<tr id="schedule-{}">"#, f.seeded.every)));
    assert!(html.contains("reports-every-5m") && html.contains("every 5m"));
    assert!(html.contains("cron <code>0 9 * * *</code>") && html.contains("Europe/Paris"));
    assert!(html.contains(r#"<span class="badge s-disabled">disabled</span>"#));
    // The fixed-rate series: 12:05, 12:10, … 12:25.
    for m in ["05", "10", "15", "20", "25"] {
        assert!(
            html.contains(&format!("<li><time datetime=\"2026-03-27T12:{m}:00.000Z\"")),
            "{m}: {html}"
        );
    }
    assert!(html.contains("COALESCE(next_run_at, updated_at)"));
}

#[tokio::test]
async fn assets_are_the_vendored_bytes_and_cached_for_good() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/ui/assets/");
    let version = env!("CARGO_PKG_VERSION");
    for (path, file, kind) in [
        (
            "/assets/htmx-2.0.11.min.js".to_string(),
            "htmx-2.0.11.min.js",
            "text/javascript",
        ),
        (
            "/assets/htmx-LICENSE.txt".to_string(),
            "htmx-LICENSE.txt",
            "text/plain",
        ),
        (format!("/assets/{version}/app.css"), "app.css", "text/css"),
        (
            format!("/assets/{version}/app.js"),
            "app.js",
            "text/javascript",
        ),
    ] {
        let a = get(&app, &path, &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        let want = std::fs::read(format!("{dir}{file}")).expect("vendored file");
        assert_eq!(a.body, want, "{path}");
        assert_eq!(
            a.header("cache-control"),
            "public, max-age=31536000, immutable",
            "{path}"
        );
        assert!(a.header("content-type").starts_with(kind), "{path}");
        assert_eq!(a.header("x-content-type-options"), "nosniff");
    }
    // The htmx that was checked: npm htmx.org@2.0.11, dist/htmx.min.js.
    let htmx = get(&app, "/assets/htmx-2.0.11.min.js", &[]).await;
    assert_eq!(htmx.body.len(), 52_182);
    assert!(get(&app, "/assets/htmx-LICENSE.txt", &[])
        .await
        .text()
        .starts_with("Zero-Clause BSD"));
}

#[tokio::test]
async fn nested_under_a_base_path_links_stay_absolute() {
    let f = Fixture::new().await;
    let mut cfg = f.config(Access::Operator);
    cfg.base_path = "/queue/".into();
    let app = axum::Router::new().nest("/queue", f.app(cfg));
    let a = get(&app, "/queue", &[]).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let html = a.text();
    assert!(html.contains(r#"href="/queue/schedules""#), "{html}");
    assert!(html.contains(r#"<script src="/queue/assets/htmx-2.0.11.min.js""#));
    assert!(html.contains(r#"data-base="/queue""#));
    let cookie = a
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(
        cookie.contains("; Path=/queue;")
            && cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let s = get(&app, "/queue/schedules", &[]).await;
    assert_eq!(s.status, StatusCode::OK);
    assert!(s.text().contains(r#"action="/queue/schedules/"#));
    let asset = get(&app, "/queue/assets/htmx-2.0.11.min.js", &[]).await;
    assert_eq!(asset.status, StatusCode::OK);
}

#[tokio::test]
async fn a_bad_base_path_answers_500_naming_the_field() {
    let f = Fixture::new().await;
    let mut cfg = f.config(Access::ReadOnly);
    cfg.base_path = "queue".into();
    assert!(dockhand::ui::try_router(f.store.clone(), cfg.clone())
        .err()
        .is_some_and(|e| e.to_string().contains("base_path")));
    let a = get(&f.app(cfg), "/", &[]).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(a.text().contains("invalid base_path"));
}
