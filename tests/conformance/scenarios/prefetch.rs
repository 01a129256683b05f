//! Claim-ahead (DESIGN Q3): buffered actions are leased to the runner, started in claim order,
//! given back uncounted at shutdown or before their lease could lapse, reclaimed by the reaper
//! when the runner is killed, and never run twice under two runners.
//!
//! The buffered state is reached deterministically: a runner starts out assuming a backlog, so
//! its first claim takes `concurrency + prefetch` actions; with one slot whose handler blocks,
//! everything else that first claim took is buffered once that handler has started.

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::store::{ClaimRequest, Finish, FinishResult};
use dockhand::{ActionSpec, ActionStatus, Clock, DynStore};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify, Semaphore};

/// Awaits a signal the scenario depends on, failing (instead of hanging) if it never comes.
async fn signal<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(std::time::Duration::from_secs(60), f).await {
        Ok(v) => v,
        Err(_) => panic!("no signal within 60 s: {what}"),
    }
}

/// Enqueues `n` actions of hook `work` (ids in enqueue order).
async fn enqueue(q: &dockhand::Queue, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            q.enqueue(ActionSpec::new("work", json!({ "i": i })))
                .await
                .unwrap(),
        );
    }
    ids
}

async fn status_of(db: &TestDb, ids: &[i64]) -> Vec<(ActionStatus, i32)> {
    let q = db.queue();
    let mut out = Vec::new();
    for id in ids {
        let a = q.get(*id).await.unwrap();
        out.push((a.status, a.attempt));
    }
    out
}

pub async fn prefetch_buffer_is_given_back_at_shutdown_uncounted(db: TestDb) {
    let started = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (s, g, r) = (started.clone(), go.clone(), runs.clone());
    let rt = db
        .runtime()
        .concurrency(1)
        .prefetch(4)
        .poll_interval(std::time::Duration::from_millis(10))
        .handler("work", move |_ctx| {
            let (s, g) = (s.clone(), g.clone());
            r.fetch_add(1, Ordering::SeqCst);
            async move {
                s.notify_one();
                g.notified().await;
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let ids = enqueue(rt.queue(), 5).await;
    let mut wake = db.store.wakeups();
    let handle = rt.start().await.unwrap();
    signal("handler started", started.notified()).await;
    // One claim took all five: the first runs, four are buffered, all leased to the runner.
    assert!(status_of(&db, &ids)
        .await
        .iter()
        .all(|s| *s == (ActionStatus::Running, 1)));
    wake.borrow_and_update();
    let stopping = tokio::spawn(handle.shutdown());
    // Giving a lease back wakes runners: the buffer goes back first, while the handler runs.
    signal("buffer given back", wake.changed()).await.unwrap();
    let during = status_of(&db, &ids).await;
    assert_eq!(
        during[0],
        (ActionStatus::Running, 1),
        "the running one goes on"
    );
    assert!(
        during[1..].iter().all(|s| *s == (ActionStatus::Pending, 0)),
        "buffered actions are pending again, attempt not counted: {during:?}"
    );
    go.notify_one();
    stopping.await.unwrap();
    let after = status_of(&db, &ids).await;
    assert_eq!(after[0], (ActionStatus::Complete, 1));
    assert!(after[1..].iter().all(|s| *s == (ActionStatus::Pending, 0)));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no buffered action ran");
    for id in &ids[1..] {
        let a = db.queue().get(*id).await.unwrap();
        assert!(a.lease_owner.is_none());
        let logs = db.queue().logs(*id).await.unwrap();
        assert!(logs.iter().any(|l| l.event == "released"), "{logs:?}");
    }
}

pub async fn prefetch_killed_runner_buffer_is_reaped(db: TestDb) {
    let started = Arc::new(Notify::new());
    let s = started.clone();
    let rt = db
        .runtime()
        .concurrency(1)
        .prefetch(4)
        .handler("work", move |_ctx| {
            let s = s.clone();
            async move {
                s.notify_one();
                std::future::pending::<()>().await;
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let ids = enqueue(rt.queue(), 5).await;
    let handle = rt.start().await.unwrap();
    signal("handler started", started.notified()).await;
    // Killed: nothing is given back.
    handle.abort().await;
    assert!(status_of(&db, &ids)
        .await
        .iter()
        .all(|s| *s == (ActionStatus::Running, 1)));
    // Before the lease ends the reaper leaves them alone; after it, all five go back.
    db.clock.advance(Duration::seconds(29));
    assert_eq!(rt.run_maintenance_once().await.unwrap().requeued, 0);
    db.clock.advance(Duration::seconds(2));
    assert_eq!(rt.run_maintenance_once().await.unwrap().requeued, 5);
    assert!(
        status_of(&db, &ids)
            .await
            .iter()
            .all(|s| *s == (ActionStatus::Pending, 1)),
        "reclaimed like a crashed run: the attempt counts"
    );
    // Another runner runs each exactly once.
    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let r = runs.clone();
    let rt2 = db
        .runtime()
        .handler("work", move |ctx| {
            *r.lock().unwrap().entry(ctx.action_id).or_default() += 1;
            async { Ok(()) }
        })
        .build()
        .await
        .unwrap();
    rt2.drain(20).await.unwrap();
    assert!(status_of(&db, &ids)
        .await
        .iter()
        .all(|s| *s == (ActionStatus::Complete, 2)));
    assert!(runs.lock().unwrap().values().all(|n| *n == 1));
    assert_eq!(runs.lock().unwrap().len(), 5);
}

pub async fn prefetch_claim_order_is_start_order_across_refills(db: TestDb) {
    let (tx, mut rx) = mpsc::unbounded_channel::<i64>();
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let rt = db
        .runtime()
        .concurrency(1)
        .prefetch(2)
        .poll_interval(std::time::Duration::from_millis(10))
        .handler("work", move |ctx| {
            let (tx, g) = (tx.clone(), g.clone());
            async move {
                let _ = tx.send(ctx.action_id);
                g.acquire().await.unwrap().forget();
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    // L1..L5 with priorities 5..9, enqueued lowest priority first (ids run against the order
    // the claim must follow).
    let mut low = Vec::new();
    for p in (5..10).rev() {
        low.push(
            q.enqueue(ActionSpec::new("work", json!({ "p": p })).priority(p))
                .await
                .unwrap(),
        );
    }
    low.reverse(); // low[0] = priority 5 … low[4] = priority 9
    let handle = rt.start().await.unwrap();
    let mut order = vec![signal("first start", rx.recv()).await.unwrap()];
    // L1 runs, L2 and L3 are buffered; a higher-priority action arrives now.
    let high = q
        .enqueue(ActionSpec::new("work", json!({ "p": 0 })).priority(0))
        .await
        .unwrap();
    for _ in 0..5 {
        gate.add_permits(1);
        order.push(signal("next start", rx.recv()).await.unwrap());
    }
    gate.add_permits(1);
    handle.shutdown().await;
    assert_eq!(
        order,
        vec![low[0], low[1], low[2], high, low[3], low[4]],
        "claim order within a round, then the highest pending at the next refill: the \
         buffered ones are not overtaken"
    );
    let all: Vec<i64> = low.iter().copied().chain([high]).collect();
    assert!(status_of(&db, &all)
        .await
        .iter()
        .all(|s| *s == (ActionStatus::Complete, 1)));
}

pub async fn prefetch_lapsing_buffered_lease_is_given_back_not_started(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let store: DynStore = faulty.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<(i64, i32)>();
    let go = Arc::new(Notify::new());
    let g = go.clone();
    let rt = db
        .runtime_on(store)
        .concurrency(1)
        .prefetch(4)
        .lease(
            std::time::Duration::from_secs(30),
            std::time::Duration::from_millis(20),
        )
        .poll_interval(std::time::Duration::from_millis(10))
        .handler("work", move |ctx| {
            let (tx, g) = (tx.clone(), g.clone());
            async move {
                let first = tx.send((ctx.action_id, ctx.attempt)).is_ok() && ctx.args["i"] == 0;
                if first {
                    g.notified().await;
                }
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let ids = enqueue(rt.queue(), 5).await;
    let mut wake = db.store.wakeups();
    // Heartbeats fail from now on: the buffered leases keep the expiry of their claim.
    faulty.fail_from("heartbeat", 1, FaultMode::FailBefore);
    let handle = rt.start().await.unwrap();
    let mut runs = vec![signal("first start", rx.recv()).await.unwrap()];
    wake.borrow_and_update();
    // A 30 s lease and the next heartbeat up to 20 ms away: at 29.99 s none may start.
    db.clock.advance(Duration::milliseconds(29_990));
    // The heartbeat loop gives the four buffered ones back (a give-back wakes runners).
    signal("buffer given back", wake.changed()).await.unwrap();
    faulty.heal();
    go.notify_one();
    // The same runner claims them again and runs each once.
    for _ in 0..4 {
        runs.push(signal("buffered ones run", rx.recv()).await.unwrap());
    }
    handle.shutdown().await;
    let ran: Vec<i64> = runs.iter().map(|(id, _)| *id).collect();
    assert_eq!(ran, ids, "each ran once, in claim order: {runs:?}");
    assert!(runs.iter().all(|(_, attempt)| *attempt == 1), "{runs:?}");
    assert!(status_of(&db, &ids)
        .await
        .iter()
        .all(|s| *s == (ActionStatus::Complete, 1)));
    for id in &ids[1..] {
        let logs = db.queue().logs(*id).await.unwrap();
        assert_eq!(
            logs.iter().filter(|l| l.event == "released").count(),
            1,
            "{logs:?}"
        );
        assert_eq!(logs.iter().filter(|l| l.event == "started").count(), 2);
    }
}

pub async fn prefetch_two_runners_drain_without_running_twice(db: TestDb) {
    const N: usize = 3000;
    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let make = |store| {
        let runs = runs.clone();
        db.runtime_on(store)
            .clock(Arc::new(dockhand::SystemClock))
            .concurrency(4)
            .prefetch(64)
            .poll_interval(std::time::Duration::from_millis(20))
            .handler("work", move |ctx| {
                *runs.lock().unwrap().entry(ctx.action_id).or_default() += 1;
                async { Ok(()) }
            })
    };
    let rt_a = make(db.store.clone()).build().await.unwrap();
    let rt_b = make(db.open_another().await).build().await.unwrap();
    let queue = dockhand::Queue::new(db.store.clone());
    queue
        .enqueue_bulk(
            (0..N)
                .map(|i| ActionSpec::new("work", json!({ "i": i })))
                .collect(),
        )
        .await
        .unwrap();
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
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), N, "every action ran");
    let twice: Vec<_> = runs.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    let stats = queue.stats().await.unwrap();
    assert_eq!(stats.by_status.get("complete").copied(), Some(N as i64));
}

pub async fn store_finish_and_claim_guards_each_completion_and_claims_in_order(db: TestDb) {
    let q = db.queue();
    let now = db.clock.now();
    let req = |limit: i64, now| ClaimRequest {
        owner: "me",
        limit,
        now,
        lease_until: now + Duration::seconds(30),
        hooks: None,
        routing: None,
    };
    for i in 0..3 {
        q.enqueue(ActionSpec::new("h", json!(i)).priority(1))
            .await
            .unwrap();
    }
    let first = db.store.claim(&req(3, now)).await.unwrap();
    // Enqueued against the claim order: ids ascend, priorities do not.
    let mut later = Vec::new();
    for p in [9, 7, 8] {
        later.push(
            q.enqueue(ActionSpec::new("h", json!(p)).priority(p))
                .await
                .unwrap(),
        );
    }
    let mut stale = first[2].lease();
    stale.token += 1;
    let items = vec![
        (first[0].lease(), Finish::Complete),
        (first[1].lease(), Finish::Complete),
        (stale, Finish::Complete),
    ];
    let round = db
        .store
        .finish_and_claim(&items, &req(2, now), now)
        .await
        .unwrap();
    assert_eq!(
        round.finished,
        vec![
            FinishResult::Applied,
            FinishResult::Applied,
            FinishResult::LeaseLost
        ]
    );
    let claimed = round.claimed.unwrap();
    assert_eq!(
        claimed.iter().map(|a| a.id).collect::<Vec<_>>(),
        vec![later[1], later[2]],
        "the claim follows (priority, scheduled_at, id)"
    );
    let events = |id: i64| {
        let q = q.clone();
        async move {
            q.logs(id)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.event)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        events(first[0].id).await,
        ["created", "started", "completed"]
    );
    assert_eq!(
        events(first[2].id).await,
        ["created", "started", "lease_lost"]
    );
    assert_eq!(
        q.get(first[2].id).await.unwrap().status,
        ActionStatus::Running,
        "a stale token changes nothing"
    );
    assert_eq!(events(later[1]).await, ["created", "started"]);

    // Other outcomes than completions: each written as `finish_many` writes it.
    let at = now + Duration::minutes(5);
    let items = vec![
        (
            claimed[0].lease(),
            Finish::Retry {
                at,
                error: "again".into(),
            },
        ),
        (claimed[1].lease(), Finish::Complete),
    ];
    let round = db
        .store
        .finish_and_claim(&items, &req(5, now), now)
        .await
        .unwrap();
    assert_eq!(
        round.finished,
        vec![FinishResult::Applied, FinishResult::Applied]
    );
    let claimed = round.claimed.unwrap();
    assert_eq!(
        claimed.iter().map(|a| a.id).collect::<Vec<_>>(),
        vec![later[0]],
        "the retried action is not due yet"
    );
    assert_eq!(q.get(later[1]).await.unwrap().status, ActionStatus::Pending);
    assert_eq!(events(later[2]).await, ["created", "started", "completed"]);
    // No finishes: a plain claim.
    db.clock.set(at);
    let round = db
        .store
        .finish_and_claim(&[], &req(5, at), at)
        .await
        .unwrap();
    assert!(round.finished.is_empty());
    let claimed = round.claimed.unwrap();
    assert_eq!(
        claimed.iter().map(|a| a.id).collect::<Vec<_>>(),
        vec![later[1]]
    );
    // Completions only, every lease held (SQLite's one-count path): all applied, logged, and
    // the claim in the same round finds nothing left.
    let items = vec![
        (claimed[0].lease(), Finish::Complete),
        (first[2].lease(), Finish::Complete),
    ];
    let round = db
        .store
        .finish_and_claim(&items, &req(5, at), at)
        .await
        .unwrap();
    assert_eq!(
        round.finished,
        vec![FinishResult::Applied, FinishResult::Applied]
    );
    assert!(round.claimed.unwrap().is_empty());
    for id in [later[1], first[2].id] {
        assert_eq!(q.get(id).await.unwrap().status, ActionStatus::Complete);
    }
    assert_eq!(
        events(later[1]).await,
        ["created", "started", "retry", "started", "completed"]
    );
}
