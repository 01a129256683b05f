//! Batch regressions found by chaos runs (docs/RELIABILITY.md §2): chunk deliveries that died,
//! froze, or came back after losing their action lease.

use super::batches::{actions, assert_clean, batch_pipeline, children, ok_child, runtime};
use crate::harness::TestDb;
use dockhand::batch::{RowSettle, CHUNK_HOOK};
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::store::{ClaimRequest, Lease};
use dockhand::{ActionSpec, ActionStatus, Clock, Error, JobStatus};
use serde_json::json;

/// Drains `rounds` times, 3 s of clock apart (retries and snoozes come due).
pub(super) async fn drain_rounds(rt: &dockhand::Runtime, db: &TestDb, rounds: usize) {
    for _ in 0..rounds {
        rt.drain(1000).await.unwrap();
        db.clock.advance(chrono::Duration::seconds(3));
    }
}

/// The batch finished: `n` children, the parent completed without a reason, `check` clean.
async fn assert_batch_completed(rt: &dockhand::Runtime, parent: i64, n: usize) {
    assert_eq!(
        children(rt, parent).await.len(),
        n,
        "every row became a child"
    );
    let p = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (p.status, p.reason.as_deref()),
        (JobStatus::Completed, None),
        "the parent is not stranded or failed"
    );
    assert_clean(rt).await;
}

/// Claims the one due action of `hook` as a worker would, with a lease of `lease`. Like a
/// worker, it polls: on MySQL/MariaDB the claim skips locked rows, and under load (CI runs the
/// backends' suites side by side) the due row was seen skipped for one 25 ms poll right after
/// the transaction that enqueued it had committed (a lock still held by another of the test's
/// connections; see docs/STATUS.md). The clock does not move between polls.
pub(super) async fn claim_as_worker(db: &TestDb, hook: &str, lease: chrono::Duration) -> Lease {
    let now = db.clock.now();
    let hooks = [hook.to_string()];
    for _ in 0..100 {
        let got = db
            .store
            .claim(&ClaimRequest {
                owner: "frozen-worker",
                limit: 1,
                now,
                lease_until: now + lease,
                hooks: Some(&hooks),
                routing: None,
            })
            .await
            .unwrap();
        assert!(got.len() <= 1, "a claim of one returned {}", got.len());
        if let Some(a) = got.first() {
            return a.lease();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("no `{hook}` action became claimable within 2 s");
}

/// Chaos-run regression (seed 1, SQLite): a chunk delivery died after leasing its rows; the
/// re-delivery of the same chunk action must take those rows back at once, not leave them to
/// the 5-minute row lease while it completes (which stranded the parent in `processing`).
pub async fn regression_chunk_redelivery_takes_back_its_own_rows(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    // The first delivery leased rows 0..3 under its action lease, then its worker died.
    let first = claim_as_worker(&db, CHUNK_HOOK, chrono::Duration::seconds(30)).await;
    let now = db.clock.now();
    let leased = db
        .store
        .lease_work(parent, 3, first, now + chrono::Duration::minutes(5), now)
        .await
        .unwrap();
    assert_eq!(leased.len(), 3);
    // Its action lease runs out; the reaper re-delivers it well inside the row lease.
    db.clock.advance(chrono::Duration::seconds(31));
    drain_rounds(&rt, &db, 5).await;
    assert_batch_completed(&rt, parent, 6).await;
}

/// Rows held by another chunk run whose worker froze with its lease still live: the chunk
/// action that finds them leased must stay as a wake-up (snooze) until they come free, never
/// complete and leave the parent with nothing to move it.
pub async fn regression_rows_held_by_a_dead_chunk_leave_a_wake_up(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    // A run that outlives this test holds two rows (its hook has no handler, so only this
    // test ever claims it).
    db.queue()
        .enqueue(ActionSpec::new("test.frozen_chunk", json!({})))
        .await
        .unwrap();
    let holder = claim_as_worker(&db, "test.frozen_chunk", chrono::Duration::days(1)).await;
    let now = db.clock.now();
    db.store
        .lease_work(parent, 2, holder, now + chrono::Duration::minutes(5), now)
        .await
        .unwrap();
    rt.drain(1000).await.unwrap();
    assert_eq!(children(&rt, parent).await.len(), 4, "the free rows");
    let pending: Vec<_> = actions(&rt, CHUNK_HOOK)
        .await
        .into_iter()
        .filter(|a| a.status == ActionStatus::Pending)
        .collect();
    assert_eq!(pending.len(), 1, "a chunk action waits for the held rows");
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Processing
    );
    // Past the row lease the waiting chunk takes the rows over.
    db.clock.advance(chrono::Duration::minutes(6));
    drain_rounds(&rt, &db, 3).await;
    assert_batch_completed(&rt, parent, 6).await;
}

/// Chaos-run regression (seed 229593118, PostgreSQL): a chunk run lost its action lease (the
/// reaper expired it while its worker was frozen) and a newer attempt took the chunk over.
/// When the stale run woke up, its lease and settle calls must be refused with `LeaseLost`
/// and change nothing. Before the fence it leased the next chunk's rows under the shared
/// owner name for 5 minutes: that chunk snoozed, the parent stayed `processing` and an item
/// claim stayed held.
pub async fn regression_stale_chunk_run_leases_and_settles_nothing(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    let stale = claim_as_worker(&db, CHUNK_HOOK, chrono::Duration::seconds(30)).await;
    // Its worker freezes; the lease runs out and the reaper takes the action back.
    db.clock.advance(chrono::Duration::seconds(31));
    rt.run_maintenance_once().await.unwrap();
    let chunk = actions(&rt, CHUNK_HOOK).await;
    assert_eq!(chunk[0].status, ActionStatus::Pending, "reaped");
    let now = db.clock.now();
    let until = now + chrono::Duration::minutes(5);
    let refused = |r: Result<_, Error>, what: &str| match r {
        Err(Error::LeaseLost { action_id, token }) => {
            assert_eq!((action_id, token), (stale.id, stale.token), "{what}");
        }
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    };
    refused(
        db.store
            .lease_work(parent, 3, stale, until, now)
            .await
            .map(|_| ()),
        "lease after the reaper",
    );
    // A newer attempt claims the chunk; the stale token stays refused.
    let live = claim_as_worker(&db, CHUNK_HOOK, chrono::Duration::minutes(1)).await;
    assert_eq!(live.id, stale.id);
    assert!(live.token > stale.token, "a new fencing token");
    refused(
        db.store
            .lease_work(parent, 3, stale, until, now)
            .await
            .map(|_| ()),
        "lease beside a newer attempt",
    );
    let discard = RowSettle::Discard {
        reason: "stale".into(),
    };
    refused(
        db.store.settle_work(parent, 0, stale, &discard, now).await,
        "settle beside a newer attempt",
    );
    let st = db.store.batch_state(parent).await.unwrap().unwrap();
    assert_eq!((st.ready, st.leased), (6, 0), "the stale run took no row");
    // The live attempt's own calls go through.
    let rows = db
        .store
        .lease_work(parent, 3, live, until, now)
        .await
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.idx).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Its worker dies too; the next delivery finishes the batch with every claim settled.
    db.clock.advance(chrono::Duration::minutes(2));
    drain_rounds(&rt, &db, 5).await;
    assert_batch_completed(&rt, parent, 6).await;
}

/// Chaos-run regression (seed 186574116, MariaDB): a split step's fan-out committed, but its
/// worker died before the step action's finish was written. The reaper re-delivered the step
/// while the first chunk's children held the items; the re-run split could not claim them,
/// emitted fewer packets, and its fan-out was rejected as "another contract": the job failed
/// `step_failed` and its items were never processed. A re-delivered step whose fan-out is
/// committed must not run again: the batch drives the job from there.
pub async fn regression_split_redelivered_after_its_fan_out_does_not_fail_the_job(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(6, 3, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    // The split step runs and fans out; writing its finish fails, so it stays running.
    faulty.fail_nth("finish", 1, FaultMode::FailBefore);
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    assert_eq!(faulty.injected(), 1, "the split step's finish was lost");
    // The first chunk hands items 0..3 to children.
    rt.run_due_once().await.unwrap();
    assert_eq!(children(&rt, parent).await.len(), 3);
    // The split's lease runs out; the reaper re-delivers it beside the rest.
    db.clock.advance(chrono::Duration::minutes(10));
    drain_rounds(&rt, &db, 5).await;
    assert_batch_completed(&rt, parent, 6).await;
}
