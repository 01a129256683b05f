//! Runtimes with different pipeline sets on one database (issue 15, defect 12): each claims
//! only the job engine's actions of the pipelines it has, so neither fails the other's jobs as
//! `unrunnable`, a batch's chunk and finalize actions run only where its pipeline is, and
//! steps and chunks enqueued before the routing existed still run.

use super::batches::{actions, batch_pipeline, children, ok_child};
use crate::harness::TestDb;
use dockhand::batch::{chunk_action, CHUNK_HOOK, FINALIZE_HOOK, GROUP};
use dockhand::{ActionStatus, Clock, DynStore, JobStatus, Pipeline, Runtime, StepOutput};
use serde_json::json;

fn one_step(name: &str) -> Pipeline {
    Pipeline::new(name).step("work", |_ctx| async { Ok(StepOutput::one(json!({}))) })
}

async fn runtime(db: &TestDb, store: DynStore, p: Pipeline) -> Runtime {
    db.runtime_on(store).pipeline(p).build().await.unwrap()
}

async fn status(rt: &Runtime, job: i64) -> (JobStatus, Option<String>) {
    let j = rt.jobs().get(job).await.unwrap();
    (j.status, j.reason)
}

/// Runtime A has pipeline `alpha`, runtime B has `beta` (a batch pipeline, so its chunk,
/// child steps and finalize are routed too). B runs first: it finishes its own job and
/// leaves A's step pending; then A finishes its own.
pub async fn two_runtimes_with_different_pipelines_finish_their_own_jobs(db: TestDb) {
    let a = runtime(&db, db.store.clone(), one_step("alpha")).await;
    let b = runtime(&db, db.open_another().await, batch_pipeline(3, 2, ok_child)).await;
    let job_a = a.jobs().start("alpha", json!({})).await.unwrap();
    let job_b = b.jobs().start("batch", json!({})).await.unwrap();
    b.drain(1000).await.unwrap();
    assert_eq!(status(&b, job_b).await.0, JobStatus::Completed);
    assert_eq!(children(&b, job_b).await.len(), 3);
    assert_eq!(
        status(&a, job_a).await,
        (JobStatus::Pending, None),
        "B left A's job alone"
    );
    let steps = actions(&a, "dockhand.job.step").await;
    let a_step = steps
        .iter()
        .find(|s| s.args["job"] == json!(job_a))
        .unwrap();
    assert_eq!(a_step.status, ActionStatus::Pending, "A's step not claimed");
    assert_eq!(a_step.attempt, 0);

    let job_b2 = b.jobs().start("batch", json!({})).await;
    a.drain(1000).await.unwrap();
    assert_eq!(status(&a, job_a).await.0, JobStatus::Completed);
    // B's second batch (its items are processed already, so it has nothing to fan out, or
    // it fans out nothing) is not touched by A either.
    if let Ok(j) = job_b2 {
        assert_ne!(
            status(&a, j).await,
            (JobStatus::Failed, Some("unrunnable".into())),
            "A never fails B's job"
        );
        b.drain(1000).await.unwrap();
        assert!(status(&b, j).await.0.is_final());
    }
    assert!(a.jobs().check().await.unwrap().is_empty());
}

/// A runtime without pipelines (a plain worker sharing the queue, claiming every hook) leaves
/// the job engine's actions for a runtime that has their pipeline: it used to claim the step
/// and fail it as an unknown hook.
pub async fn runtime_without_pipelines_leaves_job_actions_alone(db: TestDb) {
    let plain = db
        .runtime_on(db.open_another().await)
        .handler("send_mail", |_ctx| async { Ok(()) })
        .build()
        .await
        .unwrap();
    let engine = runtime(&db, db.store.clone(), one_step("alpha")).await;
    let job = engine.jobs().start("alpha", json!({})).await.unwrap();
    plain
        .queue()
        .enqueue(dockhand::ActionSpec::new("send_mail", json!({})))
        .await
        .unwrap();
    assert_eq!(plain.run_due_once().await.unwrap(), 1, "only send_mail ran");
    assert_eq!(status(&engine, job).await.0, JobStatus::Pending);
    engine.drain(100).await.unwrap();
    assert_eq!(status(&engine, job).await.0, JobStatus::Completed);
}

/// A step action enqueued before the routing existed, as earlier versions wrote it (hook
/// `dockhand.job.step`, args `{job, step}`, group `pipeline:<name>`, key `j:<job>:<step>`,
/// through the plain enqueue), is claimed and run by the runtime that has the pipeline.
pub async fn step_rows_from_before_the_routing_still_run(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), one_step("alpha")).await;
    let job = rt.jobs().start("alpha", json!({})).await.unwrap();
    let step = actions(&rt, "dockhand.job.step").await[0].clone();
    db.cancel_behind_store(step.id).await;
    let now = db.clock.now();
    let legacy = dockhand::action::PreparedAction {
        hook: "dockhand.job.step".into(),
        args_json: format!(r#"{{"job":{job},"step":0}}"#),
        group: Some("pipeline:alpha".into()),
        priority: 10,
        scheduled_at: now,
        max_attempts: 3,
        timeout_ms: None,
        unique_key: Some(format!("j:{job}:0")),
        schedule_id: None,
    };
    db.store.enqueue(&legacy, now).await.unwrap();
    rt.drain(100).await.unwrap();
    assert_eq!(status(&rt, job).await.0, JobStatus::Completed);
}

/// A batch's chunk and finalize actions are routed by its parent's pipeline (group
/// `pipeline:<name>`, issue 15): runtime A (pipeline `alpha`) never claims those of B's batch,
/// at any point of the batch; B runs them all. Before they carried the group `dockhand.batch`
/// and any runtime with a pipeline took them (and A, without B's completion handlers, would
/// finalize B's parent).
pub async fn batch_chunk_and_finalize_run_only_where_the_pipeline_is(db: TestDb) {
    let a = runtime(&db, db.store.clone(), one_step("alpha")).await;
    let b = runtime(&db, db.open_another().await, batch_pipeline(5, 2, ok_child)).await;
    let parent = b.jobs().start("batch", json!({})).await.unwrap();
    let mut rounds = 0;
    while !status(&b, parent).await.0.is_final() {
        assert_eq!(
            a.drain(1000).await.unwrap(),
            0,
            "A claims none of B's actions"
        );
        assert!(
            b.run_due_once().await.unwrap() > 0,
            "B has work until the end"
        );
        rounds += 1;
        assert!(rounds < 100, "the batch finishes");
    }
    assert_eq!(status(&b, parent).await, (JobStatus::Completed, None));
    assert_eq!(children(&b, parent).await.len(), 5);
    for hook in [CHUNK_HOOK, FINALIZE_HOOK] {
        let mine: Vec<_> = actions(&b, hook)
            .await
            .into_iter()
            .filter(|x| x.args["parent"] == json!(parent))
            .collect();
        assert!(!mine.is_empty(), "{hook} actions ran");
        for x in mine {
            assert_eq!(x.group.as_deref(), Some("pipeline:batch"), "{hook}");
            assert_eq!(x.status, ActionStatus::Complete, "{hook}");
        }
    }
    assert!(b.jobs().check().await.unwrap().is_empty());
}

/// A chunk action enqueued before the routing, with the group `dockhand.batch` (as earlier
/// versions wrote it), is still claimed and run: the batch completes.
pub async fn chunk_rows_from_before_the_routing_still_run(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    let chunk = actions(&rt, CHUNK_HOOK).await[0].clone();
    assert_eq!(chunk.status, ActionStatus::Pending);
    db.cancel_behind_store(chunk.id).await;
    let now = db.clock.now();
    let legacy = chunk_action(parent, 0, chunk.priority, GROUP.into(), now);
    db.store.enqueue(&legacy, now).await.unwrap();
    rt.drain(1000).await.unwrap();
    assert_eq!(status(&rt, parent).await, (JobStatus::Completed, None));
    assert_eq!(children(&rt, parent).await.len(), 3);
}
