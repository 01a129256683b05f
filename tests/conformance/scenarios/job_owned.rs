//! The actions a job owns (its step and finish actions, a batch parent's chunk and finalize
//! actions: `store::operator::JOB_OWNED_HOOKS`) are its scheduler path (R2). An operator's
//! cancel, unschedule or delete of one used to leave the job `processing` with nothing to move
//! it (a known gap until session 25); every operator surface now refuses them, and the job's
//! own commands (`cancel-job`, `Jobs::cancel`) stop it through the bridge.

use super::batches::{actions, assert_clean, batch_pipeline, ok_child, runtime};
use crate::harness::TestDb;
use dockhand::batch::{CHUNK_HOOK, FINALIZE_HOOK};
use dockhand::jobs::STEP_HOOK;
use dockhand::{ActionFilter, ActionSpec, ActionStatus, Clock, Error, JobStatus};
use serde_json::json;

/// A batch parent's step and chunk actions survive every operator surface while they are
/// active; user actions beside them are canceled as before; the batch then runs to its end,
/// and the final step action can be deleted as history.
pub async fn ops_job_owned_actions_are_refused_by_every_operator_surface(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let q = rt.queue();
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    let step = actions(&rt, STEP_HOOK).await[0].clone();
    assert_eq!(step.status, ActionStatus::Pending);
    let now = db.clock.now();

    // The single cancel names the job; the store refuses it on its own too.
    match q.cancel(step.id).await {
        Err(Error::OwnedByJob {
            action_id, job_id, ..
        }) => assert_eq!((action_id, job_id), (step.id, parent)),
        other => panic!("cancel of a step action: {other:?}"),
    }
    assert!(!db.store.cancel(step.id, now).await.unwrap());

    // A job-owned action whose args name no job (foreign or corrupt data) is still refused, with
    // an error naming the action, not answered "already final".
    let before = step.args.clone();
    db.exec_sql(&format!(
        "UPDATE dockhand_actions SET args = '{{\"job\": \"x\"}}' WHERE id = {}",
        step.id
    ))
    .await;
    match q.cancel(step.id).await {
        Err(e @ Error::Corrupt { id, .. }) if id == step.id => {
            assert!(e.to_string().contains("name no job"), "{e}")
        }
        other => panic!("cancel of a step action with malformed args: {other:?}"),
    }
    db.exec_sql(&format!(
        "UPDATE dockhand_actions SET args = '{before}' WHERE id = {}",
        step.id
    ))
    .await;

    // Bulk cancel and delete skip it; a user action in the same list is canceled.
    let user = q
        .enqueue(ActionSpec::new("user.work", json!(1)))
        .await
        .unwrap();
    let o = db
        .store
        .cancel_many(&[step.id, user], "ui:ann", now)
        .await
        .unwrap();
    assert_eq!((o.changed, o.skipped), (vec![user], vec![step.id]));
    let o = db.store.delete_actions(&[step.id]).await.unwrap();
    assert_eq!((o.changed, o.skipped), (vec![], vec![step.id]));

    // Unschedule, by hook or by the pipeline's group, leaves it pending.
    let by_hook = ActionFilter {
        hook: Some(STEP_HOOK.into()),
        ..ActionFilter::default()
    };
    assert_eq!(q.unschedule_all(&by_hook).await.unwrap(), 0);
    assert_eq!(q.unschedule_one(&by_hook).await.unwrap(), None);
    let group = step
        .group
        .clone()
        .expect("a step action has its pipeline's group");
    let by_group = ActionFilter {
        group: Some(group.clone()),
        ..ActionFilter::default()
    };
    assert_eq!(q.unschedule_all(&by_group).await.unwrap(), 0);
    // `unschedule_one` passes over the step action to the next match no job owns.
    let neighbour = q
        .enqueue(
            ActionSpec::new("user.work", json!(2))
                .group(group)
                .after(chrono::Duration::minutes(1)),
        )
        .await
        .unwrap();
    assert_eq!(q.unschedule_one(&by_group).await.unwrap(), Some(neighbour));
    let step_now = db.store.get(step.id).await.unwrap().unwrap();
    assert_eq!(
        step_now.status,
        ActionStatus::Pending,
        "the step action is untouched"
    );

    // The split runs; its chunk action (the batch's scheduler path now) is refused as well.
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    let chunk = actions(&rt, CHUNK_HOOK).await[0].clone();
    assert_eq!(chunk.status, ActionStatus::Pending);
    assert!(matches!(
        q.cancel(chunk.id).await,
        Err(Error::OwnedByJob { job_id, .. }) if job_id == parent
    ));
    let o = db
        .store
        .cancel_many(&[chunk.id], "ui:ann", now)
        .await
        .unwrap();
    assert_eq!(o.skipped, vec![chunk.id]);
    let o = db.store.delete_actions(&[chunk.id]).await.unwrap();
    assert_eq!(o.skipped, vec![chunk.id]);
    assert_eq!(
        q.unschedule_all(&ActionFilter::default()).await.unwrap(),
        0,
        "an unschedule of everything leaves the job's actions"
    );

    // The batch runs to its end: nothing was stranded.
    rt.drain(100).await.unwrap();
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(p.status, JobStatus::Completed);
    assert!(!actions(&rt, FINALIZE_HOOK).await.is_empty());
    assert_clean(&rt).await;

    // A final step action is history: its cancel is a plain "already final", and it can be
    // deleted.
    assert!(!q.cancel(step.id).await.unwrap());
    let o = db.store.delete_actions(&[step.id]).await.unwrap();
    assert_eq!(o.changed, vec![step.id]);
}

/// The job's own command still stops it: `Jobs::cancel` on a job whose step action is pending
/// cancels the job through the bridge and leaves no active action of its behind.
pub async fn ops_cancel_job_stops_what_the_action_cancel_refuses(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let job = rt.jobs().start("batch", json!({})).await.unwrap();
    let step = actions(&rt, STEP_HOOK).await[0].clone();
    assert!(rt.queue().cancel(step.id).await.is_err());
    rt.jobs().cancel(job).await.unwrap();
    rt.drain(100).await.unwrap();
    let j = rt.jobs().get(job).await.unwrap();
    assert_eq!(j.status, JobStatus::Cancelled);
    let active: Vec<_> = actions(&rt, STEP_HOOK)
        .await
        .into_iter()
        .filter(|a| matches!(a.status, ActionStatus::Pending | ActionStatus::Running))
        .collect();
    assert!(active.is_empty(), "no active step action: {active:?}");
    assert_clean(&rt).await;
}

/// Stopping a job (cancel or manual fail) cancels the step action still queued for it in the
/// bridge's transaction, with a log entry naming the job, instead of leaving it pending to
/// run later only to find its job final (a known gap until session 26). The step actions of
/// jobs nobody stopped are left alone.
pub async fn ops_stopping_a_job_cancels_its_queued_step_action(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 10, ok_child)).await;
    let step_of = |job: i64| {
        let rt = &rt;
        async move {
            actions(rt, STEP_HOOK)
                .await
                .into_iter()
                .find(|a| a.args["job"] == json!(job))
                .expect("the job's step action")
        }
    };
    let left = rt.jobs().start("batch", json!({})).await.unwrap();
    for manual_fail in [false, true] {
        let job = rt.jobs().start("batch", json!({})).await.unwrap();
        let step = step_of(job).await;
        assert_eq!(step.status, ActionStatus::Pending);
        if manual_fail {
            rt.jobs().manual_fail(job, None).await.unwrap();
        } else {
            rt.jobs().cancel(job).await.unwrap();
        }
        let after = rt.queue().get(step.id).await.unwrap();
        assert_eq!(
            after.status,
            ActionStatus::Canceled,
            "the stopped job's queued step action (manual fail: {manual_fail})"
        );
        let logs = rt.queue().logs(step.id).await.unwrap();
        assert!(
            logs.iter().any(|l| l.event == "canceled"
                && l.detail.as_deref() == Some(format!("job {job} finished").as_str())),
            "{logs:?}"
        );
    }
    assert_eq!(step_of(left).await.status, ActionStatus::Pending);
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(left).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}
