//! Operator stops of a batch (B5, S-B13): one batch-aware cancel and manual fail behind the
//! library (`Jobs::cancel`, `Jobs::manual_fail`, `Jobs::finish`), the CLI and the dashboard
//! (both use `Jobs::without_pipelines`, the store alone). Unscheduled items are discarded and
//! released, children not yet started are cancelled through the bridge, running children stop
//! at their next step boundary, and no child that had not started completes afterwards.

use super::batches::{assert_clean, batch_pipeline, children, item, ok_child, runtime};
use super::claims::tracked;
use crate::harness::TestDb;
use dockhand::claims::ClaimStatus;
use dockhand::{HandlerError, JobStatus, Jobs, Packet, Pipeline, Runtime, StepOutput};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, Semaphore};

/// The handle the CLI (`cancel-job`, `manual-fail`) and a dashboard without a configured job
/// handle use: no pipeline registered, the store alone.
fn operator(db: &TestDb) -> Jobs {
    Jobs::without_pipelines(db.store.clone(), Arc::new(db.clock.clone()))
}

/// Children of `parent` by status: (completed, cancelled, other).
async fn tally(rt: &Runtime, parent: i64) -> (usize, usize, usize) {
    let kids = children(rt, parent).await;
    let count = |s: JobStatus| kids.iter().filter(|k| k.status == s).count();
    let (done, cancelled) = (count(JobStatus::Completed), count(JobStatus::Cancelled));
    (done, cancelled, kids.len() - done - cancelled)
}

/// S-B13: a parent with 10 children created and none started, cancelled from the library,
/// the CLI's handle and `Jobs::finish` in turn: all 10 end `cancelled` with their claims
/// released, the parent `cancelled` at once; draining the queue afterwards completes none.
pub async fn s_b13_cancel_unstarted_children_from_every_surface(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(10, 10, ok_child)).await;
    let library = rt.jobs();
    let cli = operator(&db);
    for surface in ["library", "cli", "finish"] {
        let parent = rt.jobs().start("batch", json!({})).await.unwrap();
        rt.run_due_once().await.unwrap(); // split
        rt.run_due_once().await.unwrap(); // chunk: 10 children, none started
        assert_eq!(tally(&rt, parent).await, (0, 0, 10), "{surface}");
        let done = match surface {
            "library" => library.cancel(parent).await.unwrap(),
            "cli" => cli.cancel(parent).await.unwrap(),
            _ => library
                .finish(parent, JobStatus::Cancelled, None)
                .await
                .unwrap(),
        };
        assert_eq!(
            (done.status, done.reason.as_deref(), done.changed),
            (JobStatus::Cancelled, Some("manual"), true),
            "{surface}: nothing active, the parent is final at once"
        );
        assert_eq!(tally(&rt, parent).await, (0, 10, 0), "{surface}");
        for i in 0..10 {
            assert!(
                rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
                "{surface}: item {i} released"
            );
        }
        rt.drain(1000).await.unwrap();
        assert_eq!(
            tally(&rt, parent).await,
            (0, 10, 0),
            "{surface}: no child completes after the cancel"
        );
        let p = rt.jobs().get(parent).await.unwrap();
        assert_eq!(
            (p.status, p.reason.as_deref()),
            (JobStatus::Cancelled, Some("manual"))
        );
        assert_clean(&rt).await;
    }
}

/// Starts a 10-item batch (chunk 3) and runs it until children 0..3 completed and children
/// 3..6 exist, not started; rows 6..10 are not scheduled yet.
async fn mid_flight(rt: &Runtime) -> i64 {
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    rt.run_due_once().await.unwrap(); // chunk 0: children 0..3
    rt.run_due_once().await.unwrap(); // children 0..3 complete; chunk 3: children 3..6
    assert_eq!(tally(rt, parent).await, (3, 0, 3));
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(st.ready, 4, "rows 6..10 not scheduled yet");
    parent
}

/// The repro as a new user met it: a batch mid-flight, `cancel-job` (no worker
/// running), then a worker drains the queue: before the fix 90 pending children of the
/// cancelled parent ran and completed. Now no child completes after the cancel returns.
pub async fn s_b13_mid_flight_cancel_then_drain_completes_no_child(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(10, 3, ok_child)).await;
    let parent = mid_flight(&rt).await;
    let done = operator(&db).cancel(parent).await.unwrap();
    assert_eq!(done.status, JobStatus::Cancelled, "no child was running");
    assert_eq!(tally(&rt, parent).await, (3, 3, 0));
    rt.drain(1000).await.unwrap();
    assert_eq!(
        tally(&rt, parent).await,
        (3, 3, 0),
        "no child completes after the cancel returns"
    );
    for i in 3..10 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} (unstarted child or unscheduled row) released"
        );
    }
    for i in 0..3 {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(
            c.status,
            ClaimStatus::Processed,
            "completed child {i} stands"
        );
    }
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(st.children_total, 6, "no child after the cancel");
    assert_clean(&rt).await;
}

/// A manual fail is the same stop: the parent ends `failed` with the operator's reason (once
/// no child is active), unstarted children are cancelled, completed ones stand; lifecycle
/// hooks see the parent's failure.
pub async fn s_b13_manual_fail_stops_the_batch_and_fails_the_parent(db: TestDb) {
    let failed: Arc<Mutex<Vec<(i64, JobStatus)>>> = Arc::default();
    let seen = failed.clone();
    let rt = db
        .runtime()
        .pipeline(batch_pipeline(10, 3, ok_child))
        .on_job_failed(move |ev| {
            seen.lock().unwrap().push((ev.job_id, ev.status));
            async {}
        })
        .build()
        .await
        .unwrap();
    let parent = mid_flight(&rt).await;
    let done = operator(&db)
        .manual_fail(parent, Some("bad feed"))
        .await
        .unwrap();
    assert_eq!(
        (done.status, done.reason.as_deref()),
        (JobStatus::Failed, Some("bad feed"))
    );
    rt.drain(1000).await.unwrap();
    assert_eq!(tally(&rt, parent).await, (3, 3, 0));
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Failed, Some("bad feed"))
    );
    // A success status on a live batch parent is refused (it finishes from its children).
    let other = mid_flight_refusal(&rt).await;
    assert!(other.contains("batch parent"), "{other}");
    assert_eq!(
        failed.lock().unwrap().clone(),
        vec![(parent, JobStatus::Failed)],
        "on_job_failed fired for the failed parent only (cancelled children are not failures)"
    );
    assert_clean(&rt).await;
}

/// `Jobs::finish(parent, Completed)` on a live batch parent: the refusal's message.
async fn mid_flight_refusal(rt: &Runtime) -> String {
    for i in 0..10 {
        // Free the items the previous batch processed or held.
        if let Some(d) = rt
            .jobs()
            .claim(
                item(i),
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
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    let e = rt
        .jobs()
        .finish(parent, JobStatus::Completed, None)
        .await
        .unwrap_err();
    rt.jobs().cancel(parent).await.unwrap();
    e.to_string()
}

/// The three children's first step: each counts itself in (the third wakes `all_in`), then
/// waits for a permit of `go`. `steps` child steps after the split; a second step would add
/// 100 to `entered`.
fn gated_pipeline(
    steps: usize,
    entered: Arc<AtomicUsize>,
    all_in: Arc<Notify>,
    go: Arc<Semaphore>,
) -> Pipeline {
    let mut p = Pipeline::new("gated").step("split", |ctx| async move {
        let mut out = Vec::new();
        for i in 0..3 {
            let d = ctx
                .claim_in(
                    "shared:b",
                    "src",
                    &format!("item-{i}"),
                    tracked("g", 1, true),
                )
                .await
                .map_err(HandlerError::retry)?
                .ok_or_else(|| HandlerError::fatal("item held"))?;
            out.push(Packet::new(json!({"i": i})).with_claim(d));
        }
        Ok(StepOutput::Packets(out))
    });
    let e = entered.clone();
    p = p.step("first", move |_ctx| {
        let (e, all_in, go) = (e.clone(), all_in.clone(), go.clone());
        async move {
            if e.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                all_in.notify_one();
            }
            let _permit = go.acquire().await.map_err(HandlerError::fatal)?;
            Ok(StepOutput::one(json!({})))
        }
    });
    if steps > 1 {
        p = p.step("second", move |_ctx| {
            let e = entered.clone();
            async move {
                e.fetch_add(100, Ordering::SeqCst);
                Ok(StepOutput::one(json!({})))
            }
        });
    }
    p.chunk_size(10)
}

/// B5: a child whose step is running when the cancel commits finishes that step (its result
/// stands) and starts no further one: with a second step left it is cancelled at the step
/// boundary; when the running step was its last, it completes (its item processed). The parent
/// finishes `cancelled` once no child is active, through its finalize action.
pub async fn b5_running_children_finish_their_step_and_start_no_other(db: TestDb) {
    for steps in [2, 1] {
        let entered = Arc::new(AtomicUsize::new(0));
        let all_in = Arc::new(Notify::new());
        let go = Arc::new(Semaphore::new(0));
        let pipeline = gated_pipeline(steps, entered.clone(), all_in.clone(), go.clone());
        let rt = Arc::new(db.runtime().pipeline(pipeline).build().await.unwrap());
        let parent = rt.jobs().start("gated", json!({})).await.unwrap();
        rt.run_due_once().await.unwrap(); // split
        rt.run_due_once().await.unwrap(); // chunk: 3 children
        let running = {
            let rt = rt.clone();
            tokio::spawn(async move { rt.run_due_once().await })
        };
        all_in.notified().await; // all three children are inside their first step
        let done = operator(&db).cancel(parent).await.unwrap();
        assert_eq!(
            (done.status, done.reason.as_deref()),
            (JobStatus::Processing, Some("cancel_requested")),
            "steps: {steps}: children still running"
        );
        go.add_permits(3);
        running.await.unwrap().unwrap();
        rt.drain(1000).await.unwrap();
        assert_eq!(
            entered.load(Ordering::SeqCst),
            3,
            "steps: {steps}: no second step started"
        );
        let expect = if steps == 2 { (0, 3, 0) } else { (3, 0, 0) };
        assert_eq!(tally(&rt, parent).await, expect, "steps: {steps}");
        for i in 0..3 {
            let c = rt.jobs().claim_state(&item(i)).await.unwrap();
            if steps == 2 {
                assert!(c.is_none(), "cancelled child's item {i} released");
            } else {
                let c = c.unwrap();
                assert_eq!(c.status, ClaimStatus::Processed, "result stands");
                // Free it for the next round.
                let d = rt
                    .jobs()
                    .claim(
                        item(i),
                        None,
                        chrono::Duration::minutes(1),
                        Default::default(),
                        true,
                    )
                    .await
                    .unwrap()
                    .unwrap();
                rt.jobs().release(&d, false).await.unwrap();
            }
        }
        let p = rt.jobs().get(parent).await.unwrap();
        assert_eq!(
            (p.status, p.reason.as_deref()),
            (JobStatus::Cancelled, Some("manual"))
        );
        assert_clean(&rt).await;
    }
}

/// Lifecycle hooks (README): a cancel is not a failure. `on_job_failed` fires for `failed`
/// only; a cancelled job reaches `on_job_finished` with status `cancelled`.
pub async fn hooks_cancel_reaches_on_finished_not_on_failed(db: TestDb) {
    let failed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let finished: Arc<Mutex<Vec<(i64, JobStatus)>>> = Arc::default();
    let (f, d) = (failed.clone(), finished.clone());
    let rt = db
        .runtime()
        .pipeline(Pipeline::new("hold").step("only", |_ctx| async { Ok(StepOutput::none()) }))
        .on_job_failed(move |ev| {
            f.lock().unwrap().push(ev.job_id);
            async {}
        })
        .on_job_finished(move |ev| {
            d.lock().unwrap().push((ev.job_id, ev.status));
            async {}
        })
        .build()
        .await
        .unwrap();
    let cancelled = rt.jobs().start("hold", json!({})).await.unwrap();
    let failed_job = rt.jobs().start("hold", json!({})).await.unwrap();
    rt.jobs().cancel(cancelled).await.unwrap();
    rt.jobs().manual_fail(failed_job, None).await.unwrap();
    rt.drain(100).await.unwrap();
    assert_eq!(failed.lock().unwrap().clone(), vec![failed_job]);
    assert_eq!(
        finished.lock().unwrap().clone(),
        vec![
            (cancelled, JobStatus::Cancelled),
            (failed_job, JobStatus::Failed)
        ]
    );
}
