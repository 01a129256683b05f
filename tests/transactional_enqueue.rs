//! Transactional enqueue (Q9): an action enqueued inside the caller's transaction exists only
//! if the caller commits.

use chrono::Utc;
use dockhand::store::sqlite::SqliteStore;
use dockhand::store::Store;
use dockhand::ActionSpec;
use serde_json::json;

#[tokio::test]
async fn sqlite_enqueue_in_callers_transaction_commits_or_rolls_back_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("tx.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let now = Utc::now();
    let action = ActionSpec::new("order.confirm", json!({"order": 1}))
        .prepare(now)
        .unwrap();

    // Rolled back: neither the order nor the action exists.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, total) VALUES (1, 10)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = SqliteStore::enqueue_in(&mut tx, &action, now)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(store.get(e.id).await.unwrap().is_none());

    // Committed: both exist.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, total) VALUES (1, 10)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = SqliteStore::enqueue_in(&mut tx, &action, now)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    store.notify();
    let a = store.get(e.id).await.unwrap().expect("committed action");
    assert_eq!(a.hook, "order.confirm");
}
