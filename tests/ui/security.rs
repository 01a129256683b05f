//! Read-only access, CSRF, cross-site refusal, basic auth and the host's own access layer.

use crate::support::{get, post_form, Fixture, Session};
use axum::http::StatusCode;
use base64::Engine;
use dockhand::ui::{Access, UiUser};

fn basic(user: &str, pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

#[tokio::test]
async fn read_only_renders_no_forms_and_refuses_every_post() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let paths = [
        "/".to_string(),
        format!("/actions/{}", f.seeded.pending),
        format!("/actions/{}", f.seeded.failed),
        "/schedules".to_string(),
    ];
    for path in &paths {
        let html = get(&app, path, &[]).await.text();
        assert!(!html.contains("<form"), "{path}");
        assert!(!html.contains("method=\"post\""), "{path}");
        assert!(!html.contains("<button type=\"submit\""), "{path}");
    }
    // A read-only caller with a perfectly good cookie and token still gets 403.
    let op = f.app(f.config(Access::Operator));
    let s = Session::open(&op, "/schedules", &[]).await;
    for path in [
        format!("/actions/{}/cancel", f.seeded.pending),
        format!("/actions/{}/retry", f.seeded.failed),
        format!("/schedules/{}/run", f.seeded.every),
        format!("/schedules/{}/disable", f.seeded.every),
        format!("/schedules/{}/enable", f.seeded.cron),
    ] {
        let a = s.post(&app, &path, &[]).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}");
        assert!(a.text().contains("read-only"), "{path}");
    }
    assert_eq!(f.status(f.seeded.pending).await, "pending");
    assert_eq!(f.status(f.seeded.failed).await, "failed");
    let schedules = f.store.schedules().await.expect("schedules");
    assert!(schedules
        .iter()
        .any(|s| s.id == f.seeded.every && s.enabled));
    assert!(schedules
        .iter()
        .any(|s| s.id == f.seeded.cron && !s.enabled));
}

#[tokio::test]
async fn posts_need_the_cookie_and_its_token() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let s = Session::open(&app, &format!("/actions/{}", f.seeded.pending), &[]).await;
    let path = format!("/actions/{}/cancel", f.seeded.pending);
    let cookie = s.cookie_header();
    let other = Session::open(&app, "/schedules", &[]).await;
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);
    let cases: Vec<Case> = vec![
        ("no token", String::new(), vec![("cookie", cookie.as_str())]),
        (
            "wrong token",
            "_csrf=AAAA".into(),
            vec![("cookie", cookie.as_str())],
        ),
        (
            "another session's token",
            format!("_csrf={}", other.token),
            vec![("cookie", cookie.as_str())],
        ),
        ("no cookie", format!("_csrf={}", s.token), vec![]),
        (
            "wrong header token",
            String::new(),
            vec![("cookie", cookie.as_str()), ("x-csrf-token", "AAAA")],
        ),
    ];
    for (why, body, headers) in cases {
        let a = post_form(&app, &path, &body, &headers).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{why}: {}", a.text());
        assert_eq!(f.status(f.seeded.pending).await, "pending", "{why}");
    }
    // The header form htmx sends (hx-headers on <body>) works as well as the form field.
    let a = post_form(
        &app,
        &path,
        "",
        &[
            ("cookie", cookie.as_str()),
            ("x-csrf-token", s.token.as_str()),
        ],
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(f.status(f.seeded.pending).await, "canceled");
}

#[tokio::test]
async fn the_body_carries_the_token_for_htmx() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let a = get(&app, "/", &[]).await;
    let token = a.form_token();
    let html = a.text();
    // The overview has no form, so read the token from hx-headers instead.
    assert!(token.is_none());
    let at = html.find("hx-headers=\"").expect("hx-headers on body") + "hx-headers=\"".len();
    let end = html[at..].find('"').expect("closing quote");
    let value = html[at..at + end].replace("&quot;", "\"");
    let v: serde_json::Value = serde_json::from_str(&value).expect("hx-headers is JSON");
    assert!(
        v["X-CSRF-Token"].as_str().is_some_and(|t| t.len() == 43),
        "{value}"
    );
}

#[tokio::test]
async fn cross_site_requests_are_refused() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let s = Session::open(&app, &format!("/actions/{}", f.seeded.pending), &[]).await;
    let path = format!("/actions/{}/cancel", f.seeded.pending);
    let a = s
        .post(&app, &path, &[("sec-fetch-site", "cross-site")])
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.text().contains("cross-site"));
    let a = s
        .post(&app, &path, &[("origin", "https://evil.example")])
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.text().contains("Origin"));
    assert_eq!(f.status(f.seeded.pending).await, "pending");
    // Same origin by Origin and Host passes.
    let a = s.post(&app, &path, &[("origin", "http://localhost")]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(f.status(f.seeded.pending).await, "canceled");
}

#[tokio::test]
async fn basic_auth_gates_every_page_and_gives_each_credential_its_access() {
    let f = Fixture::new().await;
    let mut cfg = f.config(Access::Operator);
    cfg.basic_auth = Some(("admin".into(), "s3cret".into()));
    cfg.read_only_auth = Some(("viewer".into(), "look".into()));
    let app = f.app(cfg);
    let a = get(&app, "/", &[]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a
        .header("www-authenticate")
        .starts_with("Basic realm=\"dockhand\""));
    assert!(!a.header("content-security-policy").is_empty());
    let wrong = basic("admin", "nope");
    assert_eq!(
        get(&app, "/", &[("authorization", wrong.as_str())])
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let asset = get(&app, "/assets/htmx-2.0.11.min.js", &[]).await;
    assert_eq!(asset.status, StatusCode::UNAUTHORIZED);

    let admin = basic("admin", "s3cret");
    let page = format!("/actions/{}", f.seeded.pending);
    let a = get(&app, &page, &[("authorization", admin.as_str())]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.text().contains("<form"));
    assert!(a.text().contains(">operator<"));

    let viewer = basic("viewer", "look");
    let a = get(&app, &page, &[("authorization", viewer.as_str())]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(!a.text().contains("<form"));
    assert!(a.text().contains(">read-only<"));

    // The token binds the user: the viewer cannot use the admin's, and is read-only anyway.
    let s = Session::open(&app, &page, &[("authorization", admin.as_str())]).await;
    let path = format!("/actions/{}/cancel", f.seeded.pending);
    let a = s
        .post(&app, &path, &[("authorization", viewer.as_str())])
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let a = s
        .post(&app, &path, &[("authorization", admin.as_str())])
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(f.status(f.seeded.pending).await, "canceled");
}

#[tokio::test]
async fn a_host_access_extension_wins() {
    let f = Fixture::new().await;
    // Embedded with the default (read-only), behind a host layer that says operator.
    let inner = f.app(f.config(Access::ReadOnly));
    let app = axum::Router::new()
        .merge(inner)
        .layer(axum::Extension(Access::Operator))
        .layer(axum::Extension(UiUser("alice".into())));
    let page = format!("/actions/{}", f.seeded.pending);
    let html = get(&app, &page, &[]).await.text();
    assert!(html.contains("<form"), "{html}");
    let s = Session::open(&app, &page, &[]).await;
    let a = s
        .post(&app, &format!("/actions/{}/cancel", f.seeded.pending), &[])
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    // And the other way round: basic-auth operator credentials, but the host says read-only.
    let mut cfg = f.config(Access::Operator);
    cfg.basic_auth = Some(("admin".into(), "s3cret".into()));
    let app = axum::Router::new()
        .merge(f.app(cfg))
        .layer(axum::Extension(Access::ReadOnly));
    let a = get(&app, &format!("/actions/{}", f.seeded.failed), &[]).await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "the host authenticated the caller"
    );
    assert!(!a.text().contains("<form"));
}
