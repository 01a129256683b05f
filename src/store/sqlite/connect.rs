//! Opening a [`SqliteStore`] and its inherent API: the write connection, the reader pool and
//! the pool for callers' own transactions (one shared connection for in-memory databases),
//! the pragmas read back at startup, the migrator, the pool accessor, transactional enqueue
//! and in-process wake-ups, the write-transaction and write-connection helpers every write
//! goes through (see `writer`), and [`ms`] / [`from_ms`], the stored form of a time.

use super::writer::{WriteConn, WriteTx, Writer};
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
                writer: Writer::Pooled(pool.clone()),
                pool: pool.clone(),
                reader: pool,
                wake: Wakeup::new(),
                enqueues: Default::default(),
                limits_seen: Default::default(),
                queue_shallow: true.into(),
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
        // the ping is a round trip to the worker thread on every store call. The writers never
        // checkpoint: the background checkpointer does (see `Checkpointer`).
        let write_opts = opts.clone().pragma("wal_autocheckpoint", "0");
        let writer = match Writer::open(&write_opts, url, BUSY_TIMEOUT).await {
            Err(Error::Database { source, .. }) => return Err(opened(source)),
            other => other?,
        };
        // Migrations and callers' own transactions (`pool`, `enqueue_in`); they share the
        // file's write lock with `writer` through SQLite's busy timeout.
        // No reaper task (sqlx#3645, see `store::pool`): a local file's connections neither
        // go stale nor need recycling.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_with(write_opts)
            .await
            .map_err(opened)?;
        check_pragmas(&pool).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_with(opts)
            .await
            .map_err(opened)?;
        let checkpointer = Some(Checkpointer::start(reader.clone()));
        Ok(Self {
            writer,
            pool,
            reader,
            wake: Wakeup::new(),
            enqueues: Default::default(),
            limits_seen: Default::default(),
            queue_shallow: true.into(),
            _checkpointer: checkpointer,
        })
    }

    /// A write pool for callers that want transactional enqueue in their own transaction (see
    /// [`SqliteStore::enqueue_in`]). It is not the store's own write connection: a caller's
    /// transaction and the store's writes take turns at the file's write lock (SQLite's busy
    /// timeout, 10 s), so keep such transactions short.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
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

    /// Starts a write transaction on the store's write connection (`BEGIN IMMEDIATE`).
    pub(crate) async fn begin_write(&self, op: &'static str) -> Result<WriteTx> {
        self.writer.begin(op).await
    }

    /// `PRAGMA synchronous = OFF` on the store's write connections and the callers' pool, for
    /// `dockhand bench --relaxed` (a comparison of durability settings): commits are no longer
    /// flushed at checkpoints, so an operating-system crash or power loss may lose the last
    /// ones (a process crash still loses nothing). Not for production use.
    #[doc(hidden)]
    pub async fn relax_synchronous(&self) -> Result<()> {
        let op = "PRAGMA synchronous = OFF";
        sqlx::query(op)
            .execute(&mut *self.write_conn(op).await?)
            .await
            .map_err(Error::db(op))?;
        sqlx::query(op)
            .execute(&self.pool)
            .await
            .map_err(Error::db(op))?;
        if self.writer.has_direct() {
            self.writer
                .direct(op, |conn| {
                    conn.pragma_update(None, "synchronous", "OFF")
                        .map_err(super::direct::db_error(op))
                })
                .await?;
        }
        Ok(())
    }

    /// The store's writer, for work that outlives a borrow of the store (group commits).
    pub(super) fn writer_handle(&self) -> Writer {
        self.writer.clone()
    }

    /// The store's write connection for autocommit statements.
    pub(super) async fn write_conn(&self, op: &'static str) -> Result<WriteConn> {
        self.writer.conn(op).await
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
