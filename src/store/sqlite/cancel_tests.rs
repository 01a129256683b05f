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
