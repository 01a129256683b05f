//! `dockhand chaos`: the multi-process chaos run of RELIABILITY.md §2.
//!
//! The supervisor prepares a fresh database, starts three `dockhand chaos-worker` processes
//! (concurrency 4, lease 2 s, heartbeat 500 ms; two with crash points, one with a clock 30 s
//! ahead), submits a seeded workload ([`workload::Plan`]) while the fault injector
//! ([`faults`]) runs its schedule, then stops the faults, replaces the workers with clean ones,
//! drains, runs `dockhand check` and the invariants ([`verify`]), and writes a summary
//! ([`report`]) as JSON and markdown. A run in which an expected fault kind never fired is
//! "not exercised" and fails like a broken invariant. This module owns the orchestration and
//! the producer; `procs` owns the worker processes; `worker` is the worker's side.

pub mod faults;
pub mod procs;
pub mod report;
pub mod verify;
pub mod worker;
pub mod workload;

use crate::store::chaos::ChaosDb;
use crate::{DatabaseClock, DynStore, JobStatus, Runtime, SystemClock};
use clap::{Args, ValueEnum};
use faults::{FaultLog, FaultPlan};
use procs::{SlotSpec, Workers};
use serde_json::json;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use verify::Acks;
use workload::{Plan, PlanSize};

/// The database a chaos run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// A new SQLite file in the output directory.
    Sqlite,
    /// A new database `dockhand_chaos_<seed>` on the PostgreSQL server of --database-url or
    /// DOCKHAND_TEST_POSTGRES_URL (the immediate-restart fault restarts the local cluster).
    Postgres,
    /// A new database `dockhand_chaos_<seed>` on the MySQL/MariaDB server of --database-url or
    /// DOCKHAND_TEST_MYSQL_URL.
    Mysql,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
        }
    }
}

/// How big and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// About 3 minutes: 75 s of faults over 700 actions, 60 claim jobs and 3 batches of
    /// 200–500 items.
    Ci,
    /// 30 minutes of faults over 100,000 actions, 3,000 claim jobs and 8 batches of 5,000
    /// items; a worker killed every 20-60 s (CI: every 3-8 s).
    Soak,
}

/// Options of `dockhand chaos`.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// The database to run on.
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// The seed of the workload and of the fault schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The run's size and length.
    #[arg(long, value_enum, default_value = "ci")]
    pub profile: Profile,
    /// Override the fault phase's length (e.g. 10m).
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::args::parse_duration)]
    pub duration: Option<chrono::Duration>,
    /// Override the number of plain actions.
    #[arg(long, value_name = "N")]
    pub actions: Option<usize>,
    /// Directory for the summary (summary.json, summary.md), worker logs, the `check`
    /// output and the SQLite file; a subdirectory <backend>-<seed> is used.
    #[arg(long, value_name = "DIR", default_value = "target/chaos")]
    pub out: PathBuf,
    /// Keep the run's database even when the run passes.
    #[arg(long)]
    pub keep: bool,
}

/// A profile's settings.
struct Settings {
    duration: Duration,
    kill_every_ms: (u64, u64),
    cycle: Duration,
    size: PlanSize,
    failpoints: &'static str,
    drain_timeout: Duration,
}

fn settings(a: &ChaosArgs) -> Settings {
    let mut s = match a.profile {
        Profile::Ci => Settings {
            duration: Duration::from_secs(75),
            kill_every_ms: (3000, 8000),
            cycle: Duration::from_secs(75),
            size: PlanSize {
                actions: 700,
                claim_jobs: 60,
                batches: 3,
                batch_items: (200, 500),
                slow_ms: (2500, 4000),
            },
            failpoints: "runner.after_claim=0.3%return;runner.before_finish=0.3%return;\
                         bridge.after_commit=0.5%return;batch.before_chunk=10%return",
            drain_timeout: Duration::from_secs(120),
        },
        // Kills every 3-8 s would leave a 5,000-item split step (a minute of claims on a loaded
        // server) almost no window to finish: it ended retry_exhausted after 40 attempts in
        // the first PostgreSQL soak. Every 20-60 s still kills ~60 workers in 30 minutes.
        Profile::Soak => Settings {
            duration: Duration::from_secs(30 * 60),
            kill_every_ms: (20_000, 60_000),
            cycle: Duration::from_secs(150),
            size: PlanSize {
                actions: 100_000,
                claim_jobs: 3000,
                batches: 8,
                batch_items: (5000, 5000),
                slow_ms: (2500, 6000),
            },
            failpoints: "runner.after_claim=0.02%return;runner.before_finish=0.02%return;\
                         bridge.after_commit=0.05%return;batch.before_chunk=2%return",
            drain_timeout: Duration::from_secs(600),
        },
    };
    if let Some(d) = a.duration.and_then(|d| d.to_std().ok()) {
        s.duration = d.max(Duration::from_secs(20));
        s.cycle = s.cycle.min(s.duration);
    }
    if let Some(n) = a.actions {
        s.size.actions = n;
    }
    s
}

/// The skew of the third worker's clock.
const SKEW_MS: i64 = 30_000;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn err(what: &str) -> impl Fn(std::io::Error) -> crate::Error + '_ {
    move |e| crate::Error::Config(format!("chaos: {what}: {e}"))
}

/// Resolves the run's database: a new SQLite file, or a new database on the server.
async fn database(
    a: &ChaosArgs,
    server: Option<&str>,
    dir: &std::path::Path,
) -> crate::Result<String> {
    let env = |name: &str| std::env::var(name).ok();
    let (server, var) = match a.backend {
        Backend::Sqlite => {
            let path = dir.join("chaos.db");
            for ext in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
            }
            return Ok(format!("sqlite:{}?mode=rwc", path.display()));
        }
        Backend::Postgres => (
            server
                .map(String::from)
                .or_else(|| env("DOCKHAND_TEST_POSTGRES_URL")),
            "DOCKHAND_TEST_POSTGRES_URL",
        ),
        Backend::Mysql => (
            server
                .map(String::from)
                .or_else(|| env("DOCKHAND_TEST_MYSQL_URL")),
            "DOCKHAND_TEST_MYSQL_URL",
        ),
    };
    let server = server.ok_or_else(|| {
        crate::Error::invalid(
            "database_url",
            format!(
                "--backend {} needs a server: pass --database-url or set {var}",
                a.backend.name()
            ),
        )
    })?;
    ChaosDb::create_database(&server, &format!("dockhand_chaos_{}", a.seed)).await
}

fn commit() -> Option<String> {
    if let Ok(c) = std::env::var("DOCKHAND_COMMIT") {
        return Some(c);
    }
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs one chaos run and returns its summary (result `passed` only when every invariant
/// held and every expected fault kind fired).
pub async fn run(server_url: Option<&str>, a: &ChaosArgs) -> crate::Result<report::Summary> {
    let started = Instant::now();
    let commit = commit();
    let st = settings(a);
    let dir = a.out.join(format!("{}-{}", a.backend.name(), a.seed));
    std::fs::create_dir_all(&dir).map_err(err("create the output directory"))?;
    for f in ["w0.log", "w1.log", "w2.log", "c0.log", "c1.log", "c2.log"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let url = database(a, server_url, &dir).await?;
    let store = crate::store::connect(&url).await?;
    store.migrate().await?;
    let db = ChaosDb::connect(&url, 4).await?;
    db.create_ledger().await?;
    let exe = std::env::current_exe().map_err(err("find the dockhand executable"))?;
    let worker_args = [
        "--lease-ms",
        "2000",
        "--heartbeat-ms",
        "500",
        "--concurrency",
        "4",
    ]
    .map(String::from)
    .to_vec();
    let mut workers = Workers::new(exe.clone(), &url, worker_args, &dir);
    let specs = [
        SlotSpec {
            name: "w0".into(),
            skew_ms: 0,
            failpoints: Some(st.failpoints.into()),
        },
        SlotSpec {
            name: "w1".into(),
            skew_ms: 0,
            failpoints: Some(st.failpoints.into()),
        },
        SlotSpec {
            name: "w2".into(),
            skew_ms: SKEW_MS,
            failpoints: None,
        },
    ];
    for s in specs {
        workers.add(s).map_err(err("start a worker"))?;
    }
    let ready_by = Instant::now() + Duration::from_secs(60);
    while !workers.all_ready() {
        if Instant::now() > ready_by {
            return Err(crate::Error::Config(format!(
                "chaos: workers not ready after 60 s (logs in {})",
                dir.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counters = Arc::clone(&workers.counters);
    let workers = Arc::new(Mutex::new(workers));

    // The producer's runtime (not started): enqueue and job starts only.
    let clock = Arc::new(DatabaseClock::new(Arc::new(SystemClock)));
    clock.sync(store.as_ref()).await?;
    let rt = workload::register(
        Runtime::with_store(store.clone()),
        store.clone(),
        clock.clone(),
    )
    .clock(clock)
    .migrate(false)
    .build()
    .await?;
    let plan = Plan::new(a.seed, st.size);
    let log = Arc::new(Mutex::new(FaultLog::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let fault_plan = FaultPlan {
        seed: a.seed,
        duration: st.duration,
        cycle: st.cycle,
        lease: Duration::from_secs(2),
        kill_every_ms: st.kill_every_ms,
        backend: a.backend,
    };
    eprintln!(
        "chaos: {} / {:?} / seed {}: {} actions, {} claim jobs, {} batches; faults for {} s; logs in {}",
        a.backend.name(),
        a.profile,
        a.seed,
        plan.actions.len(),
        plan.claim_jobs.len(),
        plan.batches.len(),
        st.duration.as_secs(),
        dir.display()
    );
    let fault_start = Instant::now();
    let injector = tokio::spawn(faults::inject(
        fault_plan,
        Arc::clone(&workers),
        db.clone(),
        store.clone(),
        Arc::clone(&log),
        stop_rx,
    ));
    let acks = produce(&rt, &plan, st.duration.mul_f64(0.6)).await;
    let _ = injector.await;
    let _ = stop_tx.send(true);
    let fault_phase = fault_start.elapsed();

    // Drain with clean workers.
    eprintln!(
        "chaos: faults stopped after {:.0} s; draining with clean workers",
        fault_phase.as_secs_f64()
    );
    let drain_start = Instant::now();
    {
        let clean = (0..3)
            .map(|i| SlotSpec {
                name: format!("c{i}"),
                skew_ms: 0,
                failpoints: None,
            })
            .collect();
        lock(&workers)
            .replace_all(clean)
            .map_err(err("start the clean workers"))?;
    }
    let drained = drain(&store, st.drain_timeout).await;
    let drain_time = drain_start.elapsed();
    lock(&workers).stop_all();

    // Check and verify.
    let check = std::process::Command::new(&exe)
        .args(["--database-url", &url, "check"])
        .output()
        .map_err(err("run dockhand check"))?;
    let _ = std::fs::write(
        dir.join("check.txt"),
        [check.stdout.as_slice(), check.stderr.as_slice()].concat(),
    );
    let mut verdict = verify::verify(&store, &db, &plan, &acks, check.status.success()).await?;
    if !drained {
        verdict.violations.insert(
            0,
            format!("drain: work left after {} s", st.drain_timeout.as_secs()),
        );
    }
    let offsets: Vec<i64> = lock(&counters.offsets)
        .iter()
        .filter(|(n, _)| n == "w2")
        .map(|(_, ms)| *ms)
        .collect();
    let mut log = std::mem::take(&mut *lock(&log));
    for ms in &offsets {
        if (ms + SKEW_MS).abs() > 1000 {
            verdict.violations.push(format!(
                "skewed clock: the +{SKEW_MS} ms worker measured offset {ms} ms; leases would not compare on the database's clock"
            ));
        }
    }
    if !offsets.is_empty() {
        log.events.push(faults::FaultEvent {
            at_ms: 0,
            kind: faults::kind::SKEW,
            detail: format!(
                "worker w2 ran {} time(s) with its clock +{SKEW_MS} ms ahead",
                offsets.len()
            ),
        });
    }
    let mut counts = log.counts();
    counts.retain(|_, n| *n > 0);
    let not_exercised: Vec<&'static str> = faults::expected(a.backend)
        .into_iter()
        .filter(|k| !counts.contains_key(k))
        .collect();
    let result = if !verdict.violations.is_empty() {
        "failed"
    } else if !not_exercised.is_empty() {
        "not exercised"
    } else {
        "passed"
    };
    let mut summary = report::Summary {
        result: result.into(),
        backend: a.backend.name().into(),
        profile: format!("{:?}", a.profile).to_lowercase(),
        seed: a.seed,
        commit,
        duration_s: started.elapsed().as_secs_f64(),
        fault_phase_s: fault_phase.as_secs_f64(),
        drain_s: drain_time.as_secs_f64(),
        faults: counts,
        not_exercised,
        faults_not_applied: log.failed.clone(),
        stale_completions_rejected: counters
            .lease_lost
            .load(std::sync::atomic::Ordering::Relaxed)
            + counters
                .stale_claims
                .load(std::sync::atomic::Ordering::Relaxed),
        skewed_worker_offsets_ms: offsets,
        recover_p50_ms: None,
        recover_max_ms: None,
        recover_samples: 0,
        verdict,
    };
    summary.recovery(&log);
    let json = serde_json::to_string_pretty(&json!({"summary": &summary, "faults": &log.events}))
        .unwrap_or_default();
    let _ = std::fs::write(dir.join("summary.json"), json);
    let _ = std::fs::write(dir.join("summary.md"), summary.markdown());
    store.close().await;
    db.close().await;
    if summary.result == "passed" && !a.keep {
        cleanup(a, server_url, &dir).await;
    }
    Ok(summary)
}

/// Removes a passed run's database.
async fn cleanup(a: &ChaosArgs, server_url: Option<&str>, dir: &std::path::Path) {
    let name = format!("dockhand_chaos_{}", a.seed);
    let server = |var: &str| {
        server_url
            .map(String::from)
            .or_else(|| std::env::var(var).ok())
    };
    let _ = match a.backend {
        Backend::Sqlite => {
            for ext in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{ext}", dir.join("chaos.db").display()));
            }
            Ok(())
        }
        Backend::Postgres => match server("DOCKHAND_TEST_POSTGRES_URL") {
            Some(s) => ChaosDb::drop_database(&s, &name).await,
            None => Ok(()),
        },
        Backend::Mysql => match server("DOCKHAND_TEST_MYSQL_URL") {
            Some(s) => ChaosDb::drop_database(&s, &name).await,
            None => Ok(()),
        },
    };
}

/// Waits until no action is pending or running and every job is final; false on timeout.
async fn drain(store: &DynStore, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(stats) = store.stats(chrono::Utc::now()).await else {
            continue;
        };
        let busy = ["pending", "running"]
            .iter()
            .map(|s| stats.by_status.get(*s).copied().unwrap_or(0))
            .sum::<i64>();
        if busy > 0 {
            continue;
        }
        let open = store
            .list_jobs(&crate::jobs::JobFilter {
                statuses: vec![
                    JobStatus::Pending,
                    JobStatus::Processing,
                    JobStatus::Waiting,
                ],
                limit: 1,
                ..Default::default()
            })
            .await;
        if matches!(open, Ok(j) if j.is_empty()) {
            return true;
        }
    }
    false
}

/// Submits the plan evenly over `over`: batches first, claim jobs spread among the actions.
/// Each submission is retried (every 250 ms, up to 2 minutes) until acknowledged; unique keys
/// make action retries idempotent, and a job started twice is harmless (its items are
/// claimed once).
async fn produce(rt: &Runtime, plan: &Plan, over: Duration) -> Acks {
    let mut acks = Acks::default();
    let total = plan.actions.len() + plan.claim_jobs.len() + plan.batches.len();
    let gap = over.div_f64(total.max(1) as f64);
    let t0 = Instant::now();
    let every = (plan.actions.len() / plan.claim_jobs.len().max(1)).max(1);
    let mut claim_jobs = plan.claim_jobs.iter();
    let mut n = 0u32;
    let pace = |n: &mut u32| {
        *n += 1;
        t0 + gap * *n
    };
    for (b, (prefix, items)) in plan.batches.iter().enumerate() {
        let input = json!({"prefix": prefix, "n": items});
        let all = workload::batch_items(prefix, *items).collect();
        let pipeline = workload::batch_pipeline_for(b);
        start_job(rt, pipeline, input, all, &mut acks).await;
        tokio::time::sleep_until(pace(&mut n).into()).await;
    }
    for (i, a) in plan.actions.iter().enumerate() {
        if i % every == 0 {
            if let Some(items) = claim_jobs.next() {
                let input = json!({ "items": items });
                start_job(
                    rt,
                    workload::CLAIMS_PIPELINE,
                    input,
                    items.clone(),
                    &mut acks,
                )
                .await;
            }
        }
        let spec = a.spec();
        let mut ok = false;
        for _ in 0..480 {
            if rt.queue().enqueue(spec.clone()).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if ok {
            acks.actions.insert(a.key.clone());
        } else {
            acks.unknown_actions.insert(a.key.clone());
        }
        let until = pace(&mut n);
        if until > Instant::now() {
            tokio::time::sleep_until(until.into()).await;
        }
    }
    for items in claim_jobs {
        let input = json!({ "items": items });
        start_job(
            rt,
            workload::CLAIMS_PIPELINE,
            input,
            items.clone(),
            &mut acks,
        )
        .await;
    }
    acks
}

async fn start_job(
    rt: &Runtime,
    pipeline: &'static str,
    input: serde_json::Value,
    items: Vec<String>,
    acks: &mut Acks,
) {
    for _ in 0..480 {
        if let Ok(id) = rt.jobs().start(pipeline, input.clone()).await {
            acks.jobs.push((id, pipeline, items));
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    acks.unknown_jobs += 1;
}
