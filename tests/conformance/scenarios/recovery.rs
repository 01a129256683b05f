//! `recover-stuck` (R2), branch by branch, and what it must leave alone (issue 15): each
//! branch (requeue, fail stale, re-arm chunk) as its own scenario with the dry run's job list;
//! an operator tool without the user's completion handlers leaves a parent that needs them
//! (defect 11); one job's error does not stop the others; the bridge's event insert is
//! idempotent; an operator tool leaves lifecycle events for the runtime's hooks.

use super::batches::{actions, batch_pipeline, ok_child};
use super::claims::tracked;
use crate::harness::{Kind, TestDb};
use dockhand::batch::recovery::{RecoverOptions, RecoverReport, RecoveryAction};
use dockhand::claims::ledger::TrackedItems;
use dockhand::claims::{ClaimStatus, CompletionConfig};
use dockhand::jobs::JobEvent;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::{
    ActionStatus, Clock, DynStore, HandlerError, Identity, JobStatus, Jobs, Packet, Pipeline,
    Runtime, StepOutput,
};
use serde_json::json;
use std::sync::{Arc, Mutex};

type Events = Arc<Mutex<Vec<JobEvent>>>;

fn opts(dry_run: bool) -> RecoverOptions {
    RecoverOptions {
        dry_run,
        limit: 100,
        older_than: chrono::Duration::zero(),
    }
}

/// `two`: two steps; the first fails fatally when the input says so.
fn two_steps() -> Pipeline {
    Pipeline::new("two")
        .step("first", |ctx| async move {
            if ctx.input()["fatal"].as_bool() == Some(true) {
                return Err(HandlerError::fatal("bad data"));
            }
            Ok(StepOutput::one(json!({})))
        })
        .step("second", |_ctx| async { Ok(StepOutput::one(json!({}))) })
}

async fn runtime_with(db: &TestDb, store: DynStore, p: Pipeline, events: &Events) -> Runtime {
    let e = events.clone();
    db.runtime_on(store)
        .pipeline(p)
        .completion_handler("user.audit", Arc::new(TrackedItems))
        .on_job_finished(move |ev| {
            let e = e.clone();
            async move { e.lock().unwrap().push(ev) }
        })
        .build()
        .await
        .unwrap()
}

/// The job handle the CLI uses: no pipelines, built-in completion handlers, no hooks.
fn operator(db: &TestDb) -> Jobs {
    Jobs::without_pipelines(db.store.clone(), Arc::new(db.clock.clone()))
}

async fn status(rt: &Runtime, job: i64) -> (JobStatus, Option<String>) {
    let j = rt.jobs().get(job).await.unwrap();
    (j.status, j.reason)
}

/// Cancels the pending action of `hook` behind the store's back (a lost wake-up, or an
/// operator's cancel from before the store refused those).
async fn cancel_pending(db: &TestDb, rt: &Runtime, hook: &str) {
    let a = actions(rt, hook)
        .await
        .into_iter()
        .find(|a| a.status == ActionStatus::Pending)
        .unwrap_or_else(|| panic!("a pending {hook} action"));
    db.cancel_behind_store(a.id).await;
}

/// The report's one job entry, checked against what the dry run predicted.
fn only_job(r: &RecoverReport) -> &dockhand::batch::recovery::RecoveredJob {
    assert_eq!(r.jobs.len(), 1, "one stranded job: {:?}", r.jobs);
    &r.jobs[0]
}

/// Requeue: a processing job whose next step action is gone (cancelled) gets it enqueued
/// again; the dry run lists it with status processing → processing.
pub async fn recover_stuck_requeues_a_job_whose_step_action_is_gone(db: TestDb) {
    let events = Events::default();
    let rt = runtime_with(&db, db.store.clone(), two_steps(), &events).await;
    let job = rt.jobs().start("two", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // step 0 runs and enqueues step 1
    cancel_pending(&db, &rt, "dockhand.job.step").await;
    db.clock.advance(chrono::Duration::seconds(1));
    let dry = rt.jobs().recover_stuck(&opts(true)).await.unwrap();
    assert_eq!((dry.would_requeue, dry.requeued), (1, 0));
    let j = only_job(&dry);
    assert_eq!(
        (
            j.id,
            j.pipeline.as_str(),
            j.action,
            j.status,
            j.predicted_status
        ),
        (
            job,
            "two",
            RecoveryAction::Requeue,
            JobStatus::Processing,
            JobStatus::Processing
        )
    );
    assert_eq!(j.reason, None);
    let listed = serde_json::to_value(&dry).unwrap()["jobs"][0].clone();
    assert_eq!(
        (
            &listed["id"],
            &listed["pipeline"],
            &listed["status"],
            &listed["predicted_status"],
            &listed["reason"]
        ),
        (
            &json!(job),
            &json!("two"),
            &json!("processing"),
            &json!("processing"),
            &json!(null)
        ),
        "--json lists {{id, pipeline, status, predicted_status, reason}}"
    );
    assert_eq!(
        rt.run_due_once().await.unwrap(),
        0,
        "dry run enqueued nothing"
    );
    let real = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!((real.requeued, real.errors), (1, 0));
    assert_eq!(only_job(&real).action, RecoveryAction::Requeue);
    rt.drain(100).await.unwrap();
    assert_eq!(status(&rt, job).await.0, JobStatus::Completed);
    assert!(rt.jobs().check().await.unwrap().is_empty());
}

/// Fail stale: a job whose step action failed for good and whose finish action was cancelled
/// by an operator (nothing else would move it) is finished `failed / stale`.
pub async fn recover_stuck_fails_a_job_whose_step_failed_for_good_stale(db: TestDb) {
    let events = Events::default();
    let rt = runtime_with(&db, db.store.clone(), two_steps(), &events).await;
    let job = rt
        .jobs()
        .start("two", json!({"fatal": true}))
        .await
        .unwrap();
    rt.run_due_once().await.unwrap(); // the step fails fatally: its finish action is pending
    cancel_pending(&db, &rt, "dockhand.job.finish").await;
    db.clock.advance(chrono::Duration::seconds(1));
    let dry = rt.jobs().recover_stuck(&opts(true)).await.unwrap();
    assert_eq!(dry.would_fail_stale, 1);
    let j = only_job(&dry);
    assert_eq!(
        (
            j.id,
            j.action,
            j.status,
            j.predicted_status,
            j.reason.as_deref()
        ),
        (
            job,
            RecoveryAction::FailStale,
            JobStatus::Processing,
            JobStatus::Failed,
            Some("stale")
        )
    );
    assert_eq!(status(&rt, job).await.0, JobStatus::Processing, "dry run");
    let real = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!((real.failed_stale, real.errors), (1, 0));
    assert_eq!(
        status(&rt, job).await,
        (JobStatus::Failed, Some("stale".into()))
    );
    assert_eq!(events.lock().unwrap().len(), 1, "the hook ran once");
}

/// Re-arm: a batch parent whose first chunk action is gone (not fenced, no child) gets its
/// chunk action enqueued again and then completes.
pub async fn recover_stuck_rearms_the_chunk_of_a_parent_not_yet_due(db: TestDb) {
    let events = Events::default();
    let rt = runtime_with(
        &db,
        db.store.clone(),
        batch_pipeline(3, 2, ok_child),
        &events,
    )
    .await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // the split step fans out and schedules chunk 0
    cancel_pending(&db, &rt, "dockhand.batch.chunk").await;
    db.clock.advance(chrono::Duration::seconds(1));
    let dry = rt.jobs().recover_stuck(&opts(true)).await.unwrap();
    assert_eq!(dry.would_rearm_chunk, 1);
    let j = only_job(&dry);
    assert_eq!(
        (j.id, j.action, j.predicted_status, j.reason.as_deref()),
        (
            parent,
            RecoveryAction::RearmChunk,
            JobStatus::Processing,
            None
        )
    );
    let real = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!((real.chunk_rearmed, real.errors), (1, 0));
    rt.drain(1000).await.unwrap();
    assert_eq!(status(&rt, parent).await.0, JobStatus::Completed);
    assert!(rt.jobs().check().await.unwrap().is_empty());
}

/// `audited`: the split step claims one item for the parent itself with the user's
/// completion handler `user.audit` (not handed to a child: it completes when the parent
/// does), and fans out two packets.
fn audited_batch() -> Pipeline {
    Pipeline::new("audited")
        .step("split", |ctx| async move {
            ctx.claim_in("shared:r", "src", "summary", user_audit())
                .await
                .map_err(HandlerError::retry)?
                .ok_or_else(|| HandlerError::fatal("summary held"))?;
            Ok(StepOutput::Packets(vec![
                Packet::new(json!({"i": 0})),
                Packet::new(json!({"i": 1})),
            ]))
        })
        .step("child", |_ctx| async { Ok(StepOutput::one(json!({}))) })
}

fn user_audit() -> CompletionConfig {
    CompletionConfig {
        handler: Some("user.audit".into()),
        ..tracked("audit", 1, true)
    }
}

fn summary() -> Identity {
    Identity::new("shared:r", "src", "summary").unwrap()
}

/// Defect 11: recover-stuck from an operator tool (the CLI: built-in completion handlers
/// only) finds a stranded parent that is due, whose own claim names the user's handler
/// `user.audit`. It leaves the parent (counted and listed, dry run and real run alike) instead
/// of downgrading it to `item_claim_completion_failed`; the runtime, which has the handler,
/// completes it.
pub async fn recover_stuck_leaves_a_parent_needing_a_handler_it_lacks(db: TestDb) {
    let events = Events::default();
    let rt = runtime_with(&db, db.store.clone(), audited_batch(), &events).await;
    let parent = rt.jobs().start("audited", json!({})).await.unwrap();
    // Run everything except the finalize action, then lose it: a stranded, due parent.
    for _ in 0..20 {
        rt.run_due_once().await.unwrap();
        let fin = actions(&rt, "dockhand.batch.finalize").await;
        if let Some(a) = fin.iter().find(|a| a.status == ActionStatus::Pending) {
            db.cancel_behind_store(a.id).await;
            break;
        }
    }
    assert_eq!(status(&rt, parent).await.0, JobStatus::Processing);
    db.clock.advance(chrono::Duration::seconds(1));
    let cli = operator(&db);
    for dry_run in [true, false] {
        let r = cli.recover_stuck(&opts(dry_run)).await.unwrap();
        assert_eq!((r.left_for_handler, r.errors), (1, 0), "dry_run {dry_run}");
        assert_eq!(r.batch_parents_completed + r.would_complete_batch_parent, 0);
        let j = only_job(&r);
        assert_eq!(
            (j.id, j.action, j.predicted_status, j.reason.as_deref()),
            (
                parent,
                RecoveryAction::LeftForHandler,
                JobStatus::Processing,
                None
            )
        );
        assert_eq!(j.missing_handlers, vec!["user.audit".to_string()]);
        let listed = serde_json::to_value(&r).unwrap();
        assert_eq!(listed["left_for_handler"], json!(1));
        assert_eq!(listed["jobs"][0]["id"], json!(parent));
    }
    assert_eq!(
        status(&rt, parent).await,
        (JobStatus::Processing, None),
        "left for the runtime, not failed item_claim_completion_failed"
    );
    let claim = rt.jobs().claim_state(&summary()).await.unwrap().unwrap();
    assert_eq!(claim.status, ClaimStatus::Claimed, "its claim still held");
    let r = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!((r.batch_parents_completed, r.left_for_handler), (1, 0));
    assert_eq!(status(&rt, parent).await.0, JobStatus::Completed);
    let claim = rt.jobs().claim_state(&summary()).await.unwrap().unwrap();
    assert_eq!(
        claim.status,
        ClaimStatus::Processed,
        "completed by user.audit"
    );
    assert!(rt.jobs().check().await.unwrap().is_empty());
}

/// One job's error does not stop recovery of the others: the bridge call of the first
/// stranded job fails; the second is still finished, and the report lists the error.
pub async fn recover_stuck_goes_on_after_one_jobs_error(db: TestDb) {
    let events = Events::default();
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime_with(&db, faulty.clone() as DynStore, two_steps(), &events).await;
    let mut jobs = Vec::new();
    for _ in 0..2 {
        jobs.push(
            rt.jobs()
                .start("two", json!({"fatal": true}))
                .await
                .unwrap(),
        );
        rt.run_due_once().await.unwrap();
        cancel_pending(&db, &rt, "dockhand.job.finish").await;
    }
    db.clock.advance(chrono::Duration::seconds(1));
    faulty.fail_nth("finish_job", 1, FaultMode::FailBefore);
    let r = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!(faulty.injected(), 1);
    assert_eq!((r.errors, r.failed_stale), (1, 1));
    assert_eq!(r.jobs.len(), 2);
    assert_eq!(r.jobs[0].id, jobs[0]);
    assert!(
        r.jobs[0].error.is_some(),
        "the first job's error is reported"
    );
    assert_eq!(
        r.jobs[0].predicted_status,
        JobStatus::Processing,
        "unchanged"
    );
    assert_eq!(r.jobs[1].error, None);
    assert_eq!(
        status(&rt, jobs[0]).await.0,
        JobStatus::Processing,
        "left for the next run"
    );
    assert_eq!(
        status(&rt, jobs[1]).await,
        (JobStatus::Failed, Some("stale".into()))
    );
    let again = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!((again.errors, again.failed_stale), (0, 1));
    assert_eq!(
        status(&rt, jobs[0]).await,
        (JobStatus::Failed, Some("stale".into()))
    );
}

/// A job whose lifecycle event row exists already (reachable only by editing rows) is still
/// finished: the bridge replaces the stray event, undelivered, and the hook hears the real
/// final status once. It used to fail with a unique-key error (and abort recover-stuck).
pub async fn bridge_replaces_a_stray_lifecycle_event(db: TestDb) {
    let events = Events::default();
    let rt = runtime_with(&db, db.store.clone(), two_steps(), &events).await;
    let job = rt
        .jobs()
        .start("two", json!({"fatal": true}))
        .await
        .unwrap();
    rt.run_due_once().await.unwrap();
    cancel_pending(&db, &rt, "dockhand.job.finish").await;
    let at = match db.kind {
        Kind::Postgres => "now()".to_string(),
        _ => db.clock.now().timestamp_millis().to_string(),
    };
    db.exec_sql(&format!(
        "INSERT INTO dockhand_job_events (job_id, status, reason, created_at, delivered_at)
         VALUES ({job}, 'completed', NULL, {at}, {at})"
    ))
    .await;
    db.clock.advance(chrono::Duration::seconds(1));
    let r = rt.jobs().recover_stuck(&opts(false)).await.unwrap();
    assert_eq!((r.errors, r.failed_stale), (0, 1), "{:?}", r.jobs);
    assert_eq!(
        status(&rt, job).await,
        (JobStatus::Failed, Some("stale".into()))
    );
    rt.run_maintenance_once().await.unwrap();
    let heard: Vec<(i64, JobStatus)> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.job_id, e.status))
        .collect();
    assert_eq!(heard, vec![(job, JobStatus::Failed)], "delivered once");
}

/// An operator tool's finish (the CLI's manual-fail, the dashboard's fail) leaves the
/// lifecycle event in the outbox: the runtime's maintenance delivers it to its hooks. It used
/// to be marked delivered by the tool, which runs no hooks, so the hooks never heard of it.
/// Recovery from the tool likewise leaves undelivered events for the runtime.
pub async fn operator_finish_leaves_the_event_for_the_runtime_hooks(db: TestDb) {
    let events = Events::default();
    let rt = runtime_with(&db, db.store.clone(), two_steps(), &events).await;
    let job = rt.jobs().start("two", json!({})).await.unwrap();
    let cli = operator(&db);
    let done = cli.manual_fail(job, None).await.unwrap();
    assert!(done.changed);
    let r = cli.recover_stuck(&opts(false)).await.unwrap();
    assert_eq!(
        (r.outbox_replayed, r.outbox_left_for_runtime),
        (0, 1),
        "left for the runtime"
    );
    assert!(events.lock().unwrap().is_empty());
    let m = rt.run_maintenance_once().await.unwrap();
    assert_eq!(m.events_delivered, 1);
    let heard: Vec<(i64, JobStatus, Option<String>)> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.job_id, e.status, e.reason.clone()))
        .collect();
    assert_eq!(
        heard,
        vec![(job, JobStatus::Failed, Some("manual".into()))],
        "the runtime's hook heard the operator's fail"
    );
}
