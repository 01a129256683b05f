//! Scheduled pipelines (issue 17 item 3): a schedule whose occurrences start a job of a named
//! pipeline — at most one job per occurrence however often its action runs, routed to a
//! runtime that has the pipeline, and with `no_overlap` no job while the schedule's previous
//! one is live.

use crate::harness::{t0, TestDb};
use chrono::Duration;
use dockhand::jobs::{JobFilter, SCHEDULED_START_HOOK};
use dockhand::{
    ActionFilter, ActionQuery, ActionSpec, ActionStatus, JobStatus, Packet, Pipeline, Recurrence,
    Runtime, ScheduleSpec, StepOutput,
};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

async fn jobs_of(rt: &Runtime, pipeline: &str) -> Vec<dockhand::jobs::Job> {
    let mut jobs = rt
        .jobs()
        .list(&JobFilter {
            pipeline: Some(pipeline.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    jobs.sort_by_key(|j| j.id);
    jobs
}

async fn start_actions(rt: &Runtime) -> Vec<dockhand::action::Action> {
    rt.queue()
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: Some(SCHEDULED_START_HOOK.into()),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Every minute, a job of `report` with the schedule's input; an occurrence whose action runs
/// twice (a crash after the job committed, before the action's acknowledgement) still makes
/// one job; a runtime without the pipeline leaves the occurrence alone.
pub async fn scheduled_pipeline_starts_one_job_per_occurrence(db: TestDb) {
    let inputs: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = Arc::clone(&inputs);
    let rt = db
        .runtime()
        .pipeline(Pipeline::new("report").step("build", move |ctx| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(ctx.input().clone());
                Ok(StepOutput::one(json!({})))
            }
        }))
        .build()
        .await
        .unwrap();
    let plain = db
        .runtime_on(db.open_another().await)
        .handler("other", |_ctx| async { Ok(()) })
        .build()
        .await
        .unwrap();
    let first = t0() + Duration::minutes(1);
    rt.queue()
        .schedule(
            ScheduleSpec::pipeline(
                "minutely-report",
                "report",
                json!({"region": "eu"}),
                Recurrence::every(Duration::minutes(1)).unwrap(),
            )
            .starting_at(first),
        )
        .await
        .unwrap();
    db.clock.set(first);
    plain.drain(100).await.unwrap();
    let pending = start_actions(&rt).await;
    assert_eq!(pending.len(), 1, "one occurrence materialised");
    assert_eq!(
        pending[0].status,
        ActionStatus::Pending,
        "a runtime without the pipeline does not run its occurrence"
    );
    assert!(jobs_of(&rt, "report").await.is_empty());

    rt.drain(100).await.unwrap();
    let jobs = jobs_of(&rt, "report").await;
    assert_eq!(jobs.len(), 1, "one job for the occurrence");
    assert_eq!(jobs[0].status, JobStatus::Completed);
    assert_eq!(*inputs.lock().unwrap(), vec![json!({"region": "eu"})]);

    // The same occurrence's action once more (as after a crash between the job's commit and
    // the action's acknowledgement): no second job.
    let occurrence = &start_actions(&rt).await[0];
    rt.queue()
        .enqueue(
            ActionSpec::new(SCHEDULED_START_HOOK, occurrence.args.clone())
                .group("pipeline:report")
                .at(occurrence.scheduled_at),
        )
        .await
        .unwrap();
    rt.drain(100).await.unwrap();
    assert_eq!(jobs_of(&rt, "report").await.len(), 1, "still one job");

    db.clock.set(first + Duration::minutes(1));
    rt.drain(100).await.unwrap();
    let jobs = jobs_of(&rt, "report").await;
    assert_eq!(jobs.len(), 2, "the next occurrence starts the next job");
    assert!(jobs.iter().all(|j| j.status == JobStatus::Completed));
    assert!(start_actions(&rt)
        .await
        .iter()
        .all(|a| a.status == ActionStatus::Complete));
    assert!(rt.jobs().check().await.unwrap().is_empty());
}

/// With `no_overlap`, an occurrence that comes while the schedule's previous job is parked
/// starts nothing (skipped, not postponed); once that job is final the next occurrence starts
/// one. A schedule of the same pipeline without the option starts a job every time.
pub async fn scheduled_pipeline_no_overlap_skips_while_the_previous_job_lives(db: TestDb) {
    // job id -> the schedule's input key ("x": exclusive, "o": overlapping)
    let started: Arc<Mutex<Vec<(i64, Value)>>> = Arc::default();
    let seen = Arc::clone(&started);
    let pipeline = Pipeline::new("sync")
        .step("wait", move |ctx| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .push((ctx.job_id, ctx.input()["k"].clone()));
                Ok(StepOutput::Park(vec![Packet::new(json!({}))]))
            }
        })
        .step("done", |_ctx| async { Ok(StepOutput::one(json!({}))) });
    let rt = db.runtime().pipeline(pipeline).build().await.unwrap();
    let first = t0() + Duration::minutes(1);
    let every = || Recurrence::every(Duration::minutes(1)).unwrap();
    rt.queue()
        .schedule(
            ScheduleSpec::pipeline("sync-exclusive", "sync", json!({"k": "x"}), every())
                .no_overlap()
                .starting_at(first),
        )
        .await
        .unwrap();
    rt.queue()
        .schedule(
            ScheduleSpec::pipeline("sync-overlapping", "sync", json!({"k": "o"}), every())
                .starting_at(first),
        )
        .await
        .unwrap();
    let of = |jobs: &[dockhand::jobs::Job], status: JobStatus| {
        jobs.iter().filter(|j| j.status == status).count()
    };

    db.clock.set(first);
    rt.drain(100).await.unwrap();
    let jobs = jobs_of(&rt, "sync").await;
    assert_eq!(
        jobs.len(),
        2,
        "both schedules start a job at the first occurrence"
    );
    assert_eq!(of(&jobs, JobStatus::Waiting), 2);

    db.clock.set(first + Duration::minutes(1));
    rt.drain(100).await.unwrap();
    let jobs = jobs_of(&rt, "sync").await;
    assert_eq!(
        jobs.len(),
        3,
        "the overlapping schedule starts another job; the exclusive one skips: {jobs:?}"
    );
    let skipped = start_actions(&rt).await;
    assert!(
        skipped.iter().all(|a| a.status == ActionStatus::Complete),
        "a skipped occurrence is done, not retried"
    );

    let exclusive: Vec<i64> = started
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, k)| *k == json!("x"))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(exclusive.len(), 1, "the exclusive schedule started one job");
    let exclusive = exclusive[0];
    rt.jobs().resume(exclusive).await.unwrap();
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(exclusive).await.unwrap().status,
        JobStatus::Completed
    );

    db.clock.set(first + Duration::minutes(2));
    rt.drain(100).await.unwrap();
    let jobs = jobs_of(&rt, "sync").await;
    assert_eq!(
        jobs.len(),
        5,
        "after its job is final the exclusive schedule starts again (and the other one too)"
    );
    assert_eq!(of(&jobs, JobStatus::Waiting), 4);
    assert!(rt.jobs().check().await.unwrap().is_empty());
}
