//! `dockhand bench`: the end-to-end benchmark of DESIGN §10.
//!
//! Each workload runs against a fresh database (`db`): a new SQLite file in the temp directory,
//! a new PostgreSQL schema `dh_bench_<random>`, or a new MySQL/MariaDB database
//! `dh_bench_<random>`, removed afterwards. The workloads
//! (`workloads`) go through the public library API only ([`crate::Queue`], [`crate::Runtime`]),
//! and each prints exactly one line on stdout:
//!
//! `peer=dockhand-sqlite workload=W2 n=10000 concurrency=8 secs=0.41 jobs_per_sec=24390 dup=0
//! durability=sqlite-wal-synchronous-normal`
//!
//! W4 (the batch pipeline, `w4`) prints `items_per_sec` instead of `jobs_per_sec`.

mod db;
mod w4;
mod workloads;

use super::{args, CliError, Output};
use crate::store::redact_url;
use crate::store::timed::{OpTimes, Timed};
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// The environment variable read for `--backend postgres` when `--database-url` is not given.
pub const TEST_POSTGRES_URL_ENV: &str = "DOCKHAND_TEST_POSTGRES_URL";

/// The environment variable read for `--backend mysql` when `--database-url` is not given.
pub const TEST_MYSQL_URL_ENV: &str = "DOCKHAND_TEST_MYSQL_URL";

/// Which database the benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchBackend {
    /// A fresh SQLite file per workload (WAL, synchronous=NORMAL), deleted afterwards.
    Sqlite,
    /// A fresh schema per workload on the server named by --database-url, dropped afterwards.
    Postgres,
    /// A fresh database per workload on the MySQL 8 / MariaDB server named by --database-url,
    /// dropped afterwards.
    Mysql,
}

/// One of the DESIGN §10 workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "verbatim")]
pub enum Workload {
    /// N single enqueues, one call each, sequentially.
    #[value(name = "W1", alias = "w1")]
    W1,
    /// The same N rows through one call of the bulk API.
    #[value(name = "W1b", alias = "w1b", alias = "W1B")]
    W1b,
    /// Drain N pending no-op actions with a runtime of --concurrency slots.
    #[value(name = "W2", alias = "w2")]
    W2,
    /// Enqueue-to-handler-start latency of 200 actions, one every 5 ms, into an idle runtime.
    #[value(name = "W3", alias = "w3")]
    W3,
    /// A batch pipeline over N items: a claim step claims every item in a shared scope and
    /// fans out in chunks of 100; each child runs one no-op step and completes its claim
    /// through the bridge. Items/s from job start to parent final; `check` must be clean.
    #[value(name = "W4", alias = "w4")]
    W4,
}

impl Workload {
    const ALL: [Workload; 5] = [
        Workload::W1,
        Workload::W1b,
        Workload::W2,
        Workload::W3,
        Workload::W4,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W1b => "W1b",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
        }
    }
}

/// Options of `dockhand bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The database to measure. PostgreSQL and MySQL/MariaDB need a server: --database-url,
    /// or the DOCKHAND_TEST_POSTGRES_URL / DOCKHAND_TEST_MYSQL_URL environment variable.
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub backend: BenchBackend,
    /// Jobs per workload for W1, W1b and W2, items for W4 (W3 always measures 200 jobs).
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub n: u32,
    /// Runtime slots (actions run at once) for W2, W3 and W4.
    #[arg(long, value_name = "C", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Actions each runtime claims ahead of its free slots (W2, W3); 0 claims only for free
    /// slots.
    #[arg(long, value_name = "N", default_value_t = crate::runner::DEFAULT_PREFETCH as u32,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub prefetch: u32,
    /// Workloads to run, comma-separated, in this order [default: W1,W1b,W2,W3,W4].
    #[arg(
        long,
        value_enum,
        value_name = "W",
        value_delimiter = ',',
        ignore_case = true
    )]
    pub workload: Vec<Workload>,
    /// Trade durability for speed, for comparison only: SQLite synchronous=OFF on the store's
    /// writer connection, PostgreSQL synchronous_commit=off on the pool's sessions. Not
    /// applied on MySQL, where durability (innodb_flush_log_at_trx_commit, sync_binlog) is a
    /// server-wide setting; it is read back and printed as it is. The default is the durable
    /// configuration (survives a process crash).
    #[arg(long)]
    pub relaxed: bool,
    /// After each workload, print to stderr the calls and wall time of each store method
    /// (per-phase timers, to see where a workload's time goes). Adds a little overhead.
    #[arg(long)]
    pub profile: bool,
    /// Give up on a workload (exit status 1) that has not finished after this long.
    #[arg(long, value_name = "DURATION", default_value = "10m",
          value_parser = args::parse_duration)]
    pub timeout: chrono::Duration,
}

/// What one workload measured; printed as one `key=value` line (or one JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// `dockhand-sqlite`, `dockhand-postgres` or `dockhand-mysql`.
    pub peer: String,
    /// W1, W1b, W2, W3 or W4.
    pub workload: &'static str,
    /// Jobs measured.
    pub n: u64,
    /// Runtime slots (W2, W3, W4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Rows per enqueue_bulk call (W1b); children per chunk (W4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// Wall time of the timed part.
    pub secs: f64,
    /// Throughput (W1, W1b, W2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs_per_sec: Option<f64>,
    /// Pipeline items per second, job start to parent final (W4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items_per_sec: Option<f64>,
    /// Median enqueue-to-handler-start latency (W3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    /// 99th percentile enqueue-to-handler-start latency (W3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    /// Jobs (W4: items) whose handler ran more than once (W2, W3, W4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dup: Option<u64>,
    /// The durability settings in force, read back from the database.
    pub durability: String,
}

impl Measurement {
    /// The `key=value` line.
    pub fn line(&self) -> String {
        let mut s = format!("peer={} workload={} n={}", self.peer, self.workload, self.n);
        if let Some(c) = self.concurrency {
            s.push_str(&format!(" concurrency={c}"));
        }
        if let Some(b) = self.batch {
            s.push_str(&format!(" batch={b}"));
        }
        s.push_str(&format!(" secs={:.2}", self.secs));
        if let Some(r) = self.jobs_per_sec {
            s.push_str(&format!(" jobs_per_sec={r:.0}"));
        }
        if let Some(r) = self.items_per_sec {
            s.push_str(&format!(" items_per_sec={r:.0}"));
        }
        if let (Some(p50), Some(p99)) = (self.p50_ms, self.p99_ms) {
            s.push_str(&format!(" p50_ms={p50:.2} p99_ms={p99:.2}"));
        }
        if let Some(d) = self.dup {
            s.push_str(&format!(" dup={d}"));
        }
        s.push_str(&format!(" durability={}", self.durability));
        s
    }
}

/// `dockhand bench`: runs the chosen workloads one after another, each on a fresh database,
/// printing one line per workload as soon as it is measured.
pub(crate) async fn run(
    database_url: Option<&str>,
    a: &BenchArgs,
    out: Output,
) -> Result<(), CliError> {
    let target = target(a.backend, database_url)?;
    if a.relaxed && a.backend == BenchBackend::Mysql {
        eprintln!(
            "note: --relaxed is not applied with --backend mysql: innodb_flush_log_at_trx_commit \
             and sync_binlog are server-wide settings; the values in force are printed"
        );
    }
    let timeout = args::non_negative("timeout", a.timeout)?;
    if timeout.is_zero() {
        return Err(CliError::Failed("--timeout must be positive".into()));
    }
    let workloads = if a.workload.is_empty() {
        Workload::ALL.to_vec()
    } else {
        let mut w = a.workload.clone();
        let mut seen = Vec::new();
        w.retain(|x| {
            let new = !seen.contains(x);
            seen.push(*x);
            new
        });
        w
    };
    for w in workloads {
        let m = run_one(&target, w, a, timeout).await?;
        if out.is_json() {
            let text = serde_json::to_string(&m)
                .map_err(|e| CliError::Failed(format!("cannot encode output as JSON: {e}")))?;
            out.text(&text)?;
        } else {
            out.text(&m.line())?;
        }
    }
    Ok(())
}

/// Resolves where the databases are created: nothing for SQLite (temp files), a server URL for
/// PostgreSQL and MySQL.
fn target(backend: BenchBackend, database_url: Option<&str>) -> Result<db::Target, CliError> {
    match backend {
        BenchBackend::Sqlite => {
            if let Some(url) = database_url {
                eprintln!(
                    "note: --database-url {} is not used with --backend sqlite: each workload \
                     runs on a fresh temporary SQLite file",
                    redact_url(url)
                );
            }
            Ok(db::Target::Sqlite)
        }
        BenchBackend::Postgres => {
            let env = std::env::var(TEST_POSTGRES_URL_ENV)
                .ok()
                .filter(|s| !s.is_empty());
            let Some(url) = database_url.map(str::to_string).or(env) else {
                return Err(CliError::Failed(format!(
                    "--backend postgres needs a server: pass --database-url \
                     postgres://USER:PASSWORD@HOST/DB (or set {TEST_POSTGRES_URL_ENV})"
                )));
            };
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(CliError::Failed(format!(
                    "--backend postgres needs a postgres:// URL in --database-url, not `{}`",
                    redact_url(&url)
                )));
            }
            Ok(db::Target::Postgres(url))
        }
        BenchBackend::Mysql => {
            let env = std::env::var(TEST_MYSQL_URL_ENV)
                .ok()
                .filter(|s| !s.is_empty());
            let Some(url) = database_url.map(str::to_string).or(env) else {
                return Err(CliError::Failed(format!(
                    "--backend mysql needs a server: pass --database-url \
                     mysql://USER:PASSWORD@HOST/DB (or set {TEST_MYSQL_URL_ENV})"
                )));
            };
            if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
                return Err(CliError::Failed(format!(
                    "--backend mysql needs a mysql:// URL in --database-url, not `{}`",
                    redact_url(&url)
                )));
            }
            Ok(db::Target::Mysql(url))
        }
    }
}

/// One workload on its own fresh database, which is removed afterwards whatever happened.
async fn run_one(
    target: &db::Target,
    w: Workload,
    a: &BenchArgs,
    timeout: Duration,
) -> Result<Measurement, CliError> {
    let mut fresh = db::Fresh::open(target, a.relaxed).await?;
    let times = Arc::new(OpTimes::default());
    if a.profile {
        fresh.store = Timed::wrap(Arc::clone(&fresh.store), Arc::clone(&times));
    }
    let result = tokio::time::timeout(timeout, workloads::run(&fresh, w, a)).await;
    if a.profile {
        eprintln!(
            "profile of {} ({}): store method, calls, total ms, mean us",
            w.name(),
            fresh.peer
        );
        for (op, calls, total) in times.snapshot() {
            eprintln!(
                "  {op:<28} {calls:>8} {:>10.1} {:>9.1}",
                total.as_secs_f64() * 1e3,
                total.as_secs_f64() * 1e6 / calls.max(1) as f64
            );
        }
    }
    let durability = fresh.durability().await;
    fresh.remove().await;
    let mut m = match result {
        Ok(m) => m?,
        Err(_) => {
            return Err(CliError::Failed(format!(
                "workload {} did not finish within --timeout {}",
                w.name(),
                args::format_exact(timeout.as_millis().min(i64::MAX as u128) as i64)
            )))
        }
    };
    m.durability = durability?;
    Ok(m)
}

#[cfg(test)]
mod tests;
