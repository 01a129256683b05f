//! Group limits on the groups page: set from the editor (stored with the user, shown with the
//! running count and the rate), bad fields are a 400 naming them, cleared with the Clear
//! button, and the forms are hidden from and refused to read-only callers.

use crate::support::{get, post_form, Answer, Fixture, Session};
use axum::http::StatusCode;
use dockhand::ui::Access;

async fn post(app: &axum::Router, s: &Session, path: &str, fields: &str) -> Answer {
    let cookie = s.cookie_header();
    let body = format!("_csrf={}&{fields}", s.token);
    let headers = [
        ("cookie", cookie.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("host", "localhost"),
    ];
    post_form(app, path, &body, &headers).await
}

#[tokio::test]
async fn a_group_limit_is_set_shown_and_cleared_from_the_groups_page() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let s = Session::open(&app, "/groups", &[]).await;
    let html = get(&app, "/groups", &[]).await.text();
    assert!(
        html.contains("No group has limits.") && html.contains(">Set limit<"),
        "{html}"
    );

    let set = post(
        &app,
        &s,
        "/groups/limit",
        "group=mail&concurrency=2&rate=10%2Fs",
    )
    .await;
    assert_eq!(set.status, StatusCode::SEE_OTHER);
    let limits = f
        .store
        .group_limits(dockhand::Clock::now(&f.clock))
        .await
        .unwrap();
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].group, "mail");
    assert_eq!(limits[0].limit.concurrency, Some(2));
    assert_eq!(
        limits[0].limit.rate.map(|r| r.to_string()).as_deref(),
        Some("10/1s")
    );
    assert_eq!(limits[0].set_by, "ui:anonymous");
    let html = get(&app, "/groups?msg=group-limited", &[]).await.text();
    assert!(html.contains("Group limits set"), "{html}");
    assert!(
        html.contains("0 / 2") && html.contains("0 / 10/1s"),
        "{html}"
    );
    assert!(
        html.contains(r#"value="10/1s""#) && html.contains(">Clear<"),
        "{html}"
    );

    for (fields, field) in [
        ("group=mail&concurrency=0&rate=", "concurrency"),
        ("group=mail&concurrency=x&rate=", "concurrency"),
        ("group=mail&concurrency=&rate=10%2Fx", "rate"),
        ("group=mail&concurrency=&rate=", "limit"),
        ("group=&concurrency=1&rate=", "group"),
    ] {
        let bad = post(&app, &s, "/groups/limit", fields).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{fields}");
        assert!(
            bad.text().contains(&format!("invalid {field}")),
            "{fields}: {}",
            bad.text()
        );
    }
    let limits = f
        .store
        .group_limits(dockhand::Clock::now(&f.clock))
        .await
        .unwrap();
    assert_eq!(limits[0].limit.concurrency, Some(2), "unchanged");

    let cleared = post(&app, &s, "/groups/unlimit", "group=mail").await;
    assert_eq!(cleared.status, StatusCode::SEE_OTHER);
    assert!(f
        .store
        .group_limits(dockhand::Clock::now(&f.clock))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn read_only_callers_see_limits_but_cannot_change_them() {
    let f = Fixture::new().await;
    let limit = dockhand::GroupLimit {
        concurrency: Some(3),
        rate: None,
    };
    f.store
        .set_group_limit("mail", &limit, "cli", dockhand::Clock::now(&f.clock))
        .await
        .unwrap();
    let ro = f.app(f.config(Access::ReadOnly));
    let html = get(&ro, "/groups", &[]).await.text();
    assert!(html.contains("0 / 3"), "{html}");
    assert!(
        !html.contains(">Set limit<") && !html.contains(">Clear<"),
        "{html}"
    );
    let op = f.app(f.config(Access::Operator));
    let s = Session::open(&op, "/groups", &[]).await;
    let refused = post(&ro, &s, "/groups/unlimit", "group=mail").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(
        f.store
            .group_limits(dockhand::Clock::now(&f.clock))
            .await
            .unwrap()
            .len(),
        1
    );
}
