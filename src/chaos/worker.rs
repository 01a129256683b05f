//! `dockhand chaos-worker`: one worker process of a chaos run — an ordinary runtime serving the
//! workload of [`super::workload`], with the run's lease settings, crash points from
//! `FAILPOINTS`, an optional skewed clock, and SIGUSR1 to hold its connection pool empty for a
//! while (the pool-exhaustion fault). Lines on stderr the supervisor reads: `chaos worker
//! ready`, `clock offset <ms> ms`, and the runtime's warnings.

use super::workload;
use crate::clock::{Clock, DatabaseClock, OffsetClock, SystemClock};
use crate::error::{Error, Result};
use crate::maintenance::MaintenanceConfig;
use crate::store::chaos::ChaosDb;
use crate::store::mysql::MySqlStore;
use crate::store::postgres::PgStore;
use crate::store::sqlite::SqliteStore;
use crate::{Backoff, DynStore, Runtime};
use clap::Args;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `dockhand chaos-worker` (started by `dockhand chaos`, not by hand).
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Action lease, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// Heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub heartbeat_ms: u64,
    /// Actions run at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Shift this process's clock by this many milliseconds (a skewed host).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub clock_skew_ms: i64,
    /// This worker's name (the lease owner is `<name>-<pid>`).
    #[arg(long, default_value = "chaos")]
    pub name: String,
    /// How long SIGUSR1 holds the pool empty, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub exhaust_ms: u64,
}

/// Opens the store and a [`ChaosDb`] over the same pool.
async fn open(url: &str) -> Result<(DynStore, ChaosDb)> {
    if url.starts_with("sqlite:") {
        let s = SqliteStore::connect(url).await?;
        let db = ChaosDb::Sqlite(s.pool().clone());
        return Ok((Arc::new(s), db));
    }
    if url.starts_with("postgres") {
        let s = PgStore::connect(url).await?;
        let db = ChaosDb::Postgres(s.pool().clone());
        return Ok((Arc::new(s), db));
    }
    let s = MySqlStore::connect(url).await?;
    let db = ChaosDb::MySql(s.pool().clone());
    Ok((Arc::new(s), db))
}

/// Runs the worker until SIGTERM, then shuts down gracefully.
pub async fn run(url: &str, a: &WorkerArgs) -> Result<()> {
    crate::failpoint::configure_from_env().map_err(|e| Error::invalid("FAILPOINTS", e))?;
    let (store, pool) = open(url).await?;
    store.migrate().await?;
    let base: Arc<dyn Clock> = Arc::new(OffsetClock::new(
        Arc::new(SystemClock),
        chrono::Duration::milliseconds(a.clock_skew_ms),
    ));
    let clock = Arc::new(DatabaseClock::new(base));
    let offset = clock.sync(store.as_ref()).await?;
    eprintln!("clock offset {} ms", offset.num_milliseconds());
    let owner = format!("{}-{}", a.name, std::process::id());
    let rt = workload::register(
        Runtime::with_store(store.clone()),
        store.clone(),
        clock.clone(),
    )
    .clock(clock.clone())
    .owner(owner.clone())
    .concurrency(a.concurrency)
    .lease(
        Duration::from_millis(a.lease_ms),
        Duration::from_millis(a.heartbeat_ms),
    )
    .backoff(Backoff::fixed_exponential(
        Duration::from_millis(100),
        2.0,
        Duration::from_secs(2),
    ))
    .poll_interval(Duration::from_millis(200))
    .maintenance(MaintenanceConfig {
        tick: Duration::from_millis(250),
        reaper_interval: Duration::from_millis(a.lease_ms.clamp(250, 5000) / 2),
        ..MaintenanceConfig::default()
    })
    .migrate(false)
    .build()
    .await?;
    let handle = rt.start().await?;
    let sync = {
        let (clock, store) = (clock.clone(), store.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let _ = clock.sync(store.as_ref()).await;
            }
        })
    };
    eprintln!("chaos worker ready: owner {owner}");
    let io = |e: std::io::Error| Error::Config(format!("signal handler: {e}"));
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(io)?;
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(io)?;
    // A worker whose supervisor died (killed, timed out) stops too instead of lingering.
    let parent = std::os::unix::process::parent_id();
    let mut orphan_check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = orphan_check.tick() => {
                if std::os::unix::process::parent_id() != parent {
                    eprintln!("supervisor gone; stopping");
                    break;
                }
            }
            _ = usr1.recv() => {
                let (pool, hold) = (pool.clone(), Duration::from_millis(a.exhaust_ms));
                tokio::spawn(async move {
                    let n = pool.exhaust_pool(hold).await;
                    eprintln!("pool exhausted: held {n} connection(s) for {} ms", hold.as_millis());
                });
            }
        }
    }
    sync.abort();
    handle.shutdown().await;
    store.close().await;
    Ok(())
}
