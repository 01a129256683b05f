//! Batch scenarios (S-B1 … S-B11): chunked fan-out, failure routes, finalize and recovery.

use super::claims::tracked;
use crate::harness::TestDb;
use dockhand::batch::recovery::RecoverOptions;
use dockhand::claims::ClaimStatus;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::{
    ActionFilter, ActionQuery, ActionStatus, Clock, DynStore, HandlerError, Identity, JobStatus,
    Packet, Pipeline, Runtime, StepOutput,
};
use serde_json::json;

pub(super) fn item(i: usize) -> Identity {
    Identity::new("shared:b", "src", format!("item-{i}")).unwrap()
}

/// `split` claims n items and emits one packet per item (each carrying its claim); `child`
/// runs `child(i)` for each.
/// What a test child step does with its item number.
type ChildFn = fn(i64) -> Result<StepOutput, HandlerError>;

pub(super) fn batch_pipeline(n: usize, chunk: u32, child: ChildFn) -> Pipeline {
    Pipeline::new("batch")
        .step("split", move |ctx| split_items(ctx, n))
        .step("child", move |ctx| async move {
            child(ctx.input()["i"].as_i64().unwrap_or(-1))
        })
        .chunk_size(chunk)
}

/// The `split` step of [`batch_pipeline`]: claims `n` items, one packet per item.
pub(super) async fn split_items(
    ctx: dockhand::StepContext,
    n: usize,
) -> dockhand::jobs::pipeline::StepResult {
    let mut out = Vec::new();
    for i in 0..n {
        let d = ctx
            .claim_in(
                "shared:b",
                "src",
                &format!("item-{i}"),
                tracked("b", 1, true),
            )
            .await
            .map_err(HandlerError::retry)?
            .ok_or_else(|| HandlerError::fatal("item held"))?;
        out.push(Packet::new(json!({"i": i})).with_claim(d));
    }
    Ok(StepOutput::Packets(out))
}

pub(super) fn ok_child(_: i64) -> Result<StepOutput, HandlerError> {
    Ok(StepOutput::one(json!({})))
}

pub(super) async fn runtime(db: &TestDb, store: DynStore, p: Pipeline) -> Runtime {
    db.runtime_on(store).pipeline(p).build().await.unwrap()
}

pub(super) async fn actions(rt: &Runtime, hook: &str) -> Vec<dockhand::action::Action> {
    rt.queue()
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: Some(hook.into()),
                ..Default::default()
            },
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

pub(super) async fn children(rt: &Runtime, parent: i64) -> Vec<dockhand::jobs::Job> {
    let all = rt
        .jobs()
        .list(&dockhand::jobs::JobFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    all.into_iter()
        .filter(|j| j.parent_id == Some(parent))
        .collect()
}

pub(super) async fn assert_clean(rt: &Runtime) {
    let v = rt.jobs().check().await.unwrap();
    assert!(v.is_empty(), "dockhand check found: {v:?}");
}

pub async fn s_b1_twenty_five_packets_in_chunks_of_ten(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(25, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 25);
    assert_eq!(
        actions(&rt, "dockhand.batch.chunk").await.len(),
        3,
        "25 items, chunk 10: 3 chunk actions"
    );
    for k in &kids {
        assert_eq!(k.status, JobStatus::Completed);
    }
    for i in 0..25 {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.status, ClaimStatus::Processed);
        let owner = c.job_id.unwrap();
        assert!(
            kids.iter().any(|k| k.id == owner),
            "item {i} was owned by a child, not the parent"
        );
    }
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        p.status,
        JobStatus::Completed,
        "the parent completes after the last child"
    );
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert!(st.fenced);
    assert_eq!(
        (
            st.children_total,
            st.children_terminal,
            st.children_completed
        ),
        (25, 25, 25)
    );
    assert_clean(&rt).await;
}

pub async fn s_b2_chunk_delivered_twice_makes_no_duplicates(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    // A second delivery of the first chunk (forged without the unique key), run concurrently.
    rt.queue()
        .enqueue(dockhand::ActionSpec::new(
            "dockhand.batch.chunk",
            json!({"parent": parent, "offset": 0}),
        ))
        .await
        .unwrap();
    rt.drain(1000).await.unwrap();
    assert_eq!(
        children(&rt, parent).await.len(),
        6,
        "no duplicate children"
    );
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

pub async fn s_b3_first_chunk_enqueue_fails(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(5, 2, ok_child)).await;
    faulty.fail_nth("schedule_chunk", 1, FaultMode::FailBefore);
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Failed, Some("batch_schedule_failed"))
    );
    assert!(children(&rt, parent).await.is_empty(), "no children");
    for i in 0..5 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} released"
        );
    }
    assert_clean(&rt).await;
}

pub async fn s_b4_later_chunk_enqueue_fails(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(4, 1, ok_child)).await;
    faulty.fail_nth("schedule_chunk", 2, FaultMode::FailBefore);
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split: worklist + chunk 0
    rt.run_due_once().await.unwrap(); // chunk 0: child 0; scheduling chunk 1 fails
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 1);
    let c0 = rt.jobs().claim_state(&item(0)).await.unwrap().unwrap();
    assert_eq!(
        (c0.status, c0.job_id),
        (ClaimStatus::Claimed, Some(kids[0].id)),
        "child 0 keeps its claim"
    );
    for i in 1..4 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} released"
        );
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing,
        "waits for child 0"
    );
    rt.drain(1000).await.unwrap();
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Failed, Some("batch_schedule_failed"))
    );
    assert_eq!(
        rt.jobs().get(kids[0].id).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

pub async fn s_b5_missing_and_corrupt_packets_are_discarded(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(5, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    let h1 = dockhand::jobs::packets::encode(&json!({"i": 1}))
        .unwrap()
        .hash;
    let h3 = dockhand::jobs::packets::encode(&json!({"i": 3}))
        .unwrap()
        .hash;
    db.exec_sql(&format!("DELETE FROM dockhand_packets WHERE hash = '{h1}'"))
        .await;
    db.exec_sql(&format!(
        "UPDATE dockhand_packets SET body = '{{\"i\":999}}' WHERE hash = '{h3}'"
    ))
    .await;
    rt.drain(1000).await.unwrap();
    assert_eq!(
        children(&rt, parent).await.len(),
        3,
        "the others became children"
    );
    for i in [1, 3] {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} released via the sidecar"
        );
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

pub async fn s_b6_child_creation_fails_permanently(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(3, 10, ok_child)).await;
    // The chunk's set-based creation fails, and so does each row's on its own.
    faulty.fail_from("create_children", 1, FaultMode::FailBefore);
    faulty.fail_from("create_child", 1, FaultMode::FailBefore);
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    assert_eq!(
        faulty.calls("create_child"),
        9,
        "3 rows x 3 bounded attempts, never forever"
    );
    for i in 0..3 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} released"
        );
    }
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        p.status,
        JobStatus::CompletedNoItems,
        "the parent still finishes"
    );
    faulty.heal();
    assert_clean(&rt).await;
}

pub async fn s_b7_cancel_a_batch_with_unscheduled_items(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 2, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    rt.run_due_once().await.unwrap(); // chunk 0: children 0 and 1 (not yet run)
    let r = rt.jobs().cancel(parent).await.unwrap();
    // Children not yet started are cancelled with it (B5): nothing is active, so the parent
    // is final at once.
    assert_eq!(
        (r.status, r.reason.as_deref(), r.changed),
        (JobStatus::Cancelled, Some("manual"), true)
    );
    for k in children(&rt, parent).await {
        assert_eq!(k.status, JobStatus::Cancelled, "child {} not started", k.id);
    }
    for i in 0..2 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "cancelled child's item {i} released"
        );
    }
    for i in 2..6 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "unscheduled item {i} released"
        );
    }
    rt.drain(1000).await.unwrap();
    assert_eq!(
        children(&rt, parent).await.len(),
        2,
        "no more children after cancel"
    );
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(p.status, JobStatus::Cancelled);
    assert_clean(&rt).await;
}

fn failing_child(_: i64) -> Result<StepOutput, HandlerError> {
    Err(HandlerError::fatal("child broke"))
}
fn mixed_child(i: i64) -> Result<StepOutput, HandlerError> {
    if i == 0 {
        Ok(StepOutput::one(json!({})))
    } else {
        Err(HandlerError::fatal("child broke"))
    }
}
fn skipping_child(i: i64) -> Result<StepOutput, HandlerError> {
    if i == 0 {
        Ok(StepOutput::Skip)
    } else {
        Ok(StepOutput::none())
    }
}

pub async fn s_b8_aggregate_status(db: TestDb) {
    let cases: [(ChildFn, JobStatus, Option<&str>); 3] = [
        (
            failing_child,
            JobStatus::Failed,
            Some("all_children_failed"),
        ),
        (mixed_child, JobStatus::Completed, None),
        (skipping_child, JobStatus::CompletedNoItems, None),
    ];
    for (i, (child, status, why)) in cases.into_iter().enumerate() {
        let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, child)).await;
        let parent = rt.jobs().start("batch", json!({})).await.unwrap();
        rt.drain(1000).await.unwrap();
        let p = rt.jobs().get(parent).await.unwrap();
        assert_eq!((p.status, p.reason.as_deref()), (status, why), "case {i}");
        // Free the items for the next case.
        for k in 0..3 {
            if let Some(d) = rt
                .jobs()
                .claim(
                    item(k),
                    None,
                    chrono::Duration::minutes(1),
                    Default::default(),
                    true,
                )
                .await
                .unwrap()
            {
                rt.jobs().release(&d, false).await.unwrap();
            }
        }
    }
}

pub async fn s_b9_parent_finish_fails_then_completes_once(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(3, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    // The children finish from their steps (`finish_jobs`); the parent's finish (from the
    // finalize action) is the first `finish_job` call.
    faulty.fail_nth("finish_job", 1, FaultMode::FailBefore);
    rt.drain(1000).await.unwrap();
    for k in children(&rt, parent).await {
        assert_eq!(k.status, JobStatus::Completed, "children stay complete");
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing
    );
    let wake = actions(&rt, "dockhand.batch.finalize").await;
    assert!(
        wake.iter().any(|a| a.status == ActionStatus::Pending),
        "a finalize action is pending"
    );
    db.clock.advance(chrono::Duration::seconds(60));
    rt.drain(1000).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    let again = rt
        .jobs()
        .finish(parent, JobStatus::Completed, None)
        .await
        .unwrap();
    assert!(!again.changed, "completed exactly once");
    assert_clean(&rt).await;
}

pub async fn s_b10_missing_fence_is_rearmed(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(2, 10, ok_child)).await;
    faulty.fail_nth("fence_batch", 1, FaultMode::FailBefore);
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert!(
        !st.fenced && st.active_children() == 0,
        "fence missing, no child active"
    );
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing
    );
    let pending: Vec<_> = actions(&rt, "dockhand.batch.chunk")
        .await
        .into_iter()
        .filter(|a| a.status == ActionStatus::Pending)
        .collect();
    assert_eq!(pending.len(), 1, "a chunk action for the parent is pending");
    db.clock.advance(chrono::Duration::seconds(60));
    rt.drain(1000).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

pub async fn s_b11_recover_stuck_completes_a_stranded_parent(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    // Run everything except the finalize action, then lose it: a stranded parent.
    for _ in 0..20 {
        rt.run_due_once().await.unwrap();
        let fin = actions(&rt, "dockhand.batch.finalize").await;
        if let Some(a) = fin.iter().find(|a| a.status == ActionStatus::Pending) {
            db.cancel_behind_store(a.id).await;
            break;
        }
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing
    );
    assert!(
        !rt.jobs().check().await.unwrap().is_empty(),
        "check sees the stranded parent"
    );
    // Another parent still in flight (its child has not run) is left alone.
    let busy = rt.jobs().start("batch", json!({})).await;
    let opts = |dry_run| RecoverOptions {
        dry_run,
        limit: 100,
        older_than: chrono::Duration::zero(),
    };
    db.clock.advance(chrono::Duration::seconds(1));
    let dry = rt.jobs().recover_stuck(&opts(true)).await.unwrap();
    assert_eq!(dry.would_complete_batch_parent, 1);
    assert_eq!(dry.batch_parents_completed, 0);
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing,
        "dry run changes nothing"
    );
    let real = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!(real.batch_parents_completed, 1);
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    if let Ok(b) = busy {
        assert_ne!(
            rt.jobs().get(b).await.unwrap().status,
            JobStatus::Failed,
            "a job with a pending action is left alone"
        );
    }
    assert!(real.left_alone >= 1);
    let _ = db.clock.now();
}

/// A transient error (busy, deadlock, dropped connection) on a chunk enqueue is retried in
/// place; only a persistent failure is B3's `batch_schedule_failed`.
pub async fn transient_chunk_enqueue_error_is_retried(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(4, 2, ok_child)).await;
    faulty.fail_nth("schedule_chunk", 1, FaultMode::Retryable);
    faulty.fail_nth("schedule_chunk", 3, FaultMode::Retryable);
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    assert_eq!(faulty.injected(), 2, "both faults fired");
    assert_eq!(children(&rt, parent).await.len(), 4);
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}
