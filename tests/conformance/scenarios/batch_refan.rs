//! An operator cancels a running fan-out step action and retries it by hand while the batch's
//! children wait for their retry (the sweep workload's `refan`, issue 15): wherever the cancel
//! lands in the step's run, the retried step leaves the job a way to its final status. The
//! store now refuses an operator's cancel of a step action (`JOB_OWNED_HOOKS`), so the cancel
//! is written behind its back, as databases from before that refusal can hold it; the hand
//! retry of a canceled or failed step action is still the operator's.

use super::batch_regressions::drain_rounds;
use super::batches::{actions, assert_clean, children, split_items};
use crate::harness::TestDb;
use dockhand::jobs::STEP_HOOK;
use dockhand::store::faulty::{CallHook, FaultyStore};
use dockhand::{ActionStatus, Clock, DynStore, HandlerError, JobStatus, Pipeline, StepOutput};
use serde_json::json;
use std::sync::Arc;

/// Items the split claims and fans out, in chunks of two.
const N: usize = 4;

/// A batch whose children fail their first attempt (they wait for a retry while the operator
/// acts).
fn slow_batch() -> Pipeline {
    Pipeline::new("batch")
        .step("split", |ctx| split_items(ctx, N))
        .step("child", |ctx| async move {
            if ctx.attempt <= 1 {
                return Err(HandlerError::retry("first attempt of a slow child"));
            }
            Ok(StepOutput::one(json!({})))
        })
        .chunk_size(2)
}

/// The operator's cancel of the running step action of `job`, landed right before the next
/// call of `method` (through the wrapped store, so it is not counted as a call).
async fn cancel_before(faulty: &FaultyStore, method: &str, db: &TestDb, job: i64) {
    let (store, clock): (DynStore, _) = (db.store.clone(), db.clock.clone());
    let raw = db.raw().await;
    let hook: CallHook = Arc::new(move || {
        let (store, clock, raw) = (store.clone(), clock.clone(), raw.clone());
        Box::pin(async move {
            let all = store
                .query(&dockhand::ActionQuery {
                    statuses: vec![ActionStatus::Running],
                    limit: 100,
                    ..Default::default()
                })
                .await
                .unwrap();
            let step = all
                .into_iter()
                .find(|a| a.hook == STEP_HOOK && a.args["job"] == json!(job))
                .expect("the step action runs");
            assert_eq!(raw.cancel_action(step.id, clock.now()).await, 1);
        })
    });
    faulty.before_call(method, 1, hook);
}

/// Runs the scenario with the cancel landing before `method`'s next call during the split.
async fn cancel_then_retry(db: &TestDb, method: &str) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .concurrency(1)
        .pipeline(slow_batch())
        .build()
        .await
        .unwrap();
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    cancel_before(&faulty, method, db, parent).await;
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(faulty.injected(), 1, "{method}: the cancel landed");
    // The batch (if its fan-out committed) is in flight: its children fail their first try.
    drain_rounds(&rt, db, 1).await;
    let step = actions(&rt, STEP_HOOK)
        .await
        .into_iter()
        .find(|a| a.args["job"] == json!(parent))
        .unwrap();
    assert_eq!(step.status, ActionStatus::Canceled, "{method}");
    assert!(rt.queue().retry(step.id).await.unwrap(), "operator retry");
    drain_rounds(&rt, db, 5).await;
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Completed, None),
        "{method}: the retried step brought the job to its end"
    );
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), N, "{method}");
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    assert_clean(&rt).await;
}

/// The cancel lands while the split claims its items: its claims are refused (the run lost its
/// lease), nothing is fanned out, and the operator's retry runs the split again.
pub async fn refan_cancel_before_the_fan_out_then_retry_runs_the_split(db: TestDb) {
    cancel_then_retry(&db, "claim_item").await;
}

/// The cancel lands after the split's fan-out committed, before the step action's finish
/// (fenced out); the operator's retry resumes the batch while its children wait for their
/// retry, and the job completes.
pub async fn regression_refan_cancel_after_the_fan_out_then_retry_resumes_the_batch(db: TestDb) {
    cancel_then_retry(&db, "finish").await;
}
