//! Focused tests of the SQLite recovery reads: job liveness and the invariant audit.

use super::batch_tests::{claim_for, fresh, new_job, parent_with, spec, sql, t0};
use crate::batch::RowSettle;
use crate::store::test_lease::running_lease;
use crate::store::{ClaimRequest, Store};
use chrono::Duration;

#[tokio::test]
async fn job_liveness_reports_what_drives_each_job() {
    let (store, _dir) = fresh().await;
    let driven = new_job(&store).await;
    let failed = new_job(&store).await;
    sql(
        &store,
        &format!("UPDATE dockhand_actions SET status = 'failed' WHERE unique_key = 'j:{failed}:0'"),
    )
    .await;
    let (parent, _) = parent_with(&store, 1).await;
    store
        .lease_work(
            parent,
            10,
            running_lease(&store, "o", t0()).await,
            t0() + Duration::minutes(5),
            t0(),
        )
        .await
        .unwrap();
    store
        .create_child(
            &spec(parent, 0, &[]),
            running_lease(&store, "o", t0()).await,
            t0(),
        )
        .await
        .unwrap();
    store.fence_batch(parent, t0()).await.unwrap();
    sql(
        &store,
        &format!(
            "UPDATE dockhand_actions SET status = 'complete' WHERE unique_key = 'j:{parent}:0'"
        ),
    )
    .await;

    let all = store
        .job_liveness(t0() + Duration::seconds(1), 100)
        .await
        .unwrap();
    let get = |id: i64| all.iter().find(|l| l.job_id == id).unwrap();
    assert!(get(driven).has_action && !get(driven).step_failed && !get(driven).stranded());
    assert!(!get(failed).has_action && get(failed).step_failed && get(failed).stranded());
    let p = get(parent);
    assert!(p.is_batch_parent && p.fenced && !p.has_action);
    assert_eq!((p.active_children, p.stranded()), (1, false));
    assert_eq!(all.len(), 4, "the child is listed too: {all:?}");
    assert!(store.job_liveness(t0(), 100).await.unwrap().is_empty());
    assert_eq!(
        store
            .job_liveness(t0() + Duration::seconds(1), 2)
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn audit_finds_each_planted_violation() {
    let (store, _dir) = fresh().await;
    let now = t0() + Duration::minutes(10);
    let grace = Duration::minutes(1);
    let healthy = new_job(&store).await;
    claim_for(&store, healthy, "fine").await;
    assert_eq!(store.audit(now, grace).await.unwrap(), vec![]);

    // (1) a final job still holding a claim.
    let done = new_job(&store).await;
    claim_for(&store, done, &"x".repeat(100)).await;
    sql(
        &store,
        &format!("UPDATE dockhand_jobs SET status = 'failed' WHERE id = {done}"),
    )
    .await;
    // (2) a processing job with nothing driving it.
    let stuck = new_job(&store).await;
    store.start_step(stuck, 0, t0()).await.unwrap();
    sql(
        &store,
        &format!(
            "UPDATE dockhand_actions SET status = 'complete' WHERE unique_key = 'j:{stuck}:0'"
        ),
    )
    .await;
    // (3) a fenced parent, every child terminal, not final, no action (also (2)).
    let (parent, _) = parent_with(&store, 1).await;
    // Processing as its split step left it (a fanned-out job's step never starts again).
    sql(
        &store,
        &format!("UPDATE dockhand_jobs SET status = 'processing' WHERE id = {parent}"),
    )
    .await;
    store
        .settle_work(
            parent,
            0,
            running_lease(&store, "w", t0()).await,
            &RowSettle::Discard { reason: "r".into() },
            t0(),
        )
        .await
        .unwrap();
    sql(
        &store,
        &format!("UPDATE dockhand_jobs SET batch_state = 'fenced' WHERE id = {parent}"),
    )
    .await;
    sql(
        &store,
        &format!(
            "UPDATE dockhand_actions SET status = 'complete' WHERE unique_key = 'j:{parent}:0'"
        ),
    )
    .await;
    // (4) a running action whose lease ran out long ago.
    let req = ClaimRequest {
        owner: "w",
        limit: 1,
        now: t0(),
        lease_until: t0() + grace,
        hooks: None,
        routing: None,
    };
    let running = store.claim(&req).await.unwrap()[0].id;
    // (5) a parent whose counters disagree with its children.
    let (counted, _) = parent_with(&store, 1).await;
    sql(
        &store,
        &format!("UPDATE dockhand_jobs SET children_total = 2 WHERE id = {counted}"),
    )
    .await;

    let found = store.audit(now, grace).await.unwrap();
    let subjects: Vec<(&str, &str)> = found
        .iter()
        .map(|v| (v.invariant, v.subject.as_str()))
        .collect();
    let claim = format!("claim step-a/rss/{}", "x".repeat(60));
    let expect = [
        ("claim_held_by_final_job", claim.as_str()),
        ("processing_job_without_path", &format!("job {stuck}")),
        ("processing_job_without_path", &format!("job {parent}")),
        ("fenced_parent_not_final", &format!("job {parent}")),
        ("running_without_live_lease", &format!("action {running}")),
        ("parent_counters_mismatch", &format!("job {counted}")),
    ];
    assert_eq!(subjects, expect.to_vec(), "{found:#?}");
    assert!(found[5].detail.contains("2/0/0/0/0") && found[5].detail.contains("0/0/0/0/0"));
    // Within the grace the lease is not reported.
    let early = store.audit(t0() + grace, grace).await.unwrap();
    assert!(early
        .iter()
        .all(|v| v.invariant != "running_without_live_lease"));
}
