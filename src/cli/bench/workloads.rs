//! The DESIGN §10 workloads, through the public API only.
//!
//! - W1: N × [`Queue::enqueue`] of `{"n": i}`, sequentially, one task.
//! - W1b: the same N rows through one [`Queue::enqueue_bulk`] call, the specs built before the
//!   timer (the shape of every peer's W1b in the peers' harness: one bulk call of all N jobs
//!   built beforehand).
//! - W2: N pending no-op actions (bulk-enqueued before the timer), a [`Runtime`] with C slots
//!   and a 10 ms poll interval; the timer runs from `start()` until every handler ran and N
//!   actions count complete (`Store::count_actions` over the finished index).
//! - W3: an idle started runtime; [`W3_JOBS`] enqueues one every 5 ms; latency is handler
//!   start − enqueue call start, per job (matched by its `n` arg).
//!
//! Handlers count their runs per job in an atomic array indexed by the `n` arg; `dup` is the
//! number of jobs that ran more than once.

use super::db::Fresh;
use super::{BenchArgs, Measurement, Workload};
use crate::cli::CliError;
use crate::search::{ActionSearch, ActionSort};
use crate::state::ActionStatus;
use crate::store::DynStore;
use crate::{ActionSpec, HandlerError, Queue, Runtime};
use serde_json::json;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The hook every benchmark action uses.
const HOOK: &str = "bench.noop";
/// Rows per `enqueue_bulk` call in W2's setup.
pub(super) const BULK_BATCH: u32 = 1000;
/// Jobs measured by W3.
pub(super) const W3_JOBS: u32 = 200;
/// W3's enqueue spacing.
const W3_SPACING: Duration = Duration::from_millis(5);
/// The runtime's idle poll interval in W2 and W3.
const POLL: Duration = Duration::from_millis(10);

/// Runs workload `w` on `fresh`; the returned measurement's `durability` is filled in by the
/// caller.
pub(super) async fn run(
    fresh: &Fresh,
    w: Workload,
    a: &BenchArgs,
) -> Result<Measurement, CliError> {
    let queue = Queue::new(Arc::clone(&fresh.store));
    let mut m = Measurement {
        peer: fresh.peer.to_string(),
        workload: w.name(),
        n: u64::from(a.n),
        concurrency: None,
        batch: None,
        secs: 0.0,
        jobs_per_sec: None,
        p50_ms: None,
        items_per_sec: None,
        p99_ms: None,
        dup: None,
        durability: String::new(),
    };
    match w {
        Workload::W1 => {
            let start = Instant::now();
            for i in 0..a.n {
                queue.enqueue(spec(i)).await?;
            }
            m.secs = start.elapsed().as_secs_f64();
            expect_status(&queue, "pending", a.n).await?;
        }
        Workload::W1b => {
            let specs: Vec<ActionSpec> = (0..a.n).map(spec).collect();
            let start = Instant::now();
            let ids = queue.enqueue_bulk(specs).await?;
            m.secs = start.elapsed().as_secs_f64();
            expect_ids(ids.len(), a.n)?;
            m.batch = Some(a.n);
            expect_status(&queue, "pending", a.n).await?;
        }
        Workload::W2 => {
            enqueue_bulk(&queue, a.n).await?;
            let counter = Arc::new(RunCounter::new(a.n as usize));
            let c = Arc::clone(&counter);
            let runtime = runtime(fresh, a, move |i| c.ran(i)).await?;
            let start = Instant::now();
            let handle = runtime.start().await?;
            let done = wait_all(&counter, &fresh.store, a.n).await;
            m.secs = start.elapsed().as_secs_f64();
            handle.shutdown().await;
            done?;
            m.concurrency = Some(a.concurrency);
            m.dup = Some(counter.duplicates());
        }
        Workload::W3 => return w3(fresh, a, m).await,
        Workload::W4 => return super::w4::run(fresh, a, m).await,
    }
    m.jobs_per_sec = Some(f64::from(a.n) / m.secs.max(1e-9));
    Ok(m)
}

/// W3: latency from the enqueue call to the handler's start, into an idle runtime.
async fn w3(fresh: &Fresh, a: &BenchArgs, mut m: Measurement) -> Result<Measurement, CliError> {
    let n = W3_JOBS as usize;
    let counter = Arc::new(RunCounter::new(n));
    let enqueued: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; n]));
    let started: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; n]));
    let (c, s) = (Arc::clone(&counter), Arc::clone(&started));
    let runtime = runtime(fresh, a, move |i| {
        let now = Instant::now();
        let first = c.ran(i);
        if first {
            lock(&s)[i] = Some(now);
        }
        first
    })
    .await?;
    let handle = runtime.start().await?;
    // Let the runner settle into its idle wait (and, on PostgreSQL, LISTEN connect).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let result = async {
        let mut tick = tokio::time::interval(W3_SPACING);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let begin = Instant::now();
        for i in 0..W3_JOBS {
            tick.tick().await;
            lock(&enqueued)[i as usize] = Some(Instant::now());
            runtime.queue().enqueue(spec(i)).await?;
        }
        wait_all(&counter, &fresh.store, W3_JOBS).await?;
        Ok::<_, CliError>(begin.elapsed())
    }
    .await;
    handle.shutdown().await;
    m.secs = result?.as_secs_f64();
    let enqueued = lock(&enqueued).clone();
    let started = lock(&started).clone();
    let mut latencies_ms = Vec::with_capacity(n);
    for (i, (e, s)) in enqueued.iter().zip(&started).enumerate() {
        match (e, s) {
            (Some(e), Some(s)) => {
                latencies_ms.push(s.saturating_duration_since(*e).as_secs_f64() * 1000.0)
            }
            _ => {
                return Err(CliError::Failed(format!(
                    "W3: job {i} has no enqueue or start time"
                )))
            }
        }
    }
    latencies_ms.sort_by(f64::total_cmp);
    m.n = u64::from(W3_JOBS);
    m.concurrency = Some(a.concurrency);
    m.p50_ms = Some(percentile(&latencies_ms, 50.0));
    m.p99_ms = Some(percentile(&latencies_ms, 99.0));
    m.dup = Some(counter.duplicates());
    Ok(m)
}

/// The action for job `i`.
fn spec(i: u32) -> ActionSpec {
    ActionSpec::new(HOOK, json!({ "n": i }))
}

/// Enqueues jobs `0..n` through the bulk API, [`BULK_BATCH`] per call.
async fn enqueue_bulk(queue: &Queue, n: u32) -> Result<(), CliError> {
    let mut next = 0;
    while next < n {
        let end = (next + BULK_BATCH).min(n);
        let ids = queue.enqueue_bulk((next..end).map(spec).collect()).await?;
        expect_ids(ids.len(), end - next)?;
        next = end;
    }
    Ok(())
}

/// Fails unless an `enqueue_bulk` of `jobs` jobs returned one id per job.
fn expect_ids(ids: usize, jobs: u32) -> Result<(), CliError> {
    if ids != jobs as usize {
        return Err(CliError::Failed(format!(
            "enqueue_bulk returned {ids} ids for {jobs} jobs"
        )));
    }
    Ok(())
}

/// A runtime over the fresh store with one no-op handler for [`HOOK`]; `on_run(i)` is called
/// at the start of each run of job `i` and returns whether it was that job's first run.
async fn runtime<F>(fresh: &Fresh, a: &BenchArgs, on_run: F) -> Result<Runtime, CliError>
where
    F: Fn(usize) -> bool + Send + Sync + 'static,
{
    let on_run = Arc::new(on_run);
    let runtime = Runtime::with_store(Arc::clone(&fresh.store))
        .migrate(false)
        .concurrency(a.concurrency as usize)
        .prefetch(a.prefetch as usize)
        .poll_interval(POLL)
        .handler(HOOK, move |ctx| {
            let on_run = Arc::clone(&on_run);
            async move {
                let i = ctx.args["n"]
                    .as_u64()
                    .ok_or_else(|| HandlerError::fatal("args without `n`"))?;
                on_run(i as usize);
                Ok(())
            }
        })
        .build()
        .await?;
    Ok(runtime)
}

/// Waits until every job's handler has started once, then until `n` actions are complete.
/// The count walks the finished actions' index (`count_actions`, capped at `n`) rather than
/// `stats`, which groups the whole table: at the end of a 0.2 s drain each `stats` took ~6 ms
/// of the measured time.
async fn wait_all(counter: &RunCounter, store: &DynStore, n: u32) -> Result<(), CliError> {
    counter.all_ran.notified().await;
    let complete = ActionSearch {
        status: Some(ActionStatus::Complete),
        sort: ActionSort::FinishedDesc,
        ..ActionSearch::default()
    };
    loop {
        if store.count_actions(&complete, i64::from(n)).await?.n >= i64::from(n) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Fails unless `stats` counts exactly `n` actions in `status` (W1, W1b check their inserts).
async fn expect_status(queue: &Queue, status: &str, n: u32) -> Result<(), CliError> {
    let stats = queue.stats().await?;
    let got = stats.by_status.get(status).copied().unwrap_or(0);
    if got != i64::from(n) {
        return Err(CliError::Failed(format!(
            "expected {n} {status} actions after the run, found {got}"
        )));
    }
    Ok(())
}

/// Runs per job, and a signal once every job has run at least once.
struct RunCounter {
    runs: Vec<AtomicU32>,
    distinct: AtomicU64,
    all_ran: Notify,
}

impl RunCounter {
    fn new(n: usize) -> Self {
        Self {
            runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
            distinct: AtomicU64::new(0),
            all_ran: Notify::new(),
        }
    }

    /// Counts a run of job `i`; true on its first run. Unknown indexes are ignored.
    fn ran(&self, i: usize) -> bool {
        let Some(slot) = self.runs.get(i) else {
            return false;
        };
        let first = slot.fetch_add(1, Ordering::SeqCst) == 0;
        if first && self.distinct.fetch_add(1, Ordering::SeqCst) + 1 == self.runs.len() as u64 {
            self.all_ran.notify_one();
        }
        first
    }

    fn duplicates(&self) -> u64 {
        self.runs
            .iter()
            .filter(|r| r.load(Ordering::SeqCst) > 1)
            .count() as u64
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The nearest-rank percentile of sorted values (0 for none).
pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
