//! Pausing and resuming a group from the groups page: the pause is stored (and claims skip the
//! group, which the conformance suite checks), shown with a Resume button, audited, refused to
//! read-only callers, and an empty group name is a 400 naming the field.

use crate::support::{get, post_form, Fixture, Session};
use axum::http::StatusCode;
use dockhand::ui::Access;

async fn post_group(app: &axum::Router, s: &Session, path: &str, group: &str) -> StatusCode {
    let cookie = s.cookie_header();
    let body = format!("_csrf={}&group={group}", s.token);
    let headers = [
        ("cookie", cookie.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("host", "localhost"),
    ];
    post_form(app, path, &body, &headers).await.status
}

#[tokio::test]
async fn a_group_is_paused_and_resumed_from_its_page() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let s = Session::open(&app, "/groups", &[]).await;
    let html = get(&app, "/groups", &[]).await.text();
    assert!(
        html.contains(r#"name="group" value="mail""#) && html.contains(">Pause<"),
        "{html}"
    );

    assert_eq!(
        post_group(&app, &s, "/groups/pause", "mail").await,
        StatusCode::SEE_OTHER
    );
    let pauses = f.store.paused_groups().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].group, "mail");
    assert_eq!(pauses[0].paused_by, "ui:anonymous");
    let html = get(&app, "/groups?msg=group-paused", &[]).await.text();
    assert!(html.contains("Group paused"), "{html}");
    assert!(
        html.contains(">Resume<") && html.contains("paused"),
        "{html}"
    );

    assert_eq!(
        post_group(&app, &s, "/groups/resume", "mail").await,
        StatusCode::SEE_OTHER
    );
    assert!(f.store.paused_groups().await.unwrap().is_empty());
    assert_eq!(
        post_group(&app, &s, "/groups/pause", "").await,
        StatusCode::BAD_REQUEST
    );
    assert!(f.store.paused_groups().await.unwrap().is_empty());
}

#[tokio::test]
async fn read_only_callers_cannot_pause() {
    let f = Fixture::new().await;
    let ro = f.app(f.config(Access::ReadOnly));
    let html = get(&ro, "/groups", &[]).await.text();
    assert!(!html.contains(">Pause<"), "{html}");
    let op = f.app(f.config(Access::Operator));
    let s = Session::open(&op, "/groups", &[]).await;
    assert_eq!(
        post_group(&ro, &s, "/groups/pause", "mail").await,
        StatusCode::FORBIDDEN
    );
    assert!(f.store.paused_groups().await.unwrap().is_empty());
}
