//! Lifecycle events and runtimes with different hooks (J5, `dockhand::jobs::listeners`): a
//! runtime that registers no lifecycle hook never marks an event delivered while another
//! runtime that listens holds the listeners' lease, and marks them (or writes its step runs'
//! events delivered) once no one listens.

use super::batches::{batch_pipeline, ok_child, runtime};
use crate::harness::TestDb;
use dockhand::jobs::listeners::listener_ttl;
use dockhand::{JobStatus, Runtime};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Runs a batch of pipeline `batch` on `rt` to its end, after releasing the items an earlier
/// batch claimed; returns the parent.
pub(super) async fn run_batch(db: &TestDb, rt: &Runtime) -> i64 {
    // The items of an earlier batch are released to this one's split.
    db.exec_sql("DELETE FROM dockhand_item_claims").await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    for _ in 0..20 {
        if rt.jobs().get(parent).await.unwrap().status.is_final() {
            break;
        }
        rt.run_due_once().await.unwrap();
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    parent
}

/// (events, undelivered events) of `parent` and its children.
async fn events(db: &TestDb, parent: i64) -> Vec<i64> {
    let of = format!(
        "FROM dockhand_job_events e JOIN dockhand_jobs j ON j.id = e.job_id
         WHERE (j.parent_id = {parent} OR j.id = {parent})"
    );
    db.count_all(&[
        &format!("SELECT COUNT(*) {of}"),
        &format!("SELECT COUNT(*) {of} AND e.delivered_at IS NULL"),
    ])
    .await
}

/// A runtime that listens: its `on_job_finished` counts the events it hears in `heard`.
async fn listening_runtime(db: &TestDb, heard: Arc<AtomicUsize>) -> Runtime {
    db.runtime()
        .pipeline(batch_pipeline(4, 10, ok_child))
        .on_job_finished(move |_ev| {
            heard.fetch_add(1, Ordering::SeqCst);
            async {}
        })
        .build()
        .await
        .unwrap()
}

/// A listening runtime (with `on_job_finished`) and a silent one share the database. The
/// silent one runs a batch: its children's events are written undelivered, and its own sweep
/// leaves them; the listener's sweep delivers each once. When the listener's lease has lapsed
/// (it stopped for longer than the TTL), the silent runtime's step runs write their events
/// delivered, and its sweep marks the parent's.
pub async fn a_runtime_without_hooks_leaves_events_to_a_listening_runtime(db: TestDb) {
    let heard = Arc::new(AtomicUsize::new(0));
    let listener = listening_runtime(&db, heard.clone()).await;
    let silent = runtime(&db, db.store.clone(), batch_pipeline(4, 10, ok_child)).await;

    let parent = run_batch(&db, &silent).await;
    assert_eq!(
        events(&db, parent).await,
        vec![5, 5],
        "the children's and the parent's events wait for the listener"
    );
    silent.run_maintenance_once().await.unwrap();
    assert_eq!(
        events(&db, parent).await,
        vec![5, 5],
        "the silent sweep leaves them"
    );
    listener.run_maintenance_once().await.unwrap();
    assert_eq!(events(&db, parent).await, vec![5, 0]);
    assert_eq!(heard.load(Ordering::SeqCst), 5, "each event heard once");

    // The listener stops for longer than its lease: no one listens any more.
    drop(listener);
    db.clock
        .advance(listener_ttl() + chrono::Duration::minutes(1));
    silent.run_maintenance_once().await.unwrap();
    let parent = run_batch(&db, &silent).await;
    assert_eq!(
        events(&db, parent).await,
        vec![5, 1],
        "the children's events are written delivered; the parent's waits for the sweep"
    );
    silent.run_maintenance_once().await.unwrap();
    assert_eq!(events(&db, parent).await, vec![5, 0]);
    assert_eq!(heard.load(Ordering::SeqCst), 5, "nothing more was heard");
}

/// A listener that starts after a silent runtime last read the listeners' lease (the silent
/// runtime's view says no one listens, up to a maintenance tick old) still hears that runtime's
/// events: its step runs' finishes and its sweep read the lease in the statements that would
/// write the events delivered, and leave them undelivered.
pub async fn a_listener_that_starts_after_a_silent_runtime_looked_hears_its_events(db: TestDb) {
    let silent = runtime(&db, db.store.clone(), batch_pipeline(4, 10, ok_child)).await;
    silent.run_maintenance_once().await.unwrap();
    let heard = Arc::new(AtomicUsize::new(0));
    let listener = listening_runtime(&db, heard.clone()).await;
    // The silent runtime has not read the lease since the listener took it.
    let parent = run_batch(&db, &silent).await;
    assert_eq!(
        events(&db, parent).await,
        vec![5, 5],
        "the step runs' finishes leave the events undelivered"
    );
    silent.jobs().deliver_events().await.unwrap();
    assert_eq!(
        events(&db, parent).await,
        vec![5, 5],
        "the silent sweep marks none of them"
    );
    listener.run_maintenance_once().await.unwrap();
    assert_eq!(events(&db, parent).await, vec![5, 0]);
    assert_eq!(heard.load(Ordering::SeqCst), 5, "each event heard once");
}
