//! Store method coverage: heartbeats, snooze/release, cancel, retry, claim order, maintenance
//! leases, stats and logs.

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::store::{ClaimRequest, ClaimedAction, Finish, FinishResult};
use dockhand::Clock;
use dockhand::{ActionSpec, ActionStatus};
use serde_json::json;

/// Claims up to `limit` due actions for `owner` at the test clock's now, leased for `lease`.
pub(super) async fn claim(
    db: &TestDb,
    owner: &str,
    limit: i64,
    lease: Duration,
) -> Vec<ClaimedAction> {
    let now = db.clock.now();
    db.store
        .claim(&ClaimRequest {
            owner,
            limit,
            now,
            lease_until: now + lease,
            hooks: None,
            routing: None,
        })
        .await
        .unwrap()
}

pub async fn store_heartbeat_extends_only_live_leases(db: TestDb) {
    let q = db.queue();
    q.enqueue(ActionSpec::new("h", json!(1))).await.unwrap();
    q.enqueue(ActionSpec::new("h", json!(2))).await.unwrap();
    let c = claim(&db, "me", 2, Duration::seconds(30)).await;
    assert_eq!(c.len(), 2);
    let until = db.clock.now() + Duration::seconds(90);
    let mut stale = c[1].lease();
    stale.token += 100;
    let n = db
        .store
        .heartbeat("me", &[c[0].lease(), stale], until)
        .await
        .unwrap();
    assert_eq!(n, 1, "a wrong token is not extended");
    assert_eq!(
        db.store
            .heartbeat("someone-else", &[c[0].lease()], until)
            .await
            .unwrap(),
        0
    );
    assert_eq!(q.get(c[0].id).await.unwrap().lease_until, Some(until));
    assert_eq!(
        q.get(c[1].id).await.unwrap().lease_until,
        Some(db.clock.now() + Duration::seconds(30))
    );
    // A heartbeated lease survives the reaper; the other does not.
    db.clock.advance(Duration::seconds(31));
    let r = db.store.reap_expired(db.clock.now(), 100).await.unwrap();
    assert_eq!(r.requeued, 1);
    assert_eq!(q.get(c[0].id).await.unwrap().status, ActionStatus::Running);
    assert_eq!(q.get(c[1].id).await.unwrap().status, ActionStatus::Pending);
}

pub async fn store_snooze_and_release_do_not_use_attempts(db: TestDb) {
    let q = db.queue();
    let id = q
        .enqueue(ActionSpec::new("h", json!({})).max_attempts(1))
        .await
        .unwrap();
    let c = claim(&db, "me", 1, Duration::seconds(30)).await;
    assert_eq!(c[0].attempt, 1);
    let at = db.clock.now() + Duration::minutes(5);
    assert_eq!(
        db.store
            .finish(c[0].lease(), &Finish::Snooze { at }, db.clock.now())
            .await
            .unwrap(),
        FinishResult::Applied
    );
    let a = q.get(id).await.unwrap();
    assert_eq!(
        (a.status, a.attempt, a.scheduled_at),
        (ActionStatus::Pending, 0, at)
    );
    assert!(
        claim(&db, "me", 1, Duration::seconds(30)).await.is_empty(),
        "not before the snooze ends"
    );
    db.clock.set(at);
    let c = claim(&db, "me", 1, Duration::seconds(30)).await;
    assert_eq!(c[0].attempt, 1, "snooze did not use the only attempt");
    let r = db
        .store
        .finish(c[0].lease(), &Finish::Release, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let a = q.get(id).await.unwrap();
    assert_eq!((a.status, a.attempt), (ActionStatus::Pending, 0));
    let c = claim(&db, "me", 1, Duration::seconds(30)).await;
    assert_eq!(c.len(), 1, "released at once");
    assert!(c[0].token > 2, "every claim gets a new token");
}

pub async fn store_cancel_running_fences_out_the_worker(db: TestDb) {
    let q = db.queue();
    let id = q.enqueue(ActionSpec::new("h", json!({}))).await.unwrap();
    let c = claim(&db, "me", 1, Duration::seconds(30)).await;
    assert!(q.cancel(id).await.unwrap());
    assert!(!q.cancel(id).await.unwrap(), "already final");
    let r = db
        .store
        .finish(c[0].lease(), &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::LeaseLost);
    assert_eq!(q.get(id).await.unwrap().status, ActionStatus::Canceled);
    assert!(q.cancel(987_654).await.is_ok_and(|c| !c));
    assert!(matches!(
        q.get(987_654).await,
        Err(dockhand::Error::NotFound { id: 987_654, .. })
    ));
}

pub async fn store_operator_retry_requeues_failed(db: TestDb) {
    let q = db.queue();
    let id = q
        .enqueue(ActionSpec::new("h", json!({})).unique())
        .await
        .unwrap();
    let c = claim(&db, "me", 1, Duration::seconds(30)).await;
    let r = db
        .store
        .finish(
            c[0].lease(),
            &Finish::Fail {
                error: "broken".into(),
            },
            db.clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    assert!(!q.retry(id + 1000).await.unwrap());
    // While a newer duplicate is active, retry is refused with a clear error.
    let newer = q
        .enqueue(ActionSpec::new("h", json!({})).unique())
        .await
        .unwrap();
    assert_ne!(newer, id);
    let e = q.retry(id).await.unwrap_err().to_string();
    assert!(e.contains("unique key"), "{e}");
    q.cancel(newer).await.unwrap();
    assert!(q.retry(id).await.unwrap());
    let a = q.get(id).await.unwrap();
    assert_eq!((a.status, a.attempt), (ActionStatus::Pending, 0));
    assert!(
        !q.retry(id).await.unwrap(),
        "a pending action is not retried"
    );
}

pub async fn store_claim_order_priority_then_time(db: TestDb) {
    let q = db.queue();
    let t = db.clock.now();
    let late_low = q
        .enqueue(
            ActionSpec::new("h", json!(1))
                .priority(5)
                .at(t - Duration::seconds(1)),
        )
        .await
        .unwrap();
    let early_low = q
        .enqueue(
            ActionSpec::new("h", json!(2))
                .priority(5)
                .at(t - Duration::seconds(9)),
        )
        .await
        .unwrap();
    let high = q
        .enqueue(ActionSpec::new("h", json!(3)).priority(1))
        .await
        .unwrap();
    let default = q.enqueue(ActionSpec::new("h", json!(4))).await.unwrap();
    let future = q
        .enqueue(
            ActionSpec::new("h", json!(5))
                .priority(0)
                .at(t + Duration::seconds(1)),
        )
        .await
        .unwrap();
    let c = claim(&db, "me", 3, Duration::seconds(30)).await;
    // The batch is the first three in (priority, scheduled_at, id) order; within a batch the
    // runner starts them together, so the set is what matters.
    let mut got: Vec<i64> = c.iter().map(|c| c.id).collect();
    got.sort();
    let mut want = vec![high, early_low, late_low];
    want.sort();
    assert_eq!(got, want);
    let c = claim(&db, "me", 0, Duration::seconds(30)).await;
    assert!(c.is_empty());
    let c = claim(&db, "me", 10, Duration::seconds(30)).await;
    assert_eq!(
        c.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![default],
        "future actions wait"
    );
    db.clock.advance(Duration::seconds(1));
    let c = claim(&db, "me", 10, Duration::seconds(30)).await;
    assert_eq!(c[0].id, future);
}

pub async fn store_maintenance_lease_is_exclusive_until_expiry(db: TestDb) {
    let now = db.clock.now();
    let until = now + Duration::seconds(5);
    assert!(db
        .store
        .try_maintenance_lease("reaper", "a", until, now)
        .await
        .unwrap());
    assert!(!db
        .store
        .try_maintenance_lease("reaper", "b", until, now)
        .await
        .unwrap());
    assert!(db
        .store
        .try_maintenance_lease("retention", "b", until, now)
        .await
        .unwrap());
    assert!(
        db.store
            .try_maintenance_lease("reaper", "a", until, now)
            .await
            .unwrap(),
        "holder renews"
    );
    let later = now + Duration::seconds(5);
    assert!(db
        .store
        .try_maintenance_lease("reaper", "b", later + Duration::seconds(5), later)
        .await
        .unwrap());
    // Two racing at once: exactly one wins.
    let other = db.open_another().await;
    let t = later + Duration::seconds(10);
    let (x, y) = tokio::join!(
        db.store.try_maintenance_lease("sched", "x", t, later),
        other.try_maintenance_lease("sched", "y", t, later)
    );
    assert!(x.unwrap() ^ y.unwrap());
}

pub async fn store_stats_counts_and_lag(db: TestDb) {
    let q = db.queue();
    q.enqueue(ActionSpec::new("h", json!(1)).group("g1"))
        .await
        .unwrap();
    q.enqueue(ActionSpec::new("h", json!(2))).await.unwrap();
    q.enqueue(ActionSpec::new("h", json!(3)).after(Duration::hours(1)))
        .await
        .unwrap();
    db.clock.advance(Duration::seconds(42));
    let s = q.stats().await.unwrap();
    assert_eq!(s.by_status.get("pending"), Some(&3));
    assert_eq!(s.past_due, 2);
    assert_eq!(s.oldest_due_lag_ms, Some(42_000));
    assert_eq!(
        s.by_group.get("g1").and_then(|g| g.get("pending")),
        Some(&1)
    );
    assert_eq!(s.by_group.get("").and_then(|g| g.get("pending")), Some(&2));
}

pub async fn store_logs_record_the_lifecycle(db: TestDb) {
    let q = db.queue();
    let id = q.enqueue(ActionSpec::new("h", json!({}))).await.unwrap();
    let c = claim(&db, "worker-7", 1, Duration::seconds(30)).await;
    let r = db
        .store
        .finish(
            c[0].lease(),
            &Finish::Retry {
                at: db.clock.now(),
                error: "flaky".into(),
            },
            db.clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let c = claim(&db, "worker-8", 1, Duration::seconds(30)).await;
    let r = db
        .store
        .finish(c[0].lease(), &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let logs = q.logs(id).await.unwrap();
    let events: Vec<&str> = logs.iter().map(|l| l.event.as_str()).collect();
    assert_eq!(
        events,
        vec!["created", "started", "retry", "started", "completed"]
    );
    assert_eq!(logs[1].detail.as_deref(), Some("worker-7"));
    assert!(logs[2].detail.as_deref().unwrap().contains("flaky"));
}

pub async fn store_finish_many_guards_each_row(db: TestDb) {
    let q = db.queue();
    for i in 0..4 {
        q.enqueue(ActionSpec::new("h", json!(i))).await.unwrap();
    }
    let c = claim(&db, "me", 4, Duration::seconds(30)).await;
    let mut stale = c[3].lease();
    stale.token += 1;
    let at = db.clock.now() + Duration::minutes(1);
    let items = vec![
        (c[0].lease(), Finish::Complete),
        (c[1].lease(), Finish::Fail { error: "x".into() }),
        (
            c[2].lease(),
            Finish::Retry {
                at,
                error: "y".into(),
            },
        ),
        (stale, Finish::Complete),
    ];
    let r = db.store.finish_many(&items, db.clock.now()).await.unwrap();
    assert_eq!(
        r,
        vec![
            FinishResult::Applied,
            FinishResult::Applied,
            FinishResult::Applied,
            FinishResult::LeaseLost
        ]
    );
    let status = |i: usize| {
        let q = q.clone();
        let id = c[i].id;
        async move { q.get(id).await.unwrap().status }
    };
    assert_eq!(status(0).await, ActionStatus::Complete);
    assert_eq!(status(1).await, ActionStatus::Failed);
    assert_eq!(status(2).await, ActionStatus::Pending);
    assert_eq!(
        status(3).await,
        ActionStatus::Running,
        "a stale token in a batch changes nothing"
    );
    assert!(db
        .store
        .finish_many(&[], db.clock.now())
        .await
        .unwrap()
        .is_empty());
}

/// Issue 17 item 6: a write the database refuses for good (read-only file, transaction or
/// session) is classified permanent, not transient, so `dockhand run` stops instead of
/// retrying forever; writes that go through are unaffected.
pub async fn store_read_only_writes_are_permanent_errors(db: TestDb) {
    let ro = db.open_read_only().await;
    let now = db.clock.now();
    let refused = ro
        .rearm_fixed_delay(now)
        .await
        .expect_err("a read-only database takes no write");
    assert!(refused.is_permanent(), "{refused}");
    assert!(!refused.is_transient(), "{refused}");
    let action = ActionSpec::new("h", json!({}))
        .prepare(now)
        .expect("valid action");
    let refused = ro
        .enqueue(&action, now)
        .await
        .expect_err("a read-only database takes no enqueue");
    assert!(refused.is_permanent(), "{refused}");
    // Reads still work, and the writable store is untouched by the classification.
    ro.stats(now).await.expect("reads work");
    db.store
        .rearm_fixed_delay(now)
        .await
        .expect("writable store");
    ro.close().await;
}
