//! The chaos run's fault injector: a seeded schedule of process faults (SIGKILL every few
//! seconds, SIGSTOP past the lease, pool exhaustion by SIGUSR1; crash points fire inside the
//! workers) and database faults (PostgreSQL immediate restart, terminated backends, a held row
//! lock or SQLite writer). Every fault is logged with its time; kills are followed until the
//! killed owner's running actions are recovered, for the time-to-recover figures.

use super::procs::Workers;
use super::Backend;
use crate::store::chaos::ChaosDb;
use crate::{ActionQuery, ActionStatus, DynStore};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Fault kinds, as reported.
pub mod kind {
    /// A worker SIGKILLed and restarted.
    pub const SIGKILL: &str = "sigkill";
    /// A worker SIGSTOPped past its lease, then SIGCONTed.
    pub const SIGSTOP: &str = "sigstop";
    /// A worker exited at a named crash point.
    pub const CRASH_POINT: &str = "crash_point";
    /// PostgreSQL restarted in immediate mode.
    pub const PG_RESTART: &str = "pg_immediate_restart";
    /// Every connection to the database terminated, repeatedly, for 10 s.
    pub const TERMINATE: &str = "terminated_backends";
    /// A transaction holding row locks on pending and running actions for 15 s.
    pub const ROW_LOCK: &str = "row_lock_blocker";
    /// SQLite's write lock held for 5 s.
    pub const SQLITE_WRITER: &str = "sqlite_writer_held";
    /// A worker's connection pool held empty for 10 s.
    pub const POOL: &str = "pool_exhaustion";
    /// A worker whose clock is 30 s ahead (leases must still compare on the database's clock).
    pub const SKEW: &str = "skewed_clock";
}

/// The fault kinds a run on `backend` must exercise.
pub fn expected(backend: Backend) -> Vec<&'static str> {
    let mut v = vec![
        kind::SIGKILL,
        kind::SIGSTOP,
        kind::CRASH_POINT,
        kind::POOL,
        kind::SKEW,
    ];
    match backend {
        Backend::Sqlite => v.push(kind::SQLITE_WRITER),
        Backend::Postgres => v.extend([kind::PG_RESTART, kind::TERMINATE, kind::ROW_LOCK]),
        Backend::Mysql => v.extend([kind::TERMINATE, kind::ROW_LOCK]),
    }
    v
}

/// One logged fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    /// Milliseconds since the fault phase began.
    pub at_ms: u64,
    /// Its kind.
    pub kind: &'static str,
    /// What exactly.
    pub detail: String,
}

/// What the injector did.
#[derive(Debug, Default, Serialize)]
pub struct FaultLog {
    /// Every fault, in order.
    pub events: Vec<FaultEvent>,
    /// Kill → all the killed owner's running actions gone, in ms (per kill that held some).
    pub recover_ms: Vec<u64>,
    /// Faults that failed to apply (command missing, refused), with the reason.
    pub failed: Vec<String>,
}

impl FaultLog {
    /// Faults applied, by kind.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for e in &self.events {
            *m.entry(e.kind).or_insert(0) += 1;
        }
        m
    }
}

/// The injector's settings.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// The seed of the schedule.
    pub seed: u64,
    /// How long faults run.
    pub duration: Duration,
    /// Length of one cycle of the scripted faults (repeated while the phase lasts).
    pub cycle: Duration,
    /// The action lease (SIGSTOP lasts lease + 3 s).
    pub lease: Duration,
    /// A worker is SIGKILLed every this many ms (a range).
    pub kill_every_ms: (u64, u64),
    /// The backend.
    pub backend: Backend,
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Ctx {
    workers: Shared<Workers>,
    log: Shared<FaultLog>,
    db: ChaosDb,
    started: Instant,
}

impl Ctx {
    fn record(&self, kind: &'static str, detail: String) {
        let at_ms = self.started.elapsed().as_millis() as u64;
        eprintln!("chaos: t={:.1}s {kind}: {detail}", at_ms as f64 / 1000.0);
        lock(&self.log).events.push(FaultEvent {
            at_ms,
            kind,
            detail,
        });
    }

    fn failed(&self, what: String) {
        eprintln!("chaos: fault not applied: {what}");
        lock(&self.log).failed.push(what);
    }
}

/// Runs the fault schedule until `plan.duration` has passed or `stop` turns true; restarts
/// workers that died meanwhile; follows every kill until the killed owner's running actions
/// are recovered (needs `store`).
pub async fn inject(
    plan: FaultPlan,
    workers: Shared<Workers>,
    db: ChaosDb,
    store: DynStore,
    log: Shared<FaultLog>,
    stop: watch::Receiver<bool>,
) {
    let ctx = Arc::new(Ctx {
        workers,
        log,
        db,
        started: Instant::now(),
    });
    let kills = tokio::spawn(kill_loop(
        Arc::clone(&ctx),
        plan.clone(),
        store,
        stop.clone(),
    ));
    let script = tokio::spawn(script(Arc::clone(&ctx), plan.clone(), stop.clone()));
    let end = Instant::now() + plan.duration;
    while Instant::now() < end && !*stop.borrow() {
        let exits = lock(&ctx.workers).restart_exited();
        for (slot, code) in exits {
            let kind = match code {
                Some(crate::failpoint::CRASH_EXIT_CODE) => kind::CRASH_POINT,
                _ => "worker_exit",
            };
            if kind == kind::CRASH_POINT {
                ctx.record(
                    kind,
                    format!("worker {slot} stopped at a crash point; restarted"),
                );
            } else {
                eprintln!("chaos: worker {slot} exited ({code:?}); restarted");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = script.await;
    let _ = kills.await;
}

/// SIGKILL a random worker every `kill_every_ms` (CI: 3–8 s) and restart it; then follow its
/// running actions until none remain under its owner name.
async fn kill_loop(ctx: Arc<Ctx>, plan: FaultPlan, store: DynStore, stop: watch::Receiver<bool>) {
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ 0x6b69_6c6c);
    let end = ctx.started + plan.duration;
    let mut followers = Vec::new();
    loop {
        let wait = Duration::from_millis(rng.u64(plan.kill_every_ms.0..=plan.kill_every_ms.1));
        if Instant::now() + wait >= end || *stop.borrow() {
            break;
        }
        tokio::time::sleep(wait).await;
        let n = lock(&ctx.workers).len();
        if n == 0 {
            continue;
        }
        let slot = rng.usize(0..n);
        let result = lock(&ctx.workers).kill_and_restart(slot);
        match result {
            Ok(Some(owner)) => {
                ctx.record(
                    kind::SIGKILL,
                    format!("worker {slot} ({owner}) killed; restarted"),
                );
                followers.push(tokio::spawn(follow(Arc::clone(&ctx), store.clone(), owner)));
            }
            Ok(None) => {}
            Err(e) => ctx.failed(format!("restart worker {slot}: {e}")),
        }
    }
    for f in followers {
        let _ = f.await;
    }
}

/// Measures how long the killed `owner`'s running actions take to leave it (reaped and
/// re-run, or finished by a new owner). Gives up after 60 s.
async fn follow(ctx: Arc<Ctx>, store: DynStore, owner: String) {
    let t0 = Instant::now();
    let q = ActionQuery {
        statuses: vec![ActionStatus::Running],
        limit: 5000,
        ..ActionQuery::default()
    };
    let mut held_any = false;
    while t0.elapsed() < Duration::from_secs(60) {
        if let Ok(running) = store.query(&q).await {
            let mine = running
                .iter()
                .filter(|a| a.lease_owner.as_deref() == Some(owner.as_str()))
                .count();
            if mine == 0 {
                if held_any {
                    lock(&ctx.log)
                        .recover_ms
                        .push(t0.elapsed().as_millis() as u64);
                }
                return;
            }
            held_any = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scripted faults of one cycle, at fixed fractions of it, repeated while time remains
/// (the PostgreSQL restart only in the first cycle).
async fn script(ctx: Arc<Ctx>, plan: FaultPlan, stop: watch::Receiver<bool>) {
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ 0x7363_7269);
    let mut cycle_start = ctx.started;
    let mut first = true;
    while cycle_start + plan.cycle <= ctx.started + plan.duration + Duration::from_millis(1) {
        let at = |f: f64| cycle_start + plan.cycle.mul_f64(f);
        let steps: Vec<(f64, &str)> = vec![
            (0.12, "stop"),
            // The row-lock blocker first, while the producer still submits (it needs rows).
            (0.25, "db2"),
            (0.45, "restart"),
            (0.55, "db1"),
            (0.68, "pool"),
            (0.80, "stop"),
        ];
        for (f, step) in steps {
            let when = at(f);
            let now = Instant::now();
            if when > now {
                tokio::time::sleep(when - now).await;
            }
            if *stop.borrow() {
                return;
            }
            let n = lock(&ctx.workers).len().max(1);
            let slot = rng.usize(0..n);
            match step {
                "stop" => pause(&ctx, slot, plan.lease + Duration::from_secs(3)).await,
                "db1" | "db2" => database_fault(&ctx, plan.backend, step == "db1").await,
                "restart" if first && plan.backend == Backend::Postgres => pg_restart(&ctx).await,
                "pool" if lock(&ctx.workers).signal(slot, "-USR1") => {
                    ctx.record(kind::POOL, format!("worker {slot}: pool held for 10 s"));
                }
                _ => {}
            }
        }
        first = false;
        cycle_start += plan.cycle;
    }
}

async fn pause(ctx: &Ctx, slot: usize, for_: Duration) {
    if !lock(&ctx.workers).signal(slot, "-STOP") {
        return;
    }
    ctx.record(
        kind::SIGSTOP,
        format!("worker {slot} stopped for {} ms", for_.as_millis()),
    );
    tokio::time::sleep(for_).await;
    lock(&ctx.workers).signal(slot, "-CONT");
}

/// SQLite: the writer held for 5 s. Servers: the first fault of a cycle terminates every
/// connection every 500 ms for 10 s; the second holds row locks on pending and running actions
/// for 15 s.
async fn database_fault(ctx: &Ctx, backend: Backend, first: bool) {
    if backend == Backend::Sqlite {
        match ctx.db.hold_locks(Duration::from_secs(5)).await {
            Ok(_) => ctx.record(kind::SQLITE_WRITER, "write lock held for 5 s".into()),
            Err(e) => ctx.failed(format!("hold the SQLite writer: {e}")),
        }
        return;
    }
    if first {
        let end = Instant::now() + Duration::from_secs(10);
        let mut total = 0;
        while Instant::now() < end {
            match ctx.db.terminate_backends().await {
                Ok(n) => total += n,
                Err(e) => eprintln!("chaos: terminate backends: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if total == 0 {
            ctx.failed("terminate backends: no connection to terminate".into());
        } else {
            ctx.record(
                kind::TERMINATE,
                format!("{total} connection(s) terminated over 10 s"),
            );
        }
        return;
    }
    let t0 = Instant::now();
    match ctx.db.hold_locks(Duration::from_secs(15)).await {
        Ok(0) => ctx.failed("row lock blocker: no pending or running action to lock".into()),
        Ok(n) => ctx.record(
            kind::ROW_LOCK,
            format!(
                "{n} pending/running action row(s) locked for {} ms",
                t0.elapsed().as_millis()
            ),
        ),
        Err(e) => ctx.failed(format!("row lock blocker: {e}")),
    }
}

/// `pg_ctlcluster <version> main restart` in immediate mode (the local cluster; needs root or
/// the postgres user).
async fn pg_restart(ctx: &Ctx) {
    let version = std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned());
    let Some(version) = version else {
        ctx.failed("PostgreSQL restart: no cluster under /etc/postgresql".into());
        return;
    };
    let t0 = Instant::now();
    let v = version.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("pg_ctlcluster")
            .args([
                "--skip-systemctl-redirect",
                "-m",
                "immediate",
                &v,
                "main",
                "restart",
            ])
            .output()
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match out {
        Ok(o) if o.status.success() => ctx.record(
            kind::PG_RESTART,
            format!(
                "cluster {version}/main restarted (immediate) in {} ms",
                t0.elapsed().as_millis()
            ),
        ),
        Ok(o) => ctx.failed(format!(
            "PostgreSQL restart: pg_ctlcluster exited {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => ctx.failed(format!("PostgreSQL restart: pg_ctlcluster: {e}")),
    }
}
