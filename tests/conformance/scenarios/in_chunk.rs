//! Children run by their chunk (`Pipeline::children_in_chunk`, issue 16 W4): the chunk action
//! creates its children with their step actions leased to its runner and runs their steps
//! itself. Each child still ends through its own step action and the bridge; a failed step is
//! written back as a runner writes it (retried by any runner, attempt counted), a fatal one
//! fails its job, and a child whose result could not be written is handed back by the reaper
//! once its lease lapses.

use super::batches::{actions, assert_clean, batch_pipeline, children, item, ok_child, runtime};
use crate::harness::TestDb;
use dockhand::batch::{WorklistPending, CHUNK_HOOK};
use dockhand::claims::ClaimStatus;
use dockhand::jobs::STEP_HOOK;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::{ActionStatus, Clock, DynStore, HandlerError, JobStatus, Pipeline, StepOutput};
use serde_json::json;

/// `batch` with `n` items in chunks of `chunk`, children run in their chunk; the child of
/// item `bad` fails (fatally when `fatal`, else retryably on its first attempt only).
fn pipeline(n: usize, chunk: u32, bad: i64, fatal: bool) -> Pipeline {
    Pipeline::new("batch")
        .step("split", move |ctx| super::batches::split_items(ctx, n))
        .step("child", move |ctx| async move {
            let i = ctx.input()["i"].as_i64().unwrap_or(-1);
            match (i == bad, fatal) {
                (true, true) => Err(HandlerError::fatal("bad item")),
                (true, false) if ctx.attempt == 1 => Err(HandlerError::retry("first try fails")),
                _ => Ok(StepOutput::one(json!({}))),
            }
        })
        .chunk_size(chunk)
        .children_in_chunk(4)
}

/// The step actions of `rt`'s children, by status.
async fn step_statuses(rt: &dockhand::Runtime) -> Vec<(ActionStatus, i32)> {
    actions(rt, STEP_HOOK)
        .await
        .into_iter()
        .filter(|a| a.args.get("step").and_then(|s| s.as_i64()) == Some(1))
        .map(|a| (a.status, a.attempt))
        .collect()
}

/// One run of the first chunk action completes its 10 children (their step actions complete
/// on their first attempt, no runner claimed them), and the next chunk is already scheduled;
/// the batch then completes with every claim processed and `check` clean.
pub async fn children_in_chunk_run_on_the_chunk_and_the_batch_completes(db: TestDb) {
    let p = batch_pipeline(25, 10, ok_child).children_in_chunk(4);
    let rt = runtime(&db, db.store.clone(), p).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the first chunk alone");
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 10);
    assert!(
        kids.iter().all(|k| k.status == JobStatus::Completed),
        "the chunk ran its children: {:?}",
        kids.iter().map(|k| k.status).collect::<Vec<_>>()
    );
    assert_eq!(
        step_statuses(&rt).await,
        vec![(ActionStatus::Complete, 1); 10],
        "each child's step action completed on its first attempt"
    );
    let chunks = actions(&rt, CHUNK_HOOK).await;
    assert!(
        chunks.iter().any(|a| a.status == ActionStatus::Pending),
        "the next chunk is scheduled"
    );
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 25);
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    for i in 0..25 {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.status, ClaimStatus::Processed, "item {i}");
    }
    assert_eq!(
        db.store.worklist_pending(parent).await.unwrap(),
        Some(WorklistPending::default()),
        "nothing ready or leased once the batch is done"
    );
    assert_clean(&rt).await;
}

/// A child failing (retryably) in its chunk is written back as a runner writes it: its step
/// action pending at its backoff with the attempt counted, the job processing; any runner then
/// runs attempt 2 and the batch completes.
pub async fn a_child_failing_in_its_chunk_is_retried_with_its_attempt_counted(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), pipeline(6, 10, 3, false)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    rt.run_due_once().await.unwrap(); // the chunk and its children
    let kids = children(&rt, parent).await;
    let steps = actions(&rt, STEP_HOOK).await;
    let pending: Vec<_> = steps
        .iter()
        .filter(|a| a.args["step"].as_i64() == Some(1) && a.status == ActionStatus::Pending)
        .collect();
    assert_eq!(pending.len(), 1, "the one failed child's step action waits");
    let a = pending[0];
    assert_eq!(a.attempt, 1, "its attempt is counted");
    let bad = kids
        .iter()
        .find(|k| a.args["job"].as_i64() == Some(k.id))
        .unwrap();
    assert_eq!(bad.status, JobStatus::Processing);
    assert!(a.scheduled_at > db.clock.now(), "retried after its backoff");
    assert_eq!(
        kids.iter()
            .filter(|k| k.status == JobStatus::Completed)
            .count(),
        5
    );
    db.clock.advance(chrono::Duration::minutes(5));
    rt.drain(100).await.unwrap();
    let a = rt.queue().get(a.id).await.unwrap();
    assert_eq!((a.status, a.attempt), (ActionStatus::Complete, 2));
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

/// A fatal step in its chunk fails the step action, and its job through the bridge (its claim
/// released); the others complete and so does the parent.
pub async fn a_fatal_child_in_its_chunk_fails_its_job_through_the_bridge(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), pipeline(5, 10, 2, true)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(100).await.unwrap();
    let kids = children(&rt, parent).await;
    assert_eq!(
        kids.iter()
            .filter(|k| k.status == JobStatus::Failed)
            .count(),
        1,
        "the fatal child failed"
    );
    let c = rt.jobs().claim_state(&item(2)).await.unwrap();
    assert!(
        c.map_or(true, |c| c.status != ClaimStatus::Claimed),
        "the failed child's claim is released"
    );
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!((st.children_completed, st.children_failed), (4, 1));
    assert_clean(&rt).await;
}

/// The chunk cannot write its children's results (the store call fails): the failed child's
/// step action stays leased until its lease lapses, the reaper hands it back (attempt
/// counted), and a runner finishes it; nothing is lost or run twice to success.
pub async fn a_child_result_the_chunk_could_not_write_is_reaped_and_rerun(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone() as DynStore, pipeline(4, 10, 1, false)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    faulty.fail_from("finish_many", 1, FaultMode::FailBefore);
    rt.run_due_once().await.unwrap(); // the chunk; child 1's retry cannot be written
    faulty.heal();
    let a = actions(&rt, STEP_HOOK)
        .await
        .into_iter()
        .find(|a| a.args["step"].as_i64() == Some(1) && a.status != ActionStatus::Complete)
        .expect("the failed child's step action");
    assert_eq!(
        a.status,
        ActionStatus::Running,
        "still leased: only the lapse hands it back"
    );
    db.clock.advance(chrono::Duration::minutes(10));
    rt.drain(100).await.unwrap();
    let a = rt.queue().get(a.id).await.unwrap();
    assert_eq!(a.status, ActionStatus::Complete);
    assert_eq!(a.attempt, 2, "the lapsed run counted as an attempt");
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

/// Children that reach their finish at different times (one sleeps well past the chunk's
/// finish wait) are all finished: the ones waiting are written without the slow one, which
/// is written when it arrives.
pub async fn children_in_chunk_ending_apart_are_all_finished(db: TestDb) {
    let p = Pipeline::new("batch")
        .step("split", move |ctx| super::batches::split_items(ctx, 6))
        .step("child", move |ctx| async move {
            if ctx.input()["i"].as_i64() == Some(0) {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Ok(StepOutput::one(json!({})))
        })
        .chunk_size(10)
        .children_in_chunk(6);
    let rt = runtime(&db, db.store.clone(), p).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    rt.run_due_once().await.unwrap(); // the chunk and its children
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 6);
    assert!(
        kids.iter().all(|k| k.status == JobStatus::Completed),
        "every child finished in its chunk run: {:?}",
        kids.iter().map(|k| k.status).collect::<Vec<_>>()
    );
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}

/// `Pipeline::chunk_lanes(3)`: the first chunk starts lanes 2 and 3 (offsets one and two
/// chunks on) besides its own next chunk (three chunks on), so three chunk actions wait at
/// once; the lanes lease disjoint rows and the batch completes with every child created once,
/// every claim processed and `check` clean (here with the children run in their chunks, as W4
/// runs them on the server backends).
pub async fn chunk_lanes_run_side_by_side_and_the_batch_completes(db: TestDb) {
    let p = batch_pipeline(25, 5, ok_child)
        .children_in_chunk(4)
        .chunk_lanes(3);
    let rt = runtime(&db, db.store.clone(), p).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the first chunk alone");
    let mut waiting: Vec<i64> = actions(&rt, CHUNK_HOOK)
        .await
        .into_iter()
        .filter(|a| a.status == ActionStatus::Pending)
        .filter_map(|a| a.args.get("offset").and_then(|o| o.as_i64()))
        .collect();
    waiting.sort_unstable();
    assert_eq!(
        waiting,
        vec![5, 10, 15],
        "two more lanes and the first lane's next"
    );
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 25, "one child per item");
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    for i in 0..25 {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.status, ClaimStatus::Processed, "item {i}");
    }
    assert_clean(&rt).await;
}

/// Children whose group has a limit are not run by their chunk: the chunk creates them pending
/// with their step actions pending (a limited group's actions are claimed by runners, under
/// the limit), and the runners then run them and the batch completes.
pub async fn children_of_a_limited_group_are_left_to_the_runners(db: TestDb) {
    let limit = dockhand::GroupLimit {
        concurrency: Some(8),
        rate: None,
    };
    assert!(db
        .queue()
        .set_group_limit(&dockhand::jobs::StepAction::group_for("batch"), limit)
        .await
        .unwrap());
    let p = batch_pipeline(4, 10, ok_child).children_in_chunk(4);
    let rt = runtime(&db, db.store.clone(), p).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the chunk");
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 4);
    assert!(
        kids.iter().all(|k| k.status == JobStatus::Pending),
        "not started by the chunk: {:?}",
        kids.iter().map(|k| k.status).collect::<Vec<_>>()
    );
    assert_eq!(
        step_statuses(&rt).await,
        vec![(ActionStatus::Pending, 0); 4],
        "left pending for the runners"
    );
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_eq!(
        step_statuses(&rt).await,
        vec![(ActionStatus::Complete, 1); 4]
    );
    assert_clean(&rt).await;
}
