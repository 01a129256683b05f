//! Failure routes driven by the fault-injection wrapper (`FaultyStore`) around the real store.

use super::claims::tracked;
use crate::harness::TestDb;
use dockhand::claims::{ClaimStatus, CompleteOutcome};
use dockhand::jobs::JobEvent;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::{
    ActionFilter, ActionQuery, ActionSpec, ActionStatus, Clock, DynStore, HandlerError, Identity,
    JobStatus, Pipeline, Runtime, StepOutput,
};
use serde_json::json;
use std::sync::{Arc, Mutex};

fn item() -> Identity {
    Identity::new("shared:f", "src", "item").unwrap()
}

/// One step that claims `item` with the tracked-items ledger and succeeds.
async fn faulty_runtime(
    db: &TestDb,
    events: &Arc<Mutex<Vec<JobEvent>>>,
) -> (Runtime, Arc<FaultyStore>) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let e = events.clone();
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .pipeline(
            Pipeline::new("one")
                .step("take", |ctx| async move {
                    ctx.claim_in("shared:f", "src", "item", tracked("f", 1, true))
                        .await
                        .map_err(HandlerError::retry)?
                        .ok_or_else(|| HandlerError::retry("item held"))?;
                    Ok(StepOutput::one(json!({})))
                })
                .inline()
                .step("finish", |_ctx| async { Ok(StepOutput::one(json!({}))) }),
        )
        .on_job_finished(move |ev| {
            let e = e.clone();
            async move { e.lock().unwrap().push(ev) }
        })
        .build()
        .await
        .unwrap();
    (rt, faulty)
}

pub async fn fault_bridge_fails_before_then_retry_finishes_once(db: TestDb) {
    let events = Arc::default();
    let (rt, faulty) = faulty_runtime(&db, &events).await;
    faulty.fail_nth("finish_jobs", 1, FaultMode::FailBefore);
    let job = rt.jobs().start("one", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(
        rt.jobs().get(job).await.unwrap().status,
        JobStatus::Processing,
        "bridge failed: not final"
    );
    let c = rt.jobs().claim_state(&item()).await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.job_id),
        (ClaimStatus::Claimed, Some(job)),
        "claim kept for the retry"
    );
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap();
    assert_eq!(
        rt.jobs().get(job).await.unwrap().status,
        JobStatus::Completed
    );
    assert_eq!(
        rt.jobs()
            .claim_state(&item())
            .await
            .unwrap()
            .unwrap()
            .status,
        ClaimStatus::Processed
    );
    assert_eq!(faulty.injected(), 1);
    assert_eq!(events.lock().unwrap().len(), 1, "one lifecycle event");
}

pub async fn fault_bridge_commits_but_ack_lost(db: TestDb) {
    let events = Arc::default();
    let (rt, faulty) = faulty_runtime(&db, &events).await;
    faulty.fail_nth("finish_jobs", 1, FaultMode::ExecuteThenFail);
    let job = rt.jobs().start("one", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(
        rt.jobs().get(job).await.unwrap().status,
        JobStatus::Completed,
        "it committed"
    );
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap(); // the retried step action sees a final job and does nothing
    rt.run_maintenance_once().await.unwrap(); // the outbox sweep delivers the event
    assert_eq!(
        events.lock().unwrap().len(),
        1,
        "delivered once from the outbox"
    );
    let steps = rt
        .queue()
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: Some("dockhand.job.step".into()),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        steps.iter().all(|a| a.status == ActionStatus::Complete),
        "no step left pending"
    );
}

pub async fn fault_step_advance_fails_then_advances_once(db: TestDb) {
    let events = Arc::default();
    let (rt, faulty) = faulty_runtime(&db, &events).await;
    faulty.fail_nth("advance_job", 1, FaultMode::FailBefore);
    let job = rt.jobs().start("one", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(rt.jobs().get(job).await.unwrap().step_index, 0);
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap();
    let j = rt.jobs().get(job).await.unwrap();
    assert_eq!(
        j.status,
        JobStatus::Completed,
        "the retried step re-claimed its own item and went on"
    );
    let step1 = rt
        .queue()
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: Some("dockhand.job.step".into()),
                args: Some(json!({"job": job, "step": 1})),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(step1.len(), 1, "the next step was enqueued once");
}

pub async fn fault_completion_ack_lost_is_not_repeated(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let d = jobs
        .claim(
            item(),
            Some(1),
            chrono::Duration::minutes(5),
            tracked("f", 7, true),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    faulty.fail_nth("complete_claim", 1, FaultMode::ExecuteThenFail);
    assert!(jobs.complete(&d).await.is_err(), "the caller saw an error");
    assert_eq!(
        jobs.complete(&d).await.unwrap(),
        CompleteOutcome::Lost,
        "re-completing is a no-op"
    );
    let t = db.store.tracked_item("f", "item").await.unwrap().unwrap();
    assert_eq!(t.revision, 7, "the handler ran once");
}

pub async fn fault_claim_ack_lost_is_taken_over_after_ttl(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    faulty.fail_nth("claim_item", 1, FaultMode::ExecuteThenFail);
    let ttl = chrono::Duration::minutes(5);
    assert!(jobs
        .claim(item(), Some(1), ttl, Default::default(), false)
        .await
        .is_err());
    assert!(
        jobs.claim(item(), Some(2), ttl, Default::default(), false)
            .await
            .unwrap()
            .is_none(),
        "held by the unknown token"
    );
    db.clock.advance(ttl);
    assert!(
        jobs.claim(item(), Some(2), ttl, Default::default(), false)
            .await
            .unwrap()
            .is_some(),
        "never claimed forever"
    );
}

pub async fn fault_transient_finish_is_retried_in_process(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .handler("ok", |_| async { Ok(()) })
        .build()
        .await
        .unwrap();
    let id = rt
        .queue()
        .enqueue(ActionSpec::new("ok", json!({})))
        .await
        .unwrap();
    faulty.fail_nth("finish", 1, FaultMode::Retryable);
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    assert_eq!(
        rt.queue().get(id).await.unwrap().status,
        ActionStatus::Complete,
        "retried within the run"
    );
    assert_eq!(faulty.calls("finish"), 2);
    // A claim that keeps failing surfaces as an error and leaves nothing running.
    faulty.fail_from("claim", 1, FaultMode::FailBefore);
    rt.queue()
        .enqueue(ActionSpec::new("ok", json!(2)))
        .await
        .unwrap();
    assert!(rt.run_due_once().await.is_err());
    faulty.heal();
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    let _ = db.clock.now();
}
