//! Batch regressions from the correctness review (issue 15): every "not yet final" keeps a
//! durable path to final (S-B14), no child after a stop and none from a stale chunk run,
//! no child for an item whose claim was lost, an operator's retry of a fanned-out step
//! resumes the batch, a malformed sidecar releases by job id.

use super::batch_regressions::{claim_as_worker, drain_rounds};
use super::batches::{actions, assert_clean, batch_pipeline, children, item, ok_child, runtime};
use crate::harness::{Kind, TestDb};
use dockhand::batch::{
    BatchHead, ChildOutcome, ChildSpec, DiscardCause, WorklistPending, CHUNK_HOOK,
};
use dockhand::claims::ClaimStatus;
use dockhand::jobs::{StepAction, STEP_HOOK};
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::{ActionStatus, Clock, Error, JobStatus, Jobs};
use serde_json::json;
use std::sync::Arc;

/// S-B14 (defect 1): the first chunk cannot be enqueued, the batch is aborted, and the bridge
/// call that would finish the parent fails (as a crash there would leave it). The step's
/// re-delivery — and the finalize action the abort enqueued with its mark — finish the parent
/// `failed / batch_schedule_failed`; nothing needs `recover-stuck`. Before: the re-delivery
/// saw the batch aborted and returned, the parent stayed `processing` with nothing to move it.
pub async fn s_b14_aborted_fan_out_finishes_after_a_bridge_fault(db: TestDb) {
    for mode in [FaultMode::FailBefore, FaultMode::ExecuteThenFail] {
        let faulty = FaultyStore::wrap(db.store.clone());
        let rt = runtime(&db, faulty.clone(), batch_pipeline(4, 2, ok_child)).await;
        let parent = rt.jobs().start("batch", json!({})).await.unwrap();
        faulty.fail_from("schedule_chunk", 1, FaultMode::FailBefore);
        // The abort commits; then either the bridge fails, or the abort's ack is lost.
        match mode {
            FaultMode::FailBefore => faulty.fail_nth("finish_job", 1, mode),
            _ => faulty.fail_nth("abort_batch", 1, mode),
        }
        rt.run_due_once().await.unwrap(); // the split step (and what it made due)
        assert!(faulty.injected() >= 2, "{mode:?}: both faults fired");
        faulty.heal();
        drain_rounds(&rt, &db, 4).await;
        let p = rt.jobs().get(parent).await.unwrap();
        assert_eq!(
            (p.status, p.reason.as_deref()),
            (JobStatus::Failed, Some("batch_schedule_failed")),
            "{mode:?}"
        );
        assert!(children(&rt, parent).await.is_empty());
        for i in 0..4 {
            assert!(
                rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
                "{mode:?}: item {i} released"
            );
        }
        assert_clean(&rt).await;
    }
}

/// Defect 1, cancel route: an operator stops a batch whose chunk action an operator had
/// cancelled (nothing else drives it), and the bridge call finishing the parent fails: the
/// cancel reports the error, and the finalize action its abort enqueued in the same
/// transaction finishes the parent. Before: nothing was pending and it stayed `processing`.
pub async fn regression_cancel_whose_parent_finish_fails_still_finishes(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(4, 2, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split: worklist + chunk 0 pending
    let chunk = actions(&rt, CHUNK_HOOK).await;
    db.cancel_behind_store(chunk[0].id).await;
    faulty.fail_nth("finish_job", 1, FaultMode::FailBefore);
    let jobs = Jobs::without_pipelines(faulty.clone(), Arc::new(db.clock.clone()));
    assert!(
        jobs.cancel(parent).await.is_err(),
        "the bridge fault is reported"
    );
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing
    );
    rt.drain(100).await.unwrap();
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Cancelled, Some("manual"))
    );
    for i in 0..4 {
        assert!(rt.jobs().claim_state(&item(i)).await.unwrap().is_none());
    }
    assert_clean(&rt).await;
}

/// The spec of row `idx` of a `batch_pipeline` parent (children at step 1), handing over the
/// claim of `item(idx)` held by the parent.
pub(super) async fn spec_for(rt: &dockhand::Runtime, parent: i64, idx: i32) -> ChildSpec {
    let claim = rt
        .jobs()
        .claim_state(&item(idx as usize))
        .await
        .unwrap()
        .unwrap();
    ChildSpec {
        parent_id: parent,
        idx,
        pipeline: "batch".into(),
        step_index: 1,
        input_refs: vec![],
        claim_tokens: claim.token.into_iter().collect(),
        claim_ttl: chrono::Duration::minutes(30),
        step: StepAction {
            priority: 10,
            max_attempts: 3,
            group: None,
        },
        run_by: None,
    }
}

/// Defect 5: a chunk run already holding rows when the batch is stopped creates no child from
/// them (`create_child` discards the row and releases its claim), and a stale run (its action
/// lease lost) creates nothing at all (`LeaseLost`). Before: the in-flight chunk kept creating
/// children after the cancel, and they ran.
pub async fn regression_no_child_after_a_stop_or_from_a_stale_chunk_run(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    let run = claim_as_worker(&db, CHUNK_HOOK, chrono::Duration::seconds(30)).await;
    let now = db.clock.now();
    let rows = db
        .store
        .lease_work(parent, 3, run, now + chrono::Duration::minutes(5), now)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    let specs = [
        spec_for(&rt, parent, 0).await,
        spec_for(&rt, parent, 1).await,
    ];
    let done = Jobs::without_pipelines(db.store.clone(), Arc::new(db.clock.clone()))
        .cancel(parent)
        .await
        .unwrap();
    assert_eq!(
        done.reason.as_deref(),
        Some("cancel_requested"),
        "rows in flight"
    );
    let made = db.store.create_child(&specs[0], run, now).await.unwrap();
    assert_eq!(made, ChildOutcome::Discarded(DiscardCause::BatchStopped));
    assert!(
        rt.jobs().claim_state(&item(0)).await.unwrap().is_none(),
        "the discarded row's claim is released"
    );
    // The run's lease runs out and the reaper takes the action back: the stale run is refused.
    db.clock.advance(chrono::Duration::seconds(31));
    rt.run_maintenance_once().await.unwrap();
    match db.store.create_child(&specs[1], run, db.clock.now()).await {
        Err(Error::LeaseLost { action_id, .. }) => assert_eq!(action_id, run.id),
        other => panic!("a stale chunk run must be fenced out, got {other:?}"),
    }
    assert!(
        children(&rt, parent).await.is_empty(),
        "no child after the stop"
    );
    // The re-delivered chunk settles the rows it held; the parent ends cancelled.
    drain_rounds(&rt, &db, 3).await;
    assert!(children(&rt, parent).await.is_empty());
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(p.status, JobStatus::Cancelled);
    for i in 0..6 {
        assert!(rt.jobs().claim_state(&item(i)).await.unwrap().is_none());
    }
    assert_clean(&rt).await;
}

/// Defect 6: a batch reaches an item after its claim's TTL, and another owner took the claim
/// over meanwhile: no child processes that item (its row is discarded, the new owner keeps the
/// claim); the other children get their claims with a renewed expiry. Before: a child was
/// created for the item anyway and processed it a second time.
pub async fn regression_no_child_for_a_claim_taken_over(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split: the parent holds items 0..3 for 30 minutes
    db.clock.advance(chrono::Duration::minutes(31));
    let other = rt
        .jobs()
        .claim(
            item(1),
            None,
            chrono::Duration::hours(1),
            Default::default(),
            false,
        )
        .await
        .unwrap()
        .expect("an expired claim is taken over");
    rt.run_due_once().await.unwrap(); // chunk
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 2, "no child for the item taken over");
    let now = db.clock.now();
    for i in [0, 2] {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert!(
            kids.iter().any(|k| Some(k.id) == c.job_id),
            "item {i} moved"
        );
        assert_eq!(
            c.expires_at,
            Some(now + chrono::Duration::minutes(30)),
            "item {i}'s claim renewed on its way to the child"
        );
    }
    rt.drain(1000).await.unwrap();
    let c1 = rt.jobs().claim_state(&item(1)).await.unwrap().unwrap();
    assert_eq!(
        (c1.status, c1.token.as_deref(), c1.job_id),
        (ClaimStatus::Claimed, Some(other.token.as_str()), None),
        "the new owner keeps the item"
    );
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(p.status, JobStatus::Completed);
    assert_eq!((st.children_total, st.children_completed), (2, 2));
    assert_clean(&rt).await;
}

/// Defect 9: the fanned-out split step's action ends without a finish (its worker lost the
/// write), an operator cancels it and retries it by hand (store/dashboard/CLI `retry`,
/// attempt back to 1). The retried step must resume the batch, not run the split again.
/// Before: the re-run could not claim the children's items, failed, and the parent failed
/// `step_failed` while its children kept running.
pub async fn regression_operator_retry_of_a_fanned_out_step_resumes_the_batch(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    faulty.fail_nth("finish", 1, FaultMode::FailBefore);
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(faulty.injected(), 1, "the split step's finish was lost");
    rt.run_due_once().await.unwrap(); // chunk 0: children 0..3
    assert_eq!(children(&rt, parent).await.len(), 3);
    let step = actions(&rt, STEP_HOOK)
        .await
        .into_iter()
        .find(|a| a.args["job"] == json!(parent))
        .unwrap();
    assert_eq!(step.status, ActionStatus::Running);
    db.cancel_behind_store(step.id).await;
    assert!(rt.queue().retry(step.id).await.unwrap(), "operator retry");
    drain_rounds(&rt, &db, 4).await;
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Completed, None),
        "the retried step resumed the batch"
    );
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 6);
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    assert_clean(&rt).await;
}

/// Defect 9's twin: the split step's fan-out committed, but its action ended `failed` for good
/// (its worker died on the last attempt; the reaper failed it and left the job's finish
/// action). The batch drives the job from its committed worklist, so the finish action
/// resumes the batch instead of failing the parent under its running children.
pub async fn regression_a_fanned_out_step_failing_for_good_does_not_fail_the_batch(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(
        &db,
        faulty.clone(),
        batch_pipeline(6, 3, ok_child).max_attempts(1),
    )
    .await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    faulty.fail_nth("finish", 1, FaultMode::FailBefore);
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(faulty.injected(), 1, "the split step's finish was lost");
    rt.run_due_once().await.unwrap(); // chunk 0: children 0..3
                                      // The split's lease runs out on its last attempt: the reaper fails it.
    db.clock.advance(chrono::Duration::minutes(10));
    drain_rounds(&rt, &db, 5).await;
    let step = actions(&rt, STEP_HOOK)
        .await
        .into_iter()
        .find(|a| a.args["job"] == json!(parent))
        .unwrap();
    assert_eq!(step.status, ActionStatus::Failed, "the split action failed");
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Completed, None),
        "the batch finished the parent"
    );
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 6);
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    assert_clean(&rt).await;
}

/// Defect 10: a worklist row whose sidecar is malformed is discarded, and its claim released
/// by job id (the parent's claims no other live row names) — with `retain_processed = true`,
/// so a claim completed by the parent's success would show as processed. Before: the sidecar
/// read as an empty list, nothing was released, and the parent's success completed the claim
/// of an item no child processed.
pub async fn regression_malformed_sidecar_releases_by_job(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
                                      // PostgreSQL's jsonb column takes only JSON: there, JSON of the wrong shape.
    let bad = match db.kind {
        Kind::Postgres => r#"{"bad": 1}"#,
        _ => "not json",
    };
    db.exec_sql(&format!(
        "UPDATE dockhand_worklist SET sidecar = '{bad}' WHERE parent_id = {parent} AND idx = 1"
    ))
    .await;
    rt.drain(1000).await.unwrap();
    assert_eq!(children(&rt, parent).await.len(), 2);
    assert!(
        rt.jobs().claim_state(&item(1)).await.unwrap().is_none(),
        "the malformed row's claim is released, not completed"
    );
    for i in [0, 2] {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.status, ClaimStatus::Processed, "item {i}");
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

/// `Store::worklist_pending` (what a chunk run reads to decide what follows it) follows the
/// rows: nothing before the fan-out (`None`: not yet a batch parent), ready rows after it,
/// ready and leased while a chunk run holds some, only leased once it holds all (a run's
/// lease takes its own rows again, so the second call asks for all six); a missing job is
/// `None`. (A batch run to the end has neither: `in_chunk.rs`' first scenario.)
pub async fn worklist_pending_follows_the_rows(db: TestDb) {
    let pending = |ready, leased| Some(WorklistPending { ready, leased });
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(db.store.worklist_pending(parent).await.unwrap(), None);
    rt.run_due_once().await.unwrap(); // split
    let st = &db.store;
    assert_eq!(
        st.worklist_pending(parent).await.unwrap(),
        pending(true, false)
    );
    let run = claim_as_worker(&db, CHUNK_HOOK, chrono::Duration::seconds(30)).await;
    let now = db.clock.now();
    let until = now + chrono::Duration::minutes(5);
    assert_eq!(
        st.lease_work(parent, 3, run, until, now)
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        st.worklist_pending(parent).await.unwrap(),
        pending(true, true)
    );
    assert_eq!(
        st.lease_work(parent, 6, run, until, now)
            .await
            .unwrap()
            .len(),
        6
    );
    assert_eq!(
        st.worklist_pending(parent).await.unwrap(),
        pending(false, true)
    );

    assert_eq!(st.worklist_pending(i64::MAX).await.unwrap(), None);
}

/// `Store::batch_head` (what a chunk run starts from) reads the parent row's batch fields as
/// `batch_state` has them: `None` before the fan-out and for a missing job, the chunk size and
/// child step after it, the stop's outcome once an operator stopped the batch.
pub async fn batch_head_follows_the_parents_batch_fields(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    let st = &db.store;
    assert_eq!(st.batch_head(parent).await.unwrap(), None);
    rt.run_due_once().await.unwrap(); // split
    let same_as_state = |head: BatchHead, state: dockhand::batch::BatchState| {
        assert_eq!(
            (head.outcome, head.chunk_size, head.child_step),
            (state.outcome, state.chunk_size, state.child_step)
        );
    };
    let head = st.batch_head(parent).await.unwrap().unwrap();
    assert_eq!((head.outcome.as_deref(), head.chunk_size), (None, 3));
    same_as_state(head, st.batch_state(parent).await.unwrap().unwrap());
    rt.jobs().cancel(parent).await.unwrap();
    let head = st.batch_head(parent).await.unwrap().unwrap();
    assert!(head.outcome.is_some(), "a stopped batch has its outcome");
    same_as_state(head, st.batch_state(parent).await.unwrap().unwrap());
    assert_eq!(st.batch_head(i64::MAX).await.unwrap(), None);
}
