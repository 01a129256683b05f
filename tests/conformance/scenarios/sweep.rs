//! The fault-point sweep (RELIABILITY.md §1): one small workload ([`super::sweep_workload`]:
//! a batch in chunks, a two-step job holding one claim, a job whose step fails until its
//! retries run out, a batch the operator cancels mid-flight, a batch whose fan-out step the
//! operator cancels and then retries by hand, and two plain actions) is run once over a
//! [`FaultyStore`] without faults to learn its sequence of store calls; then, for every call of
//! the methods in [`SWEPT`], on a fresh database, the workload is run with that call faulted
//! (`FailBefore`, `ExecuteThenFail`, and `Retryable` where the caller treats a transient error
//! apart, [`TRANSIENT_AWARE`]; the first call of each method also `Delay`ed), the store healed, the queue drained as an
//! operator would (clock past leases and backoffs, maintenance, `recover-stuck`), and the
//! invariants of RELIABILITY.md §3 asserted (see [`invariants`]).
//!
//! Besides single faults, every such call is also a crash point: the call commits, then the
//! process stops (every later store call fails) until a restarted runtime carries on. And a
//! call of a [`FIRST_OF_TWO`] method that fails is followed by a second fault in its recovery:
//! the next call of each [`RECOVERY`] method fails too.
//!
//! Each point starts from an emptied database (every table cleared, the clock reset); the
//! points run in [`WORKERS`] shards on separate databases. One summary line per backend goes
//! to stderr. This file owns the workload and the driver; `sweep_checks` owns the invariant
//! checks. A point that breaks an invariant is a bug: keep it as a named `sweep_regression_*`
//! scenario here (none so far).

use super::sweep_checks::{all_jobs, invariants, settled};
use super::sweep_workload::{
    cancel_batch, cancel_invariant, items, produce, retry_refan_step, runtime, Operator,
    LEDGER_DDL, NS,
};
use crate::harness::{t0, TestDb};
use dockhand::batch::recovery::RecoverOptions;
use dockhand::store::faulty::{CallHook, FaultMode, FaultyStore};
use dockhand::Runtime;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

/// Drive rounds (each: drain, recover-stuck, clock forward) before giving up.
const MAX_ROUNDS: usize = 12;
/// Runs per drain.
const DRAIN_RUNS: usize = 500;
/// Points run at once, each worker on its own database.
const WORKERS: usize = 3;

/// Store methods whose calls are sweep points: the claim, batch, bridge and queue
/// transitions, and the maintenance writes (the first [`MAINTENANCE_CALLS`] of each). Reads
/// are left out, except the chunk action's hydration read (`packet_bodies`), which fails
/// between the chunk's row lease and its children.
pub const SWEPT: &[&str] = &[
    "enqueue",
    "claim",
    "finish",
    "finish_many",
    "put_packets",
    "create_job",
    "start_step",
    "start_steps",
    "advance_job",
    "finish_job",
    "finish_jobs",
    "claim_item",
    "claim_items",
    "complete_claim",
    "release_claim",
    "fan_out",
    "schedule_chunk",
    "lease_work",
    "packet_bodies",
    "create_child",
    "create_children",
    "settle_work",
    "fence_batch",
    "abort_batch",
    "reap_expired",
    "mark_event_delivered",
    "mark_events_unheard",
    "cleanup_worklist",
];

/// Methods whose failing call is followed by a second fault in its recovery ([`Point::Double`]):
/// the batch and bridge transitions whose failure routes write again.
pub const FIRST_OF_TWO: &[&str] = &[
    "schedule_chunk",
    "create_child",
    "create_children",
    "settle_work",
    "fence_batch",
    "abort_batch",
    "finish_job",
    "finish_jobs",
    "fan_out",
];

/// The batch engine's writes the operator's cancel is landed right before
/// ([`Point::CancelBefore`]): a chunk or child whose run is under way when the cancel commits.
pub const INTERLEAVED: &[&str] = &[
    "lease_work",
    "create_child",
    "create_children",
    "settle_work",
    "start_step",
    "start_steps",
];

/// The writes a failure route makes (re-arming an action, finishing a job through the
/// bridge, failing a batch): each gets the second fault of a [`Point::Double`].
pub const RECOVERY: &[&str] = &["finish_job", "finish_jobs", "schedule_chunk"];

/// Methods whose caller tells a transient error from another and retries it in place (the
/// runner's action finish, the chunk enqueue, a completion handler's claim transaction): only
/// for these does `Retryable` take another route than `FailBefore`. Every other caller maps
/// any store error alike (`?`, `HandlerError::retry`), so its `Retryable` point would repeat
/// its `FailBefore` point and is not swept (CI time).
const TRANSIENT_AWARE: &[&str] = &["finish", "finish_many", "schedule_chunk", "complete_claim"];

/// Maintenance methods run on every drain round; only their first calls are swept (later
/// ones repeat the same situation).
const MAINTENANCE: &[&str] = &[
    "reap_expired",
    "mark_event_delivered",
    "mark_events_unheard",
    "cleanup_worklist",
];
/// How many calls of each maintenance method are swept.
const MAINTENANCE_CALLS: u64 = 2;

/// The clock step between drive rounds: past the claim TTL (30 min), the row lease (5 min),
/// action leases (30 s) and the test backoff.
fn round() -> chrono::Duration {
    chrono::Duration::minutes(31)
}

/// What a sweep run injects.
#[derive(Debug, Clone, Copy)]
pub enum Point {
    /// The `nth` call of `method` fails in `mode`; the process goes on.
    Fault {
        method: &'static str,
        nth: u64,
        mode: FaultMode,
    },
    /// The process crashes at its `at`-th store call (a `method` call): that call commits,
    /// its caller sees an error, and no later call runs until a restarted runtime carries on.
    /// (Crashing before call k leaves the state of crashing after call k - 1.)
    Crash { method: &'static str, at: u64 },
    /// The operator cancels the `cancel` batch right before the `nth` call of `method` runs
    /// (between two store calls of whatever handler makes it).
    CancelBefore { method: &'static str, nth: u64 },
    /// The `nth` call of `method` fails (`FailBefore`), and so does the `then_nth` call of
    /// `then`: the first call of it after the first fault, made by whatever recovers from it.
    Double {
        method: &'static str,
        nth: u64,
        then: &'static str,
        then_nth: u64,
    },
}

impl Point {
    fn method(&self) -> &'static str {
        match self {
            Point::Fault { method, .. }
            | Point::Crash { method, .. }
            | Point::CancelBefore { method, .. }
            | Point::Double { method, .. } => method,
        }
    }
}

/// What one run of the workload left.
pub struct RunReport {
    /// Store calls of the workload phase (before the heal).
    pub log: Vec<&'static str>,
    /// Whether the planned fault fired.
    pub fired: bool,
    /// The final status (and reason) of the pipeline job(s), and how many items were
    /// processed.
    pub outcome: String,
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Jobs only `recover-stuck` moved on (requeued, chunk re-armed, parent completed, failed
    /// stale): no durable wake-up was left for them.
    pub rescued: u64,
}

/// Every table the store writes, and the sweep ledger: emptied before each point.
const TABLES: [&str; 11] = [
    "dockhand_action_logs",
    "dockhand_actions",
    "dockhand_item_claims",
    "dockhand_job_events",
    "dockhand_jobs",
    "dockhand_maintenance_leases",
    "dockhand_packets",
    "dockhand_schedules",
    "dockhand_tracked_items",
    "dockhand_worklist",
    "sweep_ledger",
];

/// Makes `db` fresh for the next point: every table emptied, the clock back at `t0`. (A new
/// schema or database per point costs ~0.35 s on PostgreSQL and MySQL; emptying ~20 ms.)
async fn reset(db: &TestDb) {
    let stmts: Vec<String> = TABLES.iter().map(|t| format!("DELETE FROM {t}")).collect();
    let stmts: Vec<&str> = stmts.iter().map(String::as_str).collect();
    db.exec_all(&stmts).await;
    db.clock.set(t0());
}

/// Runs the workload on `db` (emptied first) with `fault` planned, heals, drains, and checks
/// the invariants.
pub async fn run_point(db: &TestDb, point: Option<Point>) -> RunReport {
    reset(db).await;
    let faulty = FaultyStore::wrap(db.store.clone());
    match point {
        None => {}
        Some(Point::Fault { method, nth, mode }) => faulty.fail_nth(method, nth, mode),
        Some(Point::Crash { at, .. }) => faulty.crash_at(at, FaultMode::ExecuteThenFail),
        Some(Point::CancelBefore { .. }) => {}
        Some(Point::Double {
            method,
            nth,
            then,
            then_nth,
        }) => {
            faulty.fail_nth(method, nth, FaultMode::FailBefore);
            faulty.fail_nth(then, then_nth, FaultMode::FailBefore);
        }
    }
    let crash = matches!(point, Some(Point::Crash { .. }));
    let operator = Arc::new(Operator::default());
    if let Some(Point::CancelBefore { method, nth }) = point {
        let (store, clock, operator) = (db.store.clone(), db.clock.clone(), operator.clone());
        let hook: CallHook = Arc::new(move || {
            let (store, clock, operator) = (store.clone(), clock.clone(), operator.clone());
            Box::pin(async move {
                let _ = cancel_batch(store, clock, operator).await;
            })
        });
        faulty.before_call(method, nth, hook);
    }
    let rt = runtime(db, &faulty, &operator).await;
    // The producer: one job and the plain actions, each failure retried once at once.
    produce(db, &rt).await;
    let mut rescued = 0;
    let _ = drive(
        db,
        &rt,
        &operator,
        true,
        crash.then_some(&*faulty),
        &mut rescued,
    )
    .await;
    let log = faulty.call_log();
    faulty.heal();
    // After a crash, a restarted process: a new runtime, and the producer re-submits what it
    // cannot find.
    let rt = if crash {
        let rt = runtime(db, &faulty, &operator).await;
        produce(db, &rt).await;
        rt
    } else {
        rt
    };
    let mut violations = Vec::new();
    if let Err(e) = drive(db, &rt, &operator, false, None, &mut rescued).await {
        violations.push(format!("drain after heal: {e}"));
    }
    violations.extend(invariants(db).await);
    violations.extend(cancel_invariant(db, &operator).await);
    let outcome = all_jobs(db)
        .await
        .into_iter()
        .filter(|j| j.parent_id.is_none())
        .map(|j| match j.reason {
            Some(r) => format!("{} {}/{r}", j.pipeline, j.status),
            None => format!("{} {}", j.pipeline, j.status),
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>();
    let mut done = 0;
    for item in items() {
        done += usize::from(db.store.tracked_item(NS, &item).await.unwrap().is_some());
    }
    let outcome = format!("{}, {done}/{} items", outcome.join(" + "), items().len());
    let fired = faulty.injected() > 0;
    RunReport {
        log,
        fired,
        outcome,
        violations,
        rescued,
    }
}

/// Like [`Runtime::drain`], but runs maintenance only when nothing is due (a worker that
/// keeps busy, with the maintenance loop on its own cadence): fewer store calls per point.
async fn drain(rt: &Runtime) -> dockhand::Result<()> {
    let mut total = 0;
    loop {
        rt.run_maintenance_once().await?;
        let mut ran = 0;
        loop {
            let n = rt.run_due_once().await?;
            ran += n;
            if n == 0 || total + ran >= DRAIN_RUNS {
                break;
            }
        }
        total += ran;
        if ran == 0 || total >= DRAIN_RUNS {
            return Ok(());
        }
    }
}

/// Drains, lets the operator recover stranded jobs, and moves the clock on, until nothing is
/// left to do. With `tolerate`, store errors (the injected fault) are ignored; with `crashed`,
/// it stops once that store has crashed. Adds the jobs `recover-stuck` moved to `rescued`.
async fn drive(
    db: &TestDb,
    rt: &Runtime,
    operator: &Operator,
    tolerate: bool,
    crashed: Option<&FaultyStore>,
    rescued: &mut u64,
) -> Result<(), String> {
    let opts = RecoverOptions {
        dry_run: false,
        limit: 100,
        older_than: chrono::Duration::zero(),
    };
    for _ in 0..MAX_ROUNDS {
        match drain(rt).await {
            Err(e) if !tolerate => return Err(format!("drain: {e}")),
            _ => {}
        }
        // The operator retries the cancelled fan-out step by hand while its batch runs.
        retry_refan_step(db, rt, operator).await;
        if crashed.is_some_and(|f| f.injected() > 0) || settled(db).await {
            return Ok(());
        }
        match rt.jobs().recover_stuck(&opts).await {
            Err(e) if !tolerate => return Err(format!("recover-stuck: {e}")),
            Err(_) => {}
            Ok(r) if r.errors > 0 && !tolerate => {
                return Err(format!("recover-stuck: job errors {:?}", r.jobs))
            }
            Ok(r) => {
                *rescued +=
                    r.requeued + r.chunk_rearmed + r.batch_parents_completed + r.failed_stale
            }
        }
        db.clock.advance(round());
    }
    Ok(())
}

/// The sweep points of a counting-pass call log: every call of a [`SWEPT`] method, faulted
/// `FailBefore`, `ExecuteThenFail` and `Retryable` (and the first call of each method
/// `Delay`ed), and a crash right after it. Left out: `claim` calls that found nothing (the
/// next call is another claim or maintenance), and crashes right after an action's `finish`
/// (the process had nothing in flight: a clean stop).
pub fn points(log: &[&'static str]) -> Vec<Point> {
    let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut faults, mut crashes, mut doubles, mut interleaved) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, method) in log.iter().enumerate() {
        let nth = seen.entry(method).or_default();
        *nth += 1;
        let next = log.get(k + 1).copied();
        let empty_claim =
            *method == "claim" && matches!(next, None | Some("claim" | "reap_expired"));
        if !SWEPT.contains(method)
            || empty_claim
            || (MAINTENANCE.contains(method) && *nth > MAINTENANCE_CALLS)
        {
            continue;
        }
        let mut modes = vec![FaultMode::FailBefore, FaultMode::ExecuteThenFail];
        if TRANSIENT_AWARE.contains(method) {
            modes.push(FaultMode::Retryable);
        }
        // A delay only reorders work against the frozen test clock; once per method is
        // enough here (real delays are the chaos run's paused workers and held locks).
        if *nth == 1 {
            modes.push(FaultMode::Delay(std::time::Duration::from_millis(20)));
        }
        for mode in modes {
            faults.push(Point::Fault {
                method,
                nth: *nth,
                mode,
            });
        }
        if *method != "finish" {
            crashes.push(Point::Crash {
                method,
                at: k as u64 + 1,
            });
        }
        if INTERLEAVED.contains(method) {
            interleaved.push(Point::CancelBefore { method, nth: *nth });
        }
        if FIRST_OF_TWO.contains(method) {
            for then in RECOVERY {
                // The next call of `then` after this one: the calls before the fault are the
                // counting pass's, so it is the one after `then`'s calls so far.
                let so_far = log[..=k].iter().filter(|m| *m == then).count() as u64;
                doubles.push(Point::Double {
                    method,
                    nth: *nth,
                    then,
                    then_nth: so_far + 1,
                });
            }
        }
    }
    faults.extend(crashes);
    faults.extend(doubles);
    faults.extend(interleaved);
    faults
}

/// The sweep on one backend: a counting pass, then every point (every fault mode, and a
/// crash). Prints one
/// summary line to stderr and fails listing every point that broke an invariant.
pub async fn sweep_fault_points(db: TestDb) {
    let kind = db.kind;
    db.exec_sql(LEDGER_DDL).await;
    let started = Instant::now();
    let clean = run_point(&db, None).await;
    assert!(
        clean.violations.is_empty(),
        "the workload without faults breaks invariants: {:?}",
        clean.violations
    );
    assert_eq!(
        clean.outcome,
        "cancel cancelled/manual + doomed failed/retry_exhausted + refan completed + \
         solo completed + sweep completed, 9/13 items",
        "the workload without faults"
    );
    let all = points(&clean.log);
    let crashes = all
        .iter()
        .filter(|p| matches!(p, Point::Crash { .. }))
        .count();
    let doubles = all
        .iter()
        .filter(|p| matches!(p, Point::Double { .. }))
        .count();
    let interleaved = all
        .iter()
        .filter(|p| matches!(p, Point::CancelBefore { .. }))
        .count();
    let mut per_method: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &all {
        *per_method.entry(p.method()).or_default() += 1;
    }
    // The points run in WORKERS interleaved shards, each on its own database.
    let mut shards = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let db = if w == 0 {
            db.clone()
        } else {
            let extra = TestDb::new(kind).await.expect("backend configured");
            extra.exec_sql(LEDGER_DDL).await;
            extra
        };
        let mine: Vec<Point> = all.iter().skip(w).step_by(WORKERS).copied().collect();
        shards.spawn(async move {
            let mut reports = Vec::new();
            for p in mine {
                reports.push((p, run_point(&db, Some(p)).await));
            }
            if w > 0 {
                db.cleanup().await;
            }
            reports
        });
    }
    let (mut fired, mut failing) = (0, Vec::new());
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    // Single faults that only recover-stuck repaired (no durable wake-up was left), by method
    // and mode; and how many crash points needed it.
    let mut rescued: BTreeMap<String, usize> = BTreeMap::new();
    let mut crash_rescued = 0;
    while let Some(reports) = shards.join_next().await {
        for (p, r) in reports.expect("sweep shard") {
            fired += usize::from(r.fired);
            match p {
                // The process went on after a single fault: it must have left a durable
                // wake-up (RELIABILITY.md §1); needing the operator is a failure.
                Point::Double { method, then, .. } if r.rescued > 0 => {
                    *rescued.entry(format!("{method} then {then}")).or_default() += 1;
                    failing.push(format!(
                        "{p:?}: only recover-stuck moved {} job(s) on",
                        r.rescued
                    ));
                }
                Point::Fault { method, mode, .. } if r.rescued > 0 => {
                    *rescued.entry(format!("{method} {mode:?}")).or_default() += 1;
                    failing.push(format!(
                        "{p:?}: only recover-stuck moved {} job(s) on",
                        r.rescued
                    ));
                }
                Point::CancelBefore { method, .. } if r.rescued > 0 => {
                    *rescued
                        .entry(format!("cancel before {method}"))
                        .or_default() += 1;
                    failing.push(format!(
                        "{p:?}: only recover-stuck moved {} job(s) on",
                        r.rescued
                    ));
                }
                // After a crash between two store calls, recover-stuck is the documented path.
                Point::Crash { .. } if r.rescued > 0 => crash_rescued += 1,
                _ => {}
            }
            *outcomes.entry(r.outcome).or_default() += 1;
            if !r.violations.is_empty() {
                failing.push(format!("{p:?}: {:?}", r.violations));
            }
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "sweep[{kind:?}]: {} store calls in the workload; {} points swept ({} faults: \
         FailBefore, ExecuteThenFail, Retryable, Delay; {} crashes; {doubles} double faults; \
         {interleaved} cancels between two store calls); \
         {fired} faults injected, {} not exercised, \
         {} failing; outcomes {outcomes:?}; repaired only by recover-stuck: faults {rescued:?}, \
         {crash_rescued} crashes; points by method {per_method:?}; {:.1}s",
        clean.log.len(),
        all.len(),
        all.len() - crashes - doubles - interleaved,
        crashes,
        all.len() - fired,
        failing.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failing.is_empty(),
        "failing sweep points:\n{}",
        failing.join("\n")
    );
}
