//! Issue 6 item 3: contention on one MariaDB/MySQL database never surfaces a deadlock.
//!
//! Two runtimes (two stores, two pools) drain 5,000 no-op actions while 16 tasks race for item
//! claims (rounds on a shared item, reclaimed with `reprocess`) and 4 tasks keep enqueueing
//! unique actions over a few keys. Every store call must succeed (deadlocks and lock wait
//! timeouts are retried inside the store), every action must complete exactly once, and each
//! round of the item race must have exactly one winner. The store's deadlock-retry count is
//! printed. Skipped (one line on stderr) when DOCKHAND_TEST_MYSQL_URL is unset.

use chrono::Utc;
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, CompleteOutcome};
use dockhand::store::mysql::MySqlStore;
use dockhand::{
    ActionQuery, ActionSpec, ActionStatus, CompletionConfig, DynStore, Identity, Queue, Runtime,
    SystemClock,
};
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Barrier;

const N: usize = 5_000;
const RACERS: usize = 16;
const ROUNDS: usize = 150;
const UNIQUE_ENQUEUERS: usize = 4;
const UNIQUE_ENQUEUES: usize = 100;

type Runs = Arc<Mutex<HashMap<i64, u32>>>;

async fn open(base: &str, name: &str) -> DynStore {
    let options = MySqlStore::url_for_database(base, name).unwrap();
    Arc::new(MySqlStore::connect_with(options, 12).await.unwrap())
}

async fn runtime(store: DynStore, runs: &Runs) -> Runtime {
    let runs = runs.clone();
    Runtime::with_store(store)
        .clock(Arc::new(SystemClock))
        .migrate(false)
        .concurrency(8)
        .poll_interval(Duration::from_millis(20))
        .handler("work", move |ctx| {
            *runs.lock().unwrap().entry(ctx.action_id).or_default() += 1;
            async { Ok(()) }
        })
        .build()
        .await
        .unwrap()
}

/// 16 tasks (alternating between the two stores) race for one item per round; the winner's
/// claim is completed after the round. Items are reused every 10 rounds and reclaimed with
/// `reprocess`.
async fn race_for_items(stores: [DynStore; 2]) {
    let barrier = Arc::new(Barrier::new(RACERS));
    for round in 0..ROUNDS {
        let item = format!("item-{}", round % 10);
        let tasks: Vec<_> = (0..RACERS)
            .map(|k| {
                let store = stores[k % 2].clone();
                let barrier = barrier.clone();
                let item = item.clone();
                tokio::spawn(async move {
                    let req = ClaimItemRequest {
                        identity: Identity::new("deadlock", "feed", item).unwrap(),
                        job_id: None,
                        ttl: chrono::Duration::minutes(10),
                        completion: CompletionConfig::default(),
                        reprocess: true,
                        run: None,
                    };
                    barrier.wait().await;
                    store
                        .claim_item(&req, Utc::now())
                        .await
                        .expect("claim_item never fails under contention")
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            if let ClaimOutcome::Claimed(d) = t.await.unwrap() {
                winners.push(d);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        // Completed once the round is over, so the next round reclaims a processed item.
        let done = stores[round % 2]
            .complete_claim(&winners[0], None, Utc::now())
            .await
            .expect("complete_claim never fails under contention");
        assert_eq!(done, CompleteOutcome::Completed);
    }
}

/// Enqueues unique actions over 5 keys while the runners complete them; returns the ids of
/// the actions it inserted.
async fn enqueue_uniques(queue: Queue, task: usize) -> Vec<i64> {
    let mut inserted = Vec::new();
    for i in 0..UNIQUE_ENQUEUES {
        let spec = ActionSpec::new("work", json!({"unique": true}))
            .unique_key(format!("u-{}", (i + task) % 5));
        let e = queue
            .enqueue_detailed(spec)
            .await
            .expect("unique enqueue never fails under contention");
        if e.inserted {
            inserted.push(e.id);
        }
        tokio::task::yield_now().await;
    }
    inserted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_runtimes_and_sixteen_claimers_never_surface_a_deadlock() {
    let Some(base) = std::env::var("DOCKHAND_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: MySQL/MariaDB deadlock test (set DOCKHAND_TEST_MYSQL_URL to run it)"
        );
        return;
    };
    let name = format!("dh_{}", uuid::Uuid::new_v4().simple());
    MySqlStore::create_database(&base, &name).await.unwrap();
    let (a, b) = (open(&base, &name).await, open(&base, &name).await);
    a.migrate().await.unwrap();
    let retries_before = MySqlStore::deadlock_retries();

    let runs: Runs = Arc::default();
    let queue = Queue::new(a.clone());
    let specs = (0..N)
        .map(|i| ActionSpec::new("work", json!({"i": i})))
        .collect();
    let bulk = queue.enqueue_bulk(specs).await.unwrap();
    assert_eq!(bulk.len(), N);
    let (rt_a, rt_b) = (
        runtime(a.clone(), &runs).await,
        runtime(b.clone(), &runs).await,
    );
    let (ha, hb) = (rt_a.start().await.unwrap(), rt_b.start().await.unwrap());

    let racing = tokio::spawn(race_for_items([a.clone(), b.clone()]));
    let enqueuers: Vec<_> = (0..UNIQUE_ENQUEUERS)
        .map(|t| {
            let q = Queue::new(if t % 2 == 0 { a.clone() } else { b.clone() });
            tokio::spawn(enqueue_uniques(q, t))
        })
        .collect();
    racing.await.unwrap();
    let mut unique_ids = Vec::new();
    for e in enqueuers {
        unique_ids.extend(e.await.unwrap());
    }
    let total = N + unique_ids.len();

    // Bounded wait for the drain (generous on a slow machine; not a timing assertion).
    for _ in 0..1800 {
        let stats = queue.stats().await.unwrap();
        if stats.by_status.get("complete").copied().unwrap_or(0) == total as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ha.shutdown().await;
    hb.shutdown().await;

    let mut seen = 0;
    let mut offset = 0;
    loop {
        let page = queue
            .query(&ActionQuery {
                limit: 1000,
                offset,
                ..ActionQuery::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        offset += page.len() as i64;
        for action in page {
            assert_eq!(
                action.status,
                ActionStatus::Complete,
                "action {}",
                action.id
            );
            assert_eq!(action.attempt, 1, "action {} claimed twice", action.id);
            seen += 1;
        }
    }
    assert_eq!(seen, total, "every action exists once");
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), total, "every action ran");
    let twice: Vec<_> = runs.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");

    let retried = MySqlStore::deadlock_retries() - retries_before;
    let _ = writeln!(
        std::io::stderr(),
        "mysql_deadlock: {total} actions completed once each, {ROUNDS} claim rounds with one \
         winner each; deadlock retries inside the store: {retried}"
    );
    a.close().await;
    b.close().await;
    MySqlStore::drop_database(&base, &name).await.unwrap();
}
