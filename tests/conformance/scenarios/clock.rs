//! The database clock (RELIABILITY.md §2, skewed clock): a runtime on a host whose clock is
//! off still reads time as the database does, so it never reaps a live lease early.

use crate::harness::TestDb;
use dockhand::store::ClaimRequest;
use dockhand::{ActionSpec, ActionStatus, Clock, DatabaseClock, OffsetClock, Runtime, SystemClock};
use serde_json::json;
use std::sync::Arc;

/// A clock ten minutes ahead of the real one.
fn ahead() -> Arc<dyn Clock> {
    Arc::new(OffsetClock::new(
        Arc::new(SystemClock),
        chrono::Duration::minutes(10),
    ))
}

pub async fn db_clock_corrects_a_skewed_host(db: TestDb) {
    let clock = DatabaseClock::new(ahead());
    let offset = clock.sync(db.store.as_ref()).await.unwrap();
    assert!(
        (offset + chrono::Duration::minutes(10)).num_seconds().abs() < 5,
        "the measured offset cancels the skew: {offset}"
    );
    let db_now = db.store.database_now().await.unwrap();
    let diff = (clock.now() - db_now).num_milliseconds().abs();
    assert!(diff < 5_000, "reads the database's time (off by {diff} ms)");
}

/// Another worker holds a 30-second lease (by the database's clock). A runtime whose host is
/// ten minutes ahead must not reap it with the database clock, and would without it.
pub async fn skewed_host_never_reaps_a_live_lease(db: TestDb) {
    let now = db.store.database_now().await.unwrap();
    let q = dockhand::Queue::new(db.store.clone());
    q.enqueue(ActionSpec::new("clock.held", json!({})))
        .await
        .unwrap();
    let claimed = db
        .store
        .claim(&ClaimRequest {
            owner: "honest-worker",
            limit: 1,
            now: now + chrono::Duration::seconds(1),
            lease_until: now + chrono::Duration::seconds(30),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let id = claimed[0].id;
    let corrected = Runtime::with_store(db.store.clone())
        .database_clock(ahead())
        .migrate(false)
        .build()
        .await
        .unwrap();
    corrected.run_maintenance_once().await.unwrap();
    let a = db.store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (a.status, a.lease_owner.as_deref()),
        (ActionStatus::Running, Some("honest-worker")),
        "the lease is live by the database's clock"
    );
    // Sensitivity: the same host reading its own clock reaps the live lease.
    let uncorrected = Runtime::with_store(db.store.clone())
        .clock(ahead())
        .migrate(false)
        .build()
        .await
        .unwrap();
    uncorrected.run_maintenance_once().await.unwrap();
    let a = db.store.get(id).await.unwrap().unwrap();
    assert_ne!(
        a.lease_owner.as_deref(),
        Some("honest-worker"),
        "a skewed local clock would have reaped it (the guard is what keeps it)"
    );
}
