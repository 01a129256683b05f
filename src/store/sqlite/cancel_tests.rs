//! A write transaction's begin cancelled at each of its await points leaves the single writer
//! connection usable: no transaction left open on it, later writes commit.

use super::SqliteStore;
use crate::store::Store;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use tokio::sync::Notify;

struct Woken(Notify);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_write_cancelled_at_any_await_leaves_the_writer_usable() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let woken = Arc::new(Woken(Notify::new()));
    let waker = Waker::from(woken.clone());
    // Cancel after the k-th time the begin waits (k = 0: at its first wait), until a begin
    // finishes before its k-th wait.
    for k in 0.. {
        let mut begin = Box::pin(store.begin_write("cancelled"));
        let mut waits = 0;
        let finished = loop {
            match begin.as_mut().poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(r) => break Some(r),
                Poll::Pending if waits == k => break None,
                Poll::Pending => {
                    waits += 1;
                    woken.0.notified().await;
                }
            }
        };
        drop(begin);
        // A begin that finished hands its transaction back before the next begin.
        let finished = finished.map(|r| r.map(drop));
        let tx = store
            .begin_write("after")
            .await
            .unwrap_or_else(|e| panic!("begin after a begin cancelled at wait {k}: {e}"));
        drop(tx);
        // A write outside any transaction commits (it did not join a leaked one): a reader
        // connection sees it.
        let now = chrono::Utc::now();
        let action = crate::ActionSpec::new("h", serde_json::json!({ "k": k }))
            .prepare(now)
            .unwrap();
        let id = store.enqueue(&action, now).await.unwrap().id;
        assert!(
            store.get(id).await.unwrap().is_some(),
            "an enqueue after a begin cancelled at wait {k} is not committed"
        );
        if let Some(r) = finished {
            r.unwrap();
            break;
        }
        assert!(k < 100, "the begin never finished");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_transaction_dropped_uncommitted_rolls_back_and_gives_up_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let mut tx = store.begin_write("dropped").await.unwrap();
    sqlx::query(
        "INSERT INTO dockhand_group_pauses (group_name, paused_at, paused_by) VALUES ('g', 0, 't')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    drop(tx);
    // Another connection to the file (the callers' pool) gets the write lock without the
    // store writing again: the rollback ran on its own.
    let mut other = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let paused: i64 = sqlx::query_scalar("SELECT count(*) FROM dockhand_group_pauses")
        .fetch_one(&mut *other)
        .await
        .unwrap();
    assert_eq!(paused, 0, "the dropped transaction's insert is not visible");
    other.rollback().await.unwrap();
    // The store's writer is clean: an autocommit write lands.
    assert!(store
        .set_group_paused("h", true, "t", chrono::Utc::now())
        .await
        .unwrap());
    assert_eq!(store.paused_groups().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cancelled_inside_a_transaction_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let woken = Arc::new(Woken(Notify::new()));
    let waker = Waker::from(woken.clone());
    {
        let store = &store;
        let mut write = Box::pin(async move {
            let mut tx = store.begin_write("cancelled").await?;
            sqlx::query("INSERT INTO dockhand_group_pauses (group_name, paused_at, paused_by) VALUES ('g', 0, 't')")
                .execute(&mut *tx)
                .await
                .map_err(crate::error::Error::db("insert"))?;
            std::future::pending::<()>().await;
            tx.commit().await.map_err(crate::error::Error::db("commit"))
        });
        // Poll until it parks after its insert (never finishes), then drop it.
        for _ in 0..1000 {
            assert!(write
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            if tokio::time::timeout(std::time::Duration::from_millis(50), woken.0.notified())
                .await
                .is_err()
            {
                break;
            }
        }
    }
    assert!(store
        .set_group_paused("h", true, "t", chrono::Utc::now())
        .await
        .unwrap());
    let groups: Vec<String> = store
        .paused_groups()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.group)
        .collect();
    assert_eq!(
        groups,
        ["h"],
        "the cancelled transaction's insert was rolled back"
    );
}
