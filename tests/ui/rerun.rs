//! Re-running a finished batch's failed children from its page (`POST /batches/{id}/rerun`):
//! offered only where the pipeline is registered and the batch is final, refused read-only,
//! answered with the new job's page; the job page links back to the batch it re-runs.

use crate::support::{get, Fixture, Session};
use axum::http::StatusCode;
use dockhand::ui::{Access, UiConfig};
use dockhand::{Backoff, HandlerError, JobStatus, Packet, Pipeline, Runtime, StepOutput};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `fanout4` emits four packets; child 2 fails for good until `healed`.
fn pipeline(healed: Arc<AtomicBool>) -> Pipeline {
    Pipeline::new("fanout4")
        .step("split", |_ctx| async move {
            Ok(StepOutput::Packets(
                (0..4).map(|i| Packet::new(json!({ "i": i }))).collect(),
            ))
        })
        .step("child", move |ctx| {
            let healed = healed.clone();
            async move {
                if ctx.input()["i"] == json!(2) && !healed.load(Ordering::SeqCst) {
                    return Err(HandlerError::fatal("item 2 is broken"));
                }
                Ok(StepOutput::one(json!({})))
            }
        })
}

async fn runtime(f: &Fixture, healed: Arc<AtomicBool>) -> Runtime {
    Runtime::with_store(Arc::clone(&f.store))
        .clock(Arc::new(f.clock.clone()))
        .migrate(false)
        .backoff(Backoff::fixed_exponential(
            std::time::Duration::from_secs(10),
            2.0,
            std::time::Duration::from_secs(3600),
        ))
        .pipeline(pipeline(healed))
        .build()
        .await
        .expect("runtime")
}

#[tokio::test]
async fn rerun_failed_children_from_the_batch_page() {
    let f = Fixture::new().await;
    let healed = Arc::new(AtomicBool::new(false));
    let rt = runtime(&f, healed.clone()).await;
    let parent = rt.jobs().start("fanout4", json!({})).await.expect("start");
    let other = rt.jobs().start("fanout4", json!({})).await.expect("start");
    rt.run_due_once().await.expect("the split steps");
    assert!(
        rt.jobs()
            .batch_state(parent)
            .await
            .expect("state")
            .is_some(),
        "the split step fanned out"
    );
    let page = format!("/batches/{parent}");
    let with_jobs = |access| UiConfig {
        jobs: Some(rt.jobs()),
        ..f.config(access)
    };
    let app = f.app(with_jobs(Access::Operator));
    let button = format!(r#"action="/batches/{parent}/rerun""#);
    let s = Session::open(&app, &page, &[]).await;
    // Not final yet: no button, and a POST is refused with the reason.
    assert!(!get(&app, &page, &[]).await.text().contains(&button));
    let a = s.post(&app, &format!("{page}/rerun"), &[]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(a.text().contains("once it is final"), "{}", a.text());

    rt.drain(1000).await.expect("drain");
    let html = get(&app, &page, &[]).await.text();
    assert!(html.contains(&button), "{html}");
    // Read-only: no button, and the POST is refused before the store.
    let ro = f.app(with_jobs(Access::ReadOnly));
    assert!(!get(&ro, &page, &[]).await.text().contains(&button));
    let a = s.post(&ro, &format!("{page}/rerun"), &[]).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    // Without the pipeline registered the page says where to re-run instead.
    let bare = f.app(f.config(Access::Operator));
    let html = get(&bare, &page, &[]).await.text();
    assert!(!html.contains(&button));
    assert!(
        html.contains("is not registered in this dashboard"),
        "{html}"
    );

    // The operator re-runs: 303 to the new job's page.
    healed.store(true, Ordering::SeqCst);
    let a = s.post(&app, &format!("{page}/rerun"), &[]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    let to = a.header("location").to_string();
    let rerun: i64 = to
        .strip_prefix("/jobs/")
        .and_then(|r| r.strip_suffix("?msg=rerun-started"))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("location {to}"));
    let html = get(&app, &to, &[]).await.text();
    assert!(html.contains("Re-run started"), "{html}");
    let batch_html = get(&app, &page, &[]).await.text();
    assert!(
        batch_html.contains(&format!(
            r#"<dt>re-run by</dt><dd><a href="/jobs/{rerun}">job {rerun}</a></dd>"#
        )),
        "{batch_html}"
    );
    assert!(
        html.contains(&format!(
            r#"<a href="/batches/{parent}">failed children of batch {parent}</a>"#
        )),
        "{html}"
    );
    rt.drain(1000).await.expect("drain");
    let r = rt.jobs().get(rerun).await.expect("rerun job");
    assert_eq!(r.status, JobStatus::Completed);
    let st = rt
        .jobs()
        .batch_state(rerun)
        .await
        .expect("state")
        .expect("batch");
    assert_eq!((st.children_total, st.children_completed), (1, 1));
    // The old batch still counts its failed child, and is re-run once.
    let st = rt
        .jobs()
        .batch_state(parent)
        .await
        .expect("state")
        .expect("batch");
    assert_eq!(st.children_failed, 1);
    let html = get(&app, &page, &[]).await.text();
    assert!(!html.contains(&button), "{html}");
    assert!(html.contains("Re-run already by"), "{html}");
    let a = s.post(&app, &format!("{page}/rerun"), &[]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(
        a.text().contains("was re-run already by job"),
        "{}",
        a.text()
    );
    // htmx gets the new job's page as an `HX-Redirect` header.
    let a = s
        .post(
            &app,
            &format!("/batches/{other}/rerun"),
            &[("hx-request", "true")],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let to = a.header("hx-redirect");
    assert!(
        to.starts_with("/jobs/") && to.ends_with("?msg=rerun-started"),
        "{to}"
    );
}
