//! Runner scenarios: when actions run, retries, panics, timeouts, lease loss, shutdown.

use super::Recorder;
use crate::harness::TestDb;
use chrono::Duration;
use dockhand::store::{ClaimRequest, Finish, FinishResult};
use dockhand::Clock;
use dockhand::{ActionSpec, ActionStatus, HandlerError, Recurrence, ScheduleSpec};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub async fn s_a1_async_single_interval_cron_run_when_due_never_before(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("async", rec.ok_handler())
        .handler("single", rec.ok_handler())
        .handler("interval", rec.ok_handler())
        .handler("cron", rec.ok_handler())
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    let start = db.clock.now();
    q.enqueue(ActionSpec::new("async", json!({"k": "a"})))
        .await
        .unwrap();
    q.enqueue(ActionSpec::new("single", json!({"k": "s"})).at(start + Duration::hours(1)))
        .await
        .unwrap();
    q.schedule(ScheduleSpec::new(
        "interval",
        json!({}),
        Recurrence::every(Duration::minutes(30)).unwrap(),
    ))
    .await
    .unwrap();
    // Every hour on the hour (UTC).
    q.schedule(ScheduleSpec::new(
        "cron",
        json!({}),
        Recurrence::cron("0 * * * *", "UTC").unwrap(),
    ))
    .await
    .unwrap();

    rt.drain(100).await.unwrap();
    assert_eq!(rec.of("async").len(), 1, "async runs at once");
    assert_eq!(
        rec.of("interval").len(),
        1,
        "first interval occurrence is due at once"
    );
    assert!(rec.of("single").is_empty());
    assert!(rec.of("cron").is_empty());

    // One second before the single action's time: still nothing.
    db.clock
        .set(start + Duration::hours(1) - Duration::seconds(1));
    rt.drain(100).await.unwrap();
    assert!(rec.of("single").is_empty(), "never before its time");
    assert!(rec.of("cron").is_empty(), "cron at 13:00 not before");
    assert_eq!(rec.of("interval").len(), 2, "12:30 occurrence");

    db.clock.set(start + Duration::hours(1));
    rt.drain(100).await.unwrap();
    assert_eq!(rec.of("single").len(), 1);
    assert_eq!(rec.of("cron").len(), 1);
    assert_eq!(rec.of("interval").len(), 3, "13:00 occurrence");
    for r in rec.runs() {
        let a = rt.queue().get(r.id).await.unwrap();
        assert!(
            r.at >= a.scheduled_at,
            "{} ran at {} before {}",
            r.hook,
            r.at,
            a.scheduled_at
        );
        assert_eq!(a.status, ActionStatus::Complete);
    }
}

pub async fn s_a3_fails_twice_then_succeeds_with_growing_backoff(db: TestDb) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let rt = db
        .runtime()
        .handler("flaky", move |_ctx| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(HandlerError::retry(format!("boom {n}")))
                } else {
                    Ok(())
                }
            }
        })
        .build()
        .await
        .unwrap();
    let id = rt
        .queue()
        .enqueue(ActionSpec::new("flaky", json!({})).max_attempts(3))
        .await
        .unwrap();
    let t = db.clock.now();
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    let a = rt.queue().get(id).await.unwrap();
    assert_eq!(a.status, ActionStatus::Pending);
    assert_eq!(
        a.scheduled_at,
        t + Duration::seconds(10),
        "first retry after base delay"
    );
    assert_eq!(a.last_error.as_deref(), Some("boom 0"));

    db.clock.set(a.scheduled_at - Duration::milliseconds(1));
    assert_eq!(
        rt.run_due_once().await.unwrap(),
        0,
        "not before the backoff"
    );
    db.clock.set(a.scheduled_at);
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    let b = rt.queue().get(id).await.unwrap();
    assert_eq!(
        b.scheduled_at,
        a.scheduled_at + Duration::seconds(20),
        "delay doubles"
    );

    db.clock.set(b.scheduled_at);
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    let c = rt.queue().get(id).await.unwrap();
    assert_eq!(c.status, ActionStatus::Complete);
    assert_eq!(c.attempt, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

pub async fn s_a3_retries_exhausted_keeps_last_error(db: TestDb) {
    let rt = db
        .runtime()
        .handler("bad", |ctx| async move {
            Err(HandlerError::retry(format!("nope #{}", ctx.attempt)))
        })
        .build()
        .await
        .unwrap();
    let id = rt
        .queue()
        .enqueue(ActionSpec::new("bad", json!({})).max_attempts(2))
        .await
        .unwrap();
    rt.run_due_once().await.unwrap();
    db.clock.advance(Duration::seconds(10));
    rt.run_due_once().await.unwrap();
    let a = rt.queue().get(id).await.unwrap();
    assert_eq!(a.status, ActionStatus::Failed);
    assert_eq!(a.attempt, 2);
    let err = a.last_error.unwrap();
    assert!(
        err.contains("nope #2") && err.contains("attempt 2 of 2"),
        "{err}"
    );
    db.clock.advance(Duration::days(1));
    assert_eq!(
        rt.run_due_once().await.unwrap(),
        0,
        "a failed action is never run again"
    );
}

pub async fn s_a4_panic_and_timeout_are_retried_then_failed(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("panics", |_ctx| async move {
            if true {
                panic!("handler exploded");
            }
            Ok(())
        })
        .handler("slow", |_ctx| async move {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            Ok(())
        })
        .handler("fine", rec.ok_handler())
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    let p = q
        .enqueue(ActionSpec::new("panics", json!({})).max_attempts(2))
        .await
        .unwrap();
    let s = q
        .enqueue(
            ActionSpec::new("slow", json!({}))
                .max_attempts(2)
                .timeout(std::time::Duration::from_millis(50)),
        )
        .await
        .unwrap();
    rt.run_due_once().await.unwrap();
    for id in [p, s] {
        let a = q.get(id).await.unwrap();
        assert_eq!(
            a.status,
            ActionStatus::Pending,
            "retried after first failure"
        );
        assert_eq!(a.attempt, 1);
    }
    assert!(q
        .get(p)
        .await
        .unwrap()
        .last_error
        .unwrap()
        .contains("handler exploded"));
    assert!(q
        .get(s)
        .await
        .unwrap()
        .last_error
        .unwrap()
        .contains("timed out"));
    db.clock.advance(Duration::seconds(10));
    rt.run_due_once().await.unwrap();
    for id in [p, s] {
        assert_eq!(q.get(id).await.unwrap().status, ActionStatus::Failed);
    }
    // The runner keeps working.
    let f = q.enqueue(ActionSpec::new("fine", json!({}))).await.unwrap();
    rt.run_due_once().await.unwrap();
    assert_eq!(q.get(f).await.unwrap().status, ActionStatus::Complete);
    assert_eq!(rec.runs().len(), 1);
}

pub async fn s_a5_lease_lost_late_completion_changes_nothing(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("job", rec.ok_handler())
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    let id = q
        .enqueue(ActionSpec::new("job", json!({"n": 1})))
        .await
        .unwrap();
    let now = db.clock.now();
    // Runner A claims with a 30 s lease, then stalls.
    let a = db
        .store
        .claim(&ClaimRequest {
            owner: "runner-a",
            limit: 1,
            now,
            lease_until: now + Duration::seconds(30),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(a.len(), 1);
    db.clock.advance(Duration::seconds(31));
    let report = rt.run_maintenance_once().await.unwrap();
    assert_eq!(report.requeued, 1, "expired lease goes back to pending");
    // Runner B reclaims and completes.
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    let done = q.get(id).await.unwrap();
    assert_eq!(done.status, ActionStatus::Complete);
    assert!(
        done.lease_token > a[0].token,
        "the new claim has a newer token"
    );
    // A's late completion and late failure change nothing.
    for late in [
        Finish::Complete,
        Finish::Fail {
            error: "late".into(),
        },
    ] {
        let r = db
            .store
            .finish(a[0].lease(), &late, db.clock.now())
            .await
            .unwrap();
        assert_eq!(r, FinishResult::LeaseLost);
    }
    let after = q.get(id).await.unwrap();
    assert_eq!(after.status, ActionStatus::Complete);
    assert_eq!(
        after.last_error.as_deref(),
        Some("lease expired (owner runner-a)")
    );
    let logs = q.logs(id).await.unwrap();
    assert_eq!(logs.iter().filter(|l| l.event == "lease_lost").count(), 2);
    assert_eq!(rec.runs().len(), 1);
}

pub async fn s_a6_two_runners_drain_without_running_twice(db: TestDb) {
    const N: usize = 5000;
    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let make = |store| {
        let runs = runs.clone();
        db.runtime_on(store)
            .clock(Arc::new(dockhand::SystemClock))
            .concurrency(8)
            .poll_interval(std::time::Duration::from_millis(20))
            .handler("work", move |ctx| {
                *runs.lock().unwrap().entry(ctx.action_id).or_default() += 1;
                async { Ok(()) }
            })
    };
    let rt_a = make(db.store.clone()).build().await.unwrap();
    let rt_b = make(db.open_another().await).build().await.unwrap();
    let specs = (0..N)
        .map(|i| ActionSpec::new("work", json!({"i": i})))
        .collect();
    let queue = dockhand::Queue::new(db.store.clone());
    queue.enqueue_bulk(specs).await.unwrap();
    let (ha, hb) = (rt_a.start().await.unwrap(), rt_b.start().await.unwrap());
    // Bounded wait for the drain (not a timing assertion: generous on a slow machine).
    for _ in 0..1200 {
        let stats = queue.stats().await.unwrap();
        if stats.by_status.get("complete").copied().unwrap_or(0) == N as i64 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    ha.shutdown().await;
    hb.shutdown().await;
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), N, "every action ran");
    let twice: Vec<_> = runs.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
}

/// Starts a runtime whose one action sleeps `work`, waits until the handler has started, then
/// shuts down with `deadline`; returns the action as it stands afterwards.
async fn shutdown_during_handler(
    db: &TestDb,
    work: std::time::Duration,
    deadline: std::time::Duration,
) -> (dockhand::Runtime, i64) {
    let started = Arc::new(tokio::sync::Notify::new());
    let s = started.clone();
    let rt = db
        .runtime()
        .shutdown_timeout(deadline)
        .poll_interval(std::time::Duration::from_millis(10))
        .handler("slow", move |_ctx| {
            let s = s.clone();
            async move {
                s.notify_one();
                tokio::time::sleep(work).await;
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let id = rt
        .queue()
        .enqueue(ActionSpec::new("slow", json!({})))
        .await
        .unwrap();
    let handle = rt.start().await.unwrap();
    started.notified().await;
    handle.shutdown().await;
    (rt, id)
}

pub async fn s_a9_graceful_shutdown_finishes_in_flight(db: TestDb) {
    let (rt, id) = shutdown_during_handler(
        &db,
        std::time::Duration::from_millis(300),
        std::time::Duration::from_secs(30),
    )
    .await;
    let a = rt.queue().get(id).await.unwrap();
    assert_eq!(
        a.status,
        ActionStatus::Complete,
        "in-flight handler finished before shutdown returned"
    );
}

pub async fn s_a9_shutdown_deadline_gives_leases_back_uncounted(db: TestDb) {
    let (rt, id) = shutdown_during_handler(
        &db,
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(50),
    )
    .await;
    let a = rt.queue().get(id).await.unwrap();
    assert_eq!(a.status, ActionStatus::Pending, "lease given back");
    assert_eq!(a.attempt, 0, "the attempt is not counted");
    assert!(a.lease_owner.is_none());
    let logs = rt.queue().logs(id).await.unwrap();
    assert!(logs.iter().any(|l| l.event == "released"));
}

pub async fn s_a11_bad_input_is_named_and_harmless(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .handler("known", rec.ok_handler())
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    let good = q
        .enqueue(ActionSpec::new("known", json!({"x": 1})))
        .await
        .unwrap();
    let unknown = q
        .enqueue(ActionSpec::new("nobody.handles.this", json!({})))
        .await
        .unwrap();

    let e = Recurrence::cron("every tuesday", "UTC")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid cron"), "{e}");
    let e = Recurrence::cron("0 9 * * *", "Europe/Atlantis")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid timezone"), "{e}");
    let e = dockhand::action::parse_args("{not json")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid args"), "{e}");
    let e = Recurrence::every(Duration::zero()).unwrap_err().to_string();
    assert!(e.starts_with("invalid interval"), "{e}");
    let e = q
        .enqueue(ActionSpec::new("", json!({})))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid hook"), "{e}");
    let e = q
        .enqueue(ActionSpec::new("known", json!({"s": "a\u{0}b"})))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid args"), "{e}");
    // A bulk enqueue with one bad spec writes nothing.
    let bulk = q
        .enqueue_bulk(vec![
            ActionSpec::new("known", json!(1)),
            ActionSpec::new("", json!(2)),
        ])
        .await;
    assert!(bulk.unwrap_err().to_string().starts_with("invalid hook"));

    rt.drain(10).await.unwrap();
    let u = q.get(unknown).await.unwrap();
    assert_eq!(u.status, ActionStatus::Failed);
    assert!(u
        .last_error
        .unwrap()
        .contains("unknown hook `nobody.handles.this`"));
    assert_eq!(q.get(good).await.unwrap().status, ActionStatus::Complete);
    let stats = q.stats().await.unwrap();
    assert_eq!(
        stats.by_status.values().sum::<i64>(),
        2,
        "nothing else was stored"
    );
}

pub async fn runner_only_registered_hooks_leaves_others_pending(db: TestDb) {
    let rec = Recorder::default();
    let rt = db
        .runtime()
        .only_registered_hooks(true)
        .handler("mine", rec.ok_handler())
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    let theirs = q
        .enqueue(ActionSpec::new("theirs", json!({})).priority(0))
        .await
        .unwrap();
    let mine = q.enqueue(ActionSpec::new("mine", json!({}))).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(q.get(mine).await.unwrap().status, ActionStatus::Complete);
    let t = q.get(theirs).await.unwrap();
    assert_eq!(
        (t.status, t.attempt),
        (ActionStatus::Pending, 0),
        "another service's action is not touched"
    );
}
