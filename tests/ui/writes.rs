//! Operator POSTs really change the database, answer 303 to a form and a fragment to htmx, and
//! write an audit event.

use crate::support::{audit_capture, basic_auth, Fixture, Session};
use axum::http::StatusCode;
use dockhand::ui::{Access, UiConfig};

#[tokio::test]
async fn cancel_and_retry_change_the_action_and_redirect_to_it() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let id = f.seeded.pending;
    let page = format!("/actions/{id}");
    let s = Session::open(&app, &page, &[]).await;
    assert!(s.token.len() == 43);

    let a = s.post(&app, &format!("{page}/cancel"), &[]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(a.header("location"), format!("/actions/{id}?msg=canceled"));
    assert_eq!(f.status(id).await, "canceled");
    let after = crate::support::get(&app, a.header("location"), &[])
        .await
        .text();
    assert!(after.contains("Canceled. A running handler"), "{after}");
    assert!(after.contains(&format!(r#"action="/actions/{id}/retry""#)));

    let a = s.post(&app, &format!("{page}/retry"), &[]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.header("location"), format!("/actions/{id}?msg=retried"));
    assert_eq!(f.status(id).await, "pending");

    // Retrying a pending action changes nothing and says so.
    let a = s.post(&app, &format!("{page}/retry"), &[]).await;
    assert_eq!(
        a.header("location"),
        format!("/actions/{id}?msg=not-retried")
    );
    assert_eq!(f.status(id).await, "pending");

    // The seeded failure goes back to pending too.
    let a = s
        .post(&app, &format!("/actions/{}/retry", f.seeded.failed), &[])
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(f.status(f.seeded.failed).await, "pending");

    // Unknown actions are 404, not a silent no-op.
    let a = s.post(&app, "/actions/999999/cancel", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn htmx_posts_get_the_new_content_of_main() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let id = f.seeded.pending;
    let s = Session::open(&app, &format!("/actions/{id}"), &[]).await;
    let a = s
        .post(
            &app,
            &format!("/actions/{id}/cancel"),
            &[("hx-request", "true")],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let html = a.text();
    assert!(!html.contains("<html"));
    assert!(html.starts_with("<h1>"), "{html}");
    assert!(html.contains("badge s-canceled"), "{html}");
    assert!(html.contains("Canceled. A running handler"));
    assert_eq!(f.status(id).await, "canceled");
}

#[tokio::test]
async fn run_now_enqueues_one_occurrence_of_the_schedule() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let s = Session::open(&app, "/schedules", &[]).await;
    let a = s
        .post(&app, &format!("/schedules/{}/run", f.seeded.every), &[])
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    let location = a.header("location").to_string();
    let id: i64 = location
        .strip_prefix("/schedules?id=")
        .and_then(|r| r.strip_suffix("&msg=run"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{location}"));
    let action = f
        .store
        .get(id)
        .await
        .expect("get")
        .expect("the run-now action exists");
    assert_eq!(action.hook, "report.build");
    assert_eq!(action.schedule_id, Some(f.seeded.every));
    assert_eq!(action.scheduled_at, crate::support::t0());
    assert_eq!(action.status.as_str(), "pending");
    let page = crate::support::get(&app, &location, &[]).await.text();
    assert!(page.contains("Enqueued one occurrence"), "{page}");
    assert!(
        page.contains(&format!(r#"<a href="/actions/{id}">Action #{id}</a>"#)),
        "{page}"
    );
    // The same instant again is the same occurrence: nothing new.
    let a = s
        .post(&app, &format!("/schedules/{}/run", f.seeded.every), &[])
        .await;
    assert_eq!(
        a.header("location"),
        format!("/schedules?id={id}&msg=run-duplicate")
    );
    // The series itself did not move.
    let every = f
        .store
        .schedules()
        .await
        .expect("schedules")
        .into_iter()
        .find(|x| x.id == f.seeded.every);
    assert_eq!(
        every.and_then(|s| s.next_run_at),
        Some(crate::support::t0() + chrono::Duration::minutes(5))
    );
    assert_eq!(
        s.post(&app, "/schedules/999999/run", &[]).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn enable_and_disable_flip_the_schedule() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    let s = Session::open(&app, "/schedules", &[]).await;
    let enabled = |id: i64| {
        let store = f.store.clone();
        async move {
            store
                .schedules()
                .await
                .expect("schedules")
                .into_iter()
                .find(|x| x.id == id)
                .map(|x| x.enabled)
        }
    };
    let a = s
        .post(&app, &format!("/schedules/{}/enable", f.seeded.cron), &[])
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.header("location"), "/schedules?msg=enabled");
    assert_eq!(enabled(f.seeded.cron).await, Some(true));
    let a = s
        .post(
            &app,
            &format!("/schedules/{}/disable", f.seeded.every),
            &[("hx-request", "true")],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.text().contains("Schedule disabled."));
    assert_eq!(enabled(f.seeded.every).await, Some(false));
    assert_eq!(
        s.post(&app, "/schedules/999999/enable", &[]).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "current_thread")]
async fn every_operator_post_writes_an_audit_event() {
    let f = Fixture::new().await;
    // A user no other test uses: the capture is process-wide (see `audit_capture`).
    let user = "audit-probe-7f3a";
    let (creds, auth) = basic_auth(user);
    let app = f.app(UiConfig {
        basic_auth: Some(creds),
        ..f.config(Access::Operator)
    });
    let hdr = [("authorization", auth.as_str())];
    let s = Session::open(&app, "/schedules", &hdr).await;
    let out = audit_capture();
    s.post(&app, &format!("/actions/{}/cancel", f.seeded.pending), &hdr)
        .await;
    s.post(
        &app,
        &format!("/schedules/{}/disable", f.seeded.every),
        &hdr,
    )
    .await;
    s.post(&app, &format!("/actions/{}/retry", f.seeded.pending), &hdr)
        .await;
    let lines = out.lines_of(user);
    let text = lines.join("\n");
    let mine = format!("user={user}");
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("dockhand::ui::audit") && lines[0].contains("op=\"cancel\""),
        "{text}"
    );
    assert!(
        lines[0].contains(&mine) && lines[0].contains("access=\"operator\""),
        "{text}"
    );
    assert!(
        lines[0].contains(&format!("ids=\"{}\"", f.seeded.pending))
            && lines[0].contains("changed=1"),
        "{text}"
    );
    assert!(lines[1].contains("op=\"schedule_disable\""), "{text}");
    assert!(lines[2].contains("op=\"retry\""), "{text}");
}
