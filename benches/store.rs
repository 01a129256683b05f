//! Criterion benches of the store's hot paths (DESIGN §10): claim batch and finish batch (8 at
//! a time off a large pending set that is topped up outside the timer), claim-ahead refills
//! (64 runners at once each completing its previous refill and claiming the next in one
//! `finish_and_claim` round, on one queue), bulk enqueue, and item-claim contention (64 tasks
//! racing for one item; 64 tasks claiming distinct items).
//!
//! SQLite always (a temp file per group, opened as `dockhand::connect` opens it: WAL,
//! synchronous=NORMAL); PostgreSQL too when DOCKHAND_TEST_POSTGRES_URL is set (a fresh schema
//! `dh_crit_<random>` per group, dropped afterwards), and MySQL/MariaDB when
//! DOCKHAND_TEST_MYSQL_URL is set (a fresh database `dh_crit_<random>` per group, dropped
//! afterwards). Manual only, not run by CI:
//!
//! ```text
//! cargo bench --bench store                 # full run
//! cargo bench --bench store -- --quick      # a short pass
//! cargo bench --bench store -- item_claim   # one group family
//! ```

use chrono::Utc;
use criterion::{Criterion, Throughput};
use dockhand::action::PreparedAction;
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, CompletionConfig, Identity};
use dockhand::store::mysql::MySqlStore;
use dockhand::store::postgres::PgStore;
use dockhand::store::sqlite::SqliteStore;
use dockhand::store::traced::Traced;
use dockhand::store::{ClaimRequest, ClaimedAction, Finish, FinishResult};
use dockhand::{ActionSpec, DynStore, Store};
use serde_json::json;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Actions claimed (and finished) per batch: the runner's default-ish slot count.
const BATCH: usize = 8;
/// Pending actions kept under the claim and finish benches.
const PENDING: usize = 20_000;
/// Runners refilling their claim-ahead buffers at once, and actions per refill (the
/// runner's default prefetch).
const RUNNERS: usize = 64;
const REFILL: usize = dockhand::runner::DEFAULT_PREFETCH;
/// Rows per bulk enqueue.
const BULK: usize = 1_000;
/// Tasks racing in the item-claim benches.
const RACERS: usize = 64;
const OWNER: &str = "bench-runner";

/// Where fresh databases come from.
#[derive(Clone)]
enum Backend {
    Sqlite,
    Postgres(String),
    Mysql(String),
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
            Backend::Mysql(_) => "mysql",
        }
    }
}

/// A migrated, empty database, removed by [`Db::remove`].
struct Db {
    store: DynStore,
    cleanup: Cleanup,
}

enum Cleanup {
    Dir(tempfile::TempDir),
    Schema { url: String, schema: String },
    Database { url: String, name: String },
}

async fn fresh(backend: &Backend) -> Db {
    fresh_with(backend, 16).await
}

/// A fresh database whose pool (PostgreSQL, MySQL) holds up to `connections`.
async fn fresh_with(backend: &Backend, connections: u32) -> Db {
    let (store, cleanup): (DynStore, Cleanup) = match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite:{}", dir.path().join("bench.db").display());
            let store = SqliteStore::connect(&url).await.expect("open SQLite");
            (Traced::wrap(Arc::new(store)), Cleanup::Dir(dir))
        }
        Backend::Postgres(url) => {
            let schema = format!("dh_crit_{:016x}", fastrand::u64(..));
            PgStore::connect_in_schema(url, &schema)
                .await
                .expect("create schema")
                .close()
                .await;
            let options = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(url)
                .expect("PostgreSQL URL")
                .options([("search_path", schema.as_str())]);
            let store = PgStore::connect_with(options, connections)
                .await
                .expect("open PostgreSQL");
            let cleanup = Cleanup::Schema {
                url: url.clone(),
                schema,
            };
            (Traced::wrap(Arc::new(store)), cleanup)
        }
        Backend::Mysql(url) => {
            let name = format!("dh_crit_{:016x}", fastrand::u64(..));
            MySqlStore::create_database(url, &name)
                .await
                .expect("create MySQL database");
            let options = MySqlStore::url_for_database(url, &name).expect("MySQL URL");
            let store = MySqlStore::connect_with(options, connections)
                .await
                .expect("open MySQL");
            let cleanup = Cleanup::Database {
                url: url.clone(),
                name,
            };
            (Traced::wrap(Arc::new(store)), cleanup)
        }
    };
    store.migrate().await.expect("migrate");
    Db { store, cleanup }
}

impl Db {
    async fn remove(self) {
        self.store.close().await;
        match self.cleanup {
            Cleanup::Dir(dir) => drop(dir),
            Cleanup::Schema { url, schema } => {
                if let Err(e) = PgStore::drop_schema(&url, &schema).await {
                    eprintln!("warning: cannot drop schema {schema}: {e}");
                }
            }
            Cleanup::Database { url, name } => {
                if let Err(e) = MySqlStore::drop_database(&url, &name).await {
                    eprintln!("warning: cannot drop database {name}: {e}");
                }
            }
        }
    }
}

fn prepared(count: usize, from: usize) -> Vec<PreparedAction> {
    let now = Utc::now();
    (from..from + count)
        .map(|i| {
            ActionSpec::new("bench.noop", json!({ "n": i }))
                .prepare(now)
                .expect("valid spec")
        })
        .collect()
}

async fn seed(store: &DynStore, count: usize) {
    for from in (0..count).step_by(BULK) {
        let rows = prepared(BULK.min(count - from), from);
        store.enqueue_bulk(&rows, Utc::now()).await.expect("seed");
    }
}

async fn claim(store: &DynStore, limit: usize) -> Vec<ClaimedAction> {
    let now = Utc::now();
    store
        .claim(&ClaimRequest {
            owner: OWNER,
            limit: limit as i64,
            now,
            lease_until: now + chrono::Duration::seconds(300),
            hooks: None,
            routing: None,
        })
        .await
        .expect("claim")
}

/// Finishes every claimed action with `outcome`, one task each (as the runner's slots do).
async fn finish_all(store: &DynStore, claimed: Vec<ClaimedAction>, outcome: Finish) {
    let tasks: Vec<_> = claimed
        .into_iter()
        .map(|a| {
            let (store, outcome) = (Arc::clone(store), outcome.clone());
            tokio::spawn(async move { store.finish(a.lease(), &outcome, Utc::now()).await })
        })
        .collect();
    for t in tasks {
        let result = t.await.expect("finish task").expect("finish");
        assert_eq!(result, FinishResult::Applied);
    }
}

/// Runs `bench` once per backend, each on a fresh database that `setup` prepared.
fn per_backend<S, SF, B>(
    c: &mut Criterion,
    rt: &Runtime,
    backends: &[Backend],
    group: &str,
    elements: usize,
    setup: S,
    bench: B,
) where
    S: Fn(DynStore) -> SF,
    SF: Future<Output = ()>,
    B: Fn(&mut criterion::Bencher<'_>, &Runtime, &DynStore),
{
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(elements as u64));
    for backend in backends {
        let db = rt.block_on(fresh(backend));
        rt.block_on(setup(Arc::clone(&db.store)));
        g.bench_function(backend.name(), |b| bench(b, rt, &db.store));
        rt.block_on(db.remove());
    }
    g.finish();
}

/// One drain step on a pending set that is topped up (untimed) when it runs low: claim 8, then
/// finish all 8 `Complete` concurrently. Returns (claim time, finish time).
async fn drain_step(store: &DynStore, left: &AtomicU64) -> (Duration, Duration) {
    if left.load(Ordering::Relaxed) < BATCH as u64 {
        seed(store, PENDING).await;
        left.fetch_add(PENDING as u64, Ordering::Relaxed);
    }
    let t = Instant::now();
    let claimed = claim(store, BATCH).await;
    let claiming = t.elapsed();
    assert_eq!(claimed.len(), BATCH);
    left.fetch_sub(BATCH as u64, Ordering::Relaxed);
    let t = Instant::now();
    finish_all(store, claimed, Finish::Complete).await;
    (claiming, t.elapsed())
}

/// Claim 8 of a large pending set (timed), then finish them (untimed), as a drain does: every
/// row is claimed once.
fn claim_batch(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    drain_group(c, rt, backends, "claim_batch", |(claiming, _)| claiming);
}

/// Claim 8 (untimed), then finish all 8 `Complete` concurrently (timed), one task each as the
/// runner's slots do.
fn finish_batch(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    drain_group(c, rt, backends, "finish_batch", |(_, finishing)| finishing);
}

fn drain_group(
    c: &mut Criterion,
    rt: &Runtime,
    backends: &[Backend],
    group: &str,
    timed_part: fn((Duration, Duration)) -> Duration,
) {
    let setup = |s: DynStore| async move { seed(&s, PENDING).await };
    per_backend(c, rt, backends, group, BATCH, setup, |b, rt, store| {
        let left = Arc::new(AtomicU64::new(PENDING as u64));
        b.to_async(rt).iter_custom(|iters| {
            let (store, left) = (Arc::clone(store), Arc::clone(&left));
            async move {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    timed += timed_part(drain_step(&store, &left).await);
                }
                timed
            }
        })
    });
}

/// One `enqueue_bulk` of 1000 rows (the rows are prepared outside the timer).
fn bulk_enqueue(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    let setup = |_: DynStore| async {};
    per_backend(
        c,
        rt,
        backends,
        "bulk_enqueue",
        BULK,
        setup,
        |b, rt, store| {
            b.to_async(rt).iter_custom(|iters| {
                let store = Arc::clone(store);
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let rows = prepared(BULK, 0);
                        let t = Instant::now();
                        let done = store.enqueue_bulk(&rows, Utc::now()).await.expect("bulk");
                        timed += t.elapsed();
                        assert_eq!(done.len(), BULK);
                    }
                    timed
                }
            })
        },
    );
}

/// One claim-ahead refill of each of [`RUNNERS`] runners at once (timed): each completes the
/// actions of its previous refill and claims the next [`REFILL`] in one
/// `Store::finish_and_claim` round, as a runner's claim loop does. The pending set is topped up
/// outside the timer; no action may be claimed twice.
fn refill_contention(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    let mut g = c.benchmark_group("claim_ahead_refill");
    g.throughput(Throughput::Elements((RUNNERS * REFILL) as u64));
    for backend in backends {
        let db = rt.block_on(fresh_with(backend, RUNNERS as u32));
        rt.block_on(seed(&db.store, PENDING));
        let left = Arc::new(AtomicU64::new(PENDING as u64));
        let held: Arc<std::sync::Mutex<Vec<Vec<ClaimedAction>>>> =
            Arc::new(std::sync::Mutex::new(vec![Vec::new(); RUNNERS]));
        g.bench_function(backend.name(), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (store, left, held) =
                    (Arc::clone(&db.store), Arc::clone(&left), Arc::clone(&held));
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        if left.load(Ordering::Relaxed) < (RUNNERS * REFILL) as u64 {
                            seed(&store, PENDING).await;
                            left.fetch_add(PENDING as u64, Ordering::Relaxed);
                        }
                        let previous = std::mem::take(&mut *held.lock().expect("held"));
                        let t = Instant::now();
                        let rounds: Vec<_> = previous
                            .into_iter()
                            .enumerate()
                            .map(|(k, prev)| {
                                let store = Arc::clone(&store);
                                tokio::spawn(async move { refill(&store, k, prev).await })
                            })
                            .collect();
                        let mut next = Vec::with_capacity(RUNNERS);
                        for r in rounds {
                            next.push(r.await.expect("refill task"));
                        }
                        timed += t.elapsed();
                        let mut ids: Vec<i64> = next.iter().flatten().map(|a| a.id).collect();
                        let claimed = ids.len();
                        ids.sort_unstable();
                        ids.dedup();
                        assert_eq!(ids.len(), claimed, "an action was claimed twice");
                        left.fetch_sub(claimed as u64, Ordering::Relaxed);
                        *held.lock().expect("held") = next;
                    }
                    timed
                }
            })
        });
        rt.block_on(db.remove());
    }
    g.finish();
}

/// Runner `k`'s round: complete `previous`, claim the next refill.
async fn refill(store: &DynStore, k: usize, previous: Vec<ClaimedAction>) -> Vec<ClaimedAction> {
    let now = Utc::now();
    let owner = format!("{OWNER}-{k}");
    let items: Vec<_> = previous
        .iter()
        .map(|a| (a.lease(), Finish::Complete))
        .collect();
    let req = ClaimRequest {
        owner: &owner,
        limit: REFILL as i64,
        now,
        lease_until: now + chrono::Duration::seconds(300),
        hooks: None,
        routing: None,
    };
    let round = store
        .finish_and_claim(&items, &req, now)
        .await
        .expect("finish_and_claim");
    assert!(round.finished.iter().all(|r| *r == FinishResult::Applied));
    round.claimed.expect("claim")
}

static ITEM: AtomicU64 = AtomicU64::new(0);

fn request(item_id: String) -> ClaimItemRequest {
    ClaimItemRequest {
        identity: Identity::new("bench", "feed", item_id).expect("identity"),
        job_id: None,
        ttl: chrono::Duration::minutes(30),
        completion: CompletionConfig::default(),
        reprocess: false,
        run: None,
    }
}

/// 64 tasks call `Store::claim_item` at once; `same` makes them race for one item (exactly one
/// must win), otherwise each claims its own item (all must win). Every round uses new items.
async fn race(store: &DynStore, same: bool) -> Duration {
    let round = ITEM.fetch_add(1, Ordering::Relaxed);
    let requests: Vec<ClaimItemRequest> = (0..RACERS)
        .map(|k| {
            if same {
                request(format!("same-{round}"))
            } else {
                request(format!("distinct-{round}-{k}"))
            }
        })
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|req| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.claim_item(&req, Utc::now()).await })
        })
        .collect();
    let mut won = 0;
    for t in tasks {
        match t.await.expect("claim task").expect("claim_item") {
            ClaimOutcome::Claimed(_) => won += 1,
            ClaimOutcome::HeldByOther
            | ClaimOutcome::AlreadyProcessed
            | ClaimOutcome::JobNotLive { .. } => {}
        }
    }
    let took = start.elapsed();
    assert_eq!(
        won,
        if same { 1 } else { RACERS },
        "winners of round {round}"
    );
    took
}

fn item_claims(c: &mut Criterion, rt: &Runtime, backends: &[Backend]) {
    for (group, same) in [("item_claim_same", true), ("item_claim_distinct", false)] {
        let setup = |_: DynStore| async {};
        per_backend(c, rt, backends, group, RACERS, setup, |b, rt, store| {
            b.to_async(rt).iter_custom(|iters| {
                let store = Arc::clone(store);
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        timed += race(&store, same).await;
                    }
                    timed
                }
            })
        });
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut backends = vec![Backend::Sqlite];
    match std::env::var("DOCKHAND_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => backends.push(Backend::Postgres(url)),
        _ => eprintln!("PostgreSQL skipped: set DOCKHAND_TEST_POSTGRES_URL to include it"),
    }
    match std::env::var("DOCKHAND_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => backends.push(Backend::Mysql(url)),
        _ => eprintln!("MySQL skipped: set DOCKHAND_TEST_MYSQL_URL to include it"),
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    claim_batch(&mut c, &rt, &backends);
    finish_batch(&mut c, &rt, &backends);
    refill_contention(&mut c, &rt, &backends);
    bulk_enqueue(&mut c, &rt, &backends);
    item_claims(&mut c, &rt, &backends);
    c.final_summary();
}
