//! A step action that fails for good always brings its job to `failed` through the bridge,
//! without an operator (issue 15, defect 3; S-B15): the store enqueues the job's
//! `dockhand.job.finish` action in the transaction that fails the step action, and a bridge
//! error retries that action instead of being logged and forgotten.

use super::batches::actions;
use crate::harness::TestDb;
use dockhand::batch::recovery::RecoverOptions;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::store::ClaimRequest;
use dockhand::{
    ActionStatus, Clock, DynStore, HandlerError, JobStatus, Pipeline, Runtime, StepOutput,
};
use serde_json::json;
use std::sync::Arc;

/// `fails`: one step that fails (retryably, or fatally when the input says so), 2 attempts.
fn failing_pipeline() -> Pipeline {
    Pipeline::new("fails")
        .step("work", |ctx| async move {
            if ctx.input()["fatal"].as_bool() == Some(true) {
                return Err(HandlerError::fatal("bad data"));
            }
            Err::<StepOutput, _>(HandlerError::retry("still failing"))
        })
        .max_attempts(2)
}

async fn runtime(db: &TestDb) -> (Runtime, Arc<FaultyStore>) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .pipeline(failing_pipeline())
        .build()
        .await
        .unwrap();
    (rt, faulty)
}

async fn status(rt: &Runtime, job: i64) -> (JobStatus, Option<String>) {
    let j = rt.jobs().get(job).await.unwrap();
    (j.status, j.reason)
}

/// S-B15: the bridge call fails once when the step fails its last attempt; the job still ends
/// `failed / retry_exhausted`, driven by its finish action alone (no recover-stuck).
pub async fn s_b15_bridge_error_after_the_last_attempt_is_retried(db: TestDb) {
    let (rt, faulty) = runtime(&db).await;
    faulty.fail_nth("finish_job", 1, FaultMode::FailBefore);
    let job = rt.jobs().start("fails", json!({})).await.unwrap();
    rt.drain(10).await.unwrap(); // attempt 1 fails, retry in 10 s
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap(); // attempt 2 fails for good; the bridge call fails
    assert_eq!(faulty.injected(), 1, "the bridge fault fired");
    assert_eq!(status(&rt, job).await.0, JobStatus::Processing);
    let finish = actions(&rt, "dockhand.job.finish").await;
    assert_eq!(finish.len(), 1, "one finish action");
    assert_eq!(
        finish[0].status,
        ActionStatus::Pending,
        "the finish action waits for its retry: a durable way forward"
    );
    assert!(
        rt.jobs().check().await.unwrap().is_empty(),
        "the job has a scheduler path"
    );
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap();
    assert_eq!(
        status(&rt, job).await,
        (JobStatus::Failed, Some("retry_exhausted".into()))
    );
    assert!(rt.jobs().check().await.unwrap().is_empty());
}

/// The step action's failure commits but its acknowledgement is lost (the process could have
/// died there): the finish action committed with it, so the job still ends failed.
pub async fn step_failure_committed_with_lost_ack_still_fails_the_job(db: TestDb) {
    let (rt, faulty) = runtime(&db).await;
    let job = rt
        .jobs()
        .start("fails", json!({"fatal": true}))
        .await
        .unwrap();
    faulty.fail_nth("finish", 1, FaultMode::ExecuteThenFail);
    rt.drain(10).await.unwrap();
    assert_eq!(faulty.injected(), 1, "the finish fault fired");
    assert_eq!(
        status(&rt, job).await,
        (JobStatus::Failed, Some("step_failed".into())),
        "a fatal error on attempt 1 of 2 is step_failed"
    );
}

/// R1 with a failing bridge: the reaper fails a step action whose lease expired with no
/// attempt left; the finish action it leaves retries the bridge until the job is failed.
pub async fn reaped_step_with_bridge_error_is_finished_by_maintenance(db: TestDb) {
    let (rt, faulty) = runtime(&db).await;
    let job = rt.jobs().start("fails", json!({})).await.unwrap();
    // The first bridge call fails, wherever it happens (it used to be the reaper's own call,
    // whose error was only logged).
    faulty.fail_nth("finish_job", 1, FaultMode::FailBefore);
    for attempt in 1..=2 {
        let now = db.clock.now();
        let claimed = db
            .store
            .claim(&ClaimRequest {
                owner: "dead-worker",
                limit: 10,
                now,
                lease_until: now + chrono::Duration::seconds(30),
                hooks: None,
                routing: None,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "attempt {attempt}: the step action");
        db.clock.advance(chrono::Duration::seconds(31));
        rt.run_maintenance_once().await.unwrap();
    }
    rt.drain(10).await.unwrap();
    assert_eq!(faulty.injected(), 1, "the bridge fault fired");
    assert!(
        !status(&rt, job).await.0.is_final(),
        "the dead worker never started the step: the job is still pending"
    );
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap();
    assert_eq!(
        status(&rt, job).await,
        (JobStatus::Failed, Some("retry_exhausted".into()))
    );
    let report = rt
        .jobs()
        .recover_stuck(&RecoverOptions {
            dry_run: true,
            limit: 100,
            older_than: chrono::Duration::zero(),
        })
        .await
        .unwrap();
    assert_eq!(report.examined, 0, "nothing left for recover-stuck");
}
