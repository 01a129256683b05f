//! The enqueue connection (`direct`) and the hot path on it (`hot`): writes that find the
//! file's write lock held by another connection wait for it on the connection's thread instead
//! of failing; a caller dropped while its write waits there leaves the writer usable; a closed
//! store refuses; claims that come back full move the hot path to the thread.

use super::SqliteStore;
use crate::store::{ClaimRequest, Finish, FinishResult, Store};
use chrono::Utc;
use std::sync::atomic::Ordering;
use std::time::Duration;

async fn store() -> (tempfile::TempDir, std::path::PathBuf, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let store = SqliteStore::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (dir, path, store)
}

fn action(n: i64) -> crate::action::PreparedAction {
    crate::ActionSpec::new("h", serde_json::json!({ "n": n }))
        .prepare(Utc::now())
        .unwrap()
}

fn req(limit: i64) -> ClaimRequest<'static> {
    let now = Utc::now();
    ClaimRequest {
        owner: "w",
        limit,
        now,
        lease_until: now + chrono::Duration::seconds(60),
        hooks: None,
        routing: None,
    }
}

/// Another connection holding the file's write lock (`BEGIN IMMEDIATE`).
fn hold_write_lock(path: &std::path::Path) -> rusqlite::Connection {
    let holder = rusqlite::Connection::open(path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    holder
}

/// Still waiting after a while: an inline attempt that found the lock taken did not fail.
async fn still_waiting<F: std::future::Future>(f: std::pin::Pin<&mut F>) {
    assert!(
        tokio::time::timeout(Duration::from_millis(200), f)
            .await
            .is_err(),
        "the write did not wait for the lock"
    );
}

/// Runs `write` (not yet polled) while another connection holds the file's write lock: it
/// must wait rather than fail; then the holder ends its transaction with `release` and the
/// write's result is returned.
async fn while_locked<F: std::future::Future>(
    path: &std::path::Path,
    release: &str,
    write: F,
) -> F::Output {
    let holder = hold_write_lock(path);
    tokio::pin!(write);
    still_waiting(write.as_mut()).await;
    holder.execute_batch(release).unwrap();
    write.await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_writes_wait_for_a_write_lock_held_elsewhere() {
    let (_dir, path, store) = store().await;
    // A shallow queue: every hot write tries inline first.
    assert!(store.queue_shallow.load(Ordering::Relaxed));

    let first = action(1);
    let id = while_locked(&path, "COMMIT", store.enqueue(&first, Utc::now()))
        .await
        .expect("the enqueue waited for the lock")
        .id;

    let request = req(5);
    let claimed = while_locked(&path, "ROLLBACK", store.claim(&request))
        .await
        .expect("the claim waited for the lock");
    assert_eq!(claimed.iter().map(|a| a.id).collect::<Vec<_>>(), [id]);

    let items = [(claimed[0].lease(), Finish::Complete)];
    assert_eq!(
        while_locked(&path, "COMMIT", store.finish_many(&items, Utc::now()))
            .await
            .expect("the completion waited for the lock"),
        [FinishResult::Applied]
    );
    let row = store.get(id).await.unwrap().unwrap();
    assert_eq!(row.status, crate::ActionStatus::Complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_while_its_write_waits_leaves_the_writer_usable() {
    let (_dir, path, store) = store().await;
    let holder = hold_write_lock(&path);
    let first = action(1);
    {
        let enqueue = store.enqueue(&first, Utc::now());
        tokio::pin!(enqueue);
        still_waiting(enqueue.as_mut()).await;
        // Dropped here, its job still queued on the connection's thread.
    }
    holder.execute_batch("COMMIT").unwrap();
    // The dropped caller's job ran once the lock was free; the writer then takes the next.
    let id = store.enqueue(&action(2), Utc::now()).await.unwrap().id;
    let mut claimed: Vec<i64> = store
        .claim(&req(10))
        .await
        .unwrap()
        .iter()
        .map(|a| a.id)
        .collect();
    claimed.sort();
    assert_eq!(
        claimed,
        [id - 1, id],
        "both enqueues are committed, once each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_come_back_full_move_the_hot_path_to_the_thread() {
    let (_dir, _path, store) = store().await;
    for n in 0..3 {
        store.enqueue(&action(n), Utc::now()).await.unwrap();
    }
    assert_eq!(store.claim(&req(2)).await.unwrap().len(), 2);
    assert!(
        !store.queue_shallow.load(Ordering::Relaxed),
        "a full claim: a deep queue"
    );
    assert_eq!(store.claim(&req(2)).await.unwrap().len(), 1);
    assert!(
        store.queue_shallow.load(Ordering::Relaxed),
        "a short claim: a shallow queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_store_refuses_enqueues() {
    let (_dir, _path, store) = store().await;
    store.close().await;
    let e = store
        .enqueue(&action(1), Utc::now())
        .await
        .expect_err("a closed store takes no enqueue");
    assert!(e.to_string().contains("enqueue"), "{e}");
}
