//! Opening a [`SqliteStore`] and its inherent API: the writer and reader pools (one shared
//! connection for in-memory databases), the pragmas read back at startup, the migrator, the
//! pool accessor, transactional enqueue and in-process wake-ups, the `BEGIN IMMEDIATE` helper
//! every write transaction starts with, and [`ms`] / [`from_ms`], the stored form of a time.

use super::{enqueue, SqliteStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::{Enqueued, Wakeup};
use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use std::str::FromStr;
use std::time::Duration;

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// Busy timeout for writers in other processes sharing the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite:PATH`, `sqlite://PATH` or
    /// `sqlite::memory:`), checks its pragmas, and returns the store. Does not migrate.
    pub async fn connect(url: &str) -> Result<Self> {
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        let base = SqliteConnectOptions::from_str(url)
            .map_err(|e| crate::store::reach::url_error(url, e))?
            .create_if_missing(true)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        if memory {
            // One connection holds the whole in-memory database; it must never be recycled.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .test_before_acquire(false)
                .connect_with(base)
                .await
                .map_err(Error::db("connect"))?;
            return Ok(Self {
                writer: pool.clone(),
                reader: pool,
                wake: Wakeup::new(),
                enqueues: Default::default(),
                _checkpointer: None,
            });
        }
        let path = base.get_filename().display().to_string();
        let opened = |e: sqlx::Error| match e {
            sqlx::Error::Database(db) => Error::Connect {
                target: format!("SQLite database {path}"),
                reason: format!("cannot open SQLite database {path}: {}", db.message()),
            },
            other => Error::db("connect")(other),
        };
        let opts = base
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        // No liveness ping before each acquire: a local file connection does not go stale, and
        // the ping is a round trip to the worker thread on every store call. The writer never
        // checkpoints: the background checkpointer does (see `Checkpointer`).
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(opts.clone().pragma("wal_autocheckpoint", "0"))
            .await
            .map_err(opened)?;
        check_pragmas(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(opts)
            .await
            .map_err(opened)?;
        let checkpointer = Some(Checkpointer::start(reader.clone()));
        Ok(Self {
            writer,
            reader,
            wake: Wakeup::new(),
            enqueues: Default::default(),
            _checkpointer: checkpointer,
        })
    }

    /// The writer pool, for callers that want transactional enqueue in their own transaction
    /// (see [`SqliteStore::enqueue_in`]).
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// Transactional enqueue: inserts the action inside the caller's open transaction, so it
    /// exists only if the caller commits. Call [`SqliteStore::notify`] after the commit to wake
    /// an idle runner in this process at once (otherwise it is found at the next poll).
    pub async fn enqueue_in(
        tx: &mut Transaction<'_, Sqlite>,
        action: &PreparedAction,
        now: DateTime<Utc>,
    ) -> Result<Enqueued> {
        enqueue::enqueue_one(tx, action, now).await
    }

    /// Wakes runners in this process (after a transactional enqueue commits).
    pub fn notify(&self) {
        self.wake.notify();
    }

    pub(crate) async fn begin_write(
        &self,
        op: &'static str,
    ) -> Result<Transaction<'static, Sqlite>> {
        begin_immediate(&self.writer, op).await
    }
}

/// `BEGIN IMMEDIATE` on `pool`, safe to cancel. sqlx's `begin_with` (0.8) awaits twice: the
/// BEGIN (rolled back by sqlx's worker if its caller is gone) and then a check that the
/// connection is in a transaction; a caller dropped at that second await (a runtime aborted,
/// a timed-out call) leaves the pooled connection inside an open write transaction that no
/// `Transaction` will ever end: every later write on it joins that transaction and never
/// commits, and every later `begin_with` fails with `InvalidSavePointStatement`. The begin
/// therefore runs on its own task: a caller dropped meanwhile drops the finished
/// `Transaction`, which rolls back.
pub(super) async fn begin_immediate(
    pool: &SqlitePool,
    op: &'static str,
) -> Result<Transaction<'static, Sqlite>> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await }).await {
        Ok(begun) => begun.map_err(Error::db(op)),
        // The task panicked or the runtime is shutting down: no transaction to hand out.
        Err(_) => Err(Error::Database {
            op,
            source: sqlx::Error::WorkerCrashed,
        }),
    }
}

/// How often the background checkpointer copies the WAL into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// Checkpoints the WAL from a reader connection in the background (`PRAGMA
/// wal_checkpoint(PASSIVE)`: it waits for nobody and nobody waits for it). SQLite's automatic
/// checkpoint runs inside whichever commit crosses 1000 WAL pages, and its fsync of the
/// database file then lands on that caller: with `synchronous = NORMAL` it is the only fsync
/// on the write path, and it set the tail of enqueue-to-start latency (docs/BENCHMARKS.md).
/// The writer connection has automatic checkpoints off; this task takes them over and stops
/// when the store is dropped or its pools close.
pub(super) struct Checkpointer(tokio::task::JoinHandle<()>);

impl Checkpointer {
    fn start(reader: SqlitePool) -> Self {
        Self(tokio::spawn(async move {
            loop {
                tokio::time::sleep(CHECKPOINT_EVERY).await;
                if reader.is_closed() {
                    return;
                }
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                    .execute(&reader)
                    .await
                {
                    tracing::debug!(error = %e, "background WAL checkpoint failed; retrying");
                }
            }
        }))
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checkpointer")
    }
}

async fn check_pragmas(pool: &SqlitePool) -> Result<()> {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(pool)
        .await
        .map_err(Error::db("check pragmas"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Config(format!(
            "SQLite journal_mode is `{mode}`, expected `wal`"
        )));
    }
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(pool)
        .await
        .map_err(Error::db("check pragmas"))?;
    if busy <= 0 {
        return Err(Error::Config("SQLite busy_timeout did not take".into()));
    }
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(pool)
        .await
        .map_err(Error::db("check pragmas"))?;
    if sync < 1 {
        return Err(Error::Config(format!(
            "SQLite synchronous is {sync}; expected NORMAL (1) or FULL (2)"
        )));
    }
    Ok(())
}

/// Milliseconds since the epoch, the stored form of a time.
pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// A stored time back to a `DateTime`.
pub(crate) fn from_ms(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(v).unwrap_or(DateTime::<Utc>::MIN_UTC)
}
