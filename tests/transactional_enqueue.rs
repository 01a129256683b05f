//! Transactional enqueue (Q9): an action enqueued inside the caller's transaction exists only
//! if the caller commits.

use chrono::Utc;
use dockhand::store::mysql::MySqlStore;
use dockhand::store::sqlite::SqliteStore;
use dockhand::store::Store;
use dockhand::ActionSpec;
use serde_json::json;
use std::io::Write;

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

#[tokio::test]
async fn mysql_enqueue_in_callers_transaction_commits_or_rolls_back_with_it() {
    let Some(base) = std::env::var("DOCKHAND_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: MySQL/MariaDB transactional enqueue test (set DOCKHAND_TEST_MYSQL_URL to run it)"
        );
        return;
    };
    let name = format!("dh_{}", uuid::Uuid::new_v4().simple());
    MySqlStore::create_database(&base, &name).await.unwrap();
    let options = MySqlStore::url_for_database(&base, &name).unwrap();
    let store = MySqlStore::connect_with(options, 4).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE orders (id BIGINT PRIMARY KEY, total BIGINT NOT NULL) ENGINE=InnoDB")
        .execute(store.pool())
        .await
        .unwrap();
    let now = Utc::now();
    let action = ActionSpec::new("order.confirm", json!({"order": 1}))
        .unique()
        .prepare(now)
        .unwrap();

    // Rolled back: neither the order nor the action (nor its unique key) exists.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, total) VALUES (1, 10)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = MySqlStore::enqueue_in(&mut tx, &action, now).await.unwrap();
    assert!(e.inserted);
    tx.rollback().await.unwrap();
    assert!(store.get(e.id).await.unwrap().is_none());

    // Committed: both exist; a second enqueue in another transaction finds the same action.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, total) VALUES (1, 10)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = MySqlStore::enqueue_in(&mut tx, &action, now).await.unwrap();
    tx.commit().await.unwrap();
    store.notify();
    let a = store.get(e.id).await.unwrap().expect("committed action");
    assert_eq!(a.hook, "order.confirm");
    let mut tx = store.pool().begin().await.unwrap();
    let again = MySqlStore::enqueue_in(&mut tx, &action, now).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!((again.id, again.inserted), (e.id, false));
    store.close().await;
    MySqlStore::drop_database(&base, &name).await.unwrap();
}
