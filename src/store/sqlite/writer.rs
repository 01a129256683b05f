//! The SQLite store's one write connection, held for the store's lifetime.
//!
//! SQLite has one writer at a time, so every write of a store goes through one connection.
//! sqlx's pool answers each release of a connection with a liveness ping (a round trip to the
//! connection's worker thread) on a spawned task before the next caller can have it: on a
//! one-connection writer pool that is one extra worker round trip and two task hops per write,
//! about as much again as a single-row insert costs. A file database's writer is therefore one
//! connection opened outside any pool and lent out behind a fair (FIFO) async mutex:
//! [`Writer::conn`] for autocommit statements, [`Writer::begin`] for `BEGIN IMMEDIATE`
//! transactions ([`WriteTx`]).
//!
//! Cancellation: a caller dropped at any await leaves no transaction open on the connection.
//! The slot is marked as possibly inside a transaction before `BEGIN` is sent and unmarked only
//! once `COMMIT` or `ROLLBACK` returned; whoever takes a marked slot rolls back first. A
//! [`WriteTx`] dropped without a commit rolls back on a spawned task that holds the slot, so
//! the write lock is given up at once and the next caller finds the connection clean.
//!
//! A file database's enqueues run on a second connection, rusqlite's on a thread of its own
//! ([`Writer::direct`], see `direct`), lent with the same slot: one job and one answer per
//! write instead of a worker round trip per statement.
//!
//! In-memory databases live in one pooled connection that readers share; there the writer
//! lends pooled connections and transactions are sqlx's own, begun on a task of their own
//! (sqlx's begin awaits twice, and a caller dropped between the two would leave the pooled
//! connection inside a transaction nobody ends).

use super::direct::{Connection as DirectConn, Direct};
use crate::error::{Error, Result};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool};
use sqlx::{Connection, Sqlite, Transaction};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// The held connection, whether it may be inside a transaction nobody will end, and the
/// enqueue connection lent with it.
#[derive(Debug)]
pub(super) struct Slot {
    conn: Option<SqliteConnection>,
    in_tx: bool,
    direct: Option<Direct>,
}

/// Where a store's writes go: one held connection (file databases) or the shared pool
/// (in-memory databases).
#[derive(Debug, Clone)]
pub(super) enum Writer {
    /// A file database's one write connection.
    Held(Arc<Mutex<Slot>>),
    /// An in-memory database's pool (one connection, shared with readers).
    Pooled(SqlitePool),
}

impl Writer {
    /// Opens the held write connection with `opts`, then the enqueue connection on the same
    /// file, as `url` (the store's) asks (see `direct`).
    pub(super) async fn open(
        opts: &SqliteConnectOptions,
        url: &str,
        busy_timeout: Duration,
    ) -> Result<Self> {
        let conn = SqliteConnection::connect_with(opts)
            .await
            .map_err(Error::db("connect"))?;
        let path = opts.get_filename().to_path_buf();
        let url = url.to_owned();
        let direct = tokio::task::spawn_blocking(move || Direct::open(&path, &url, busy_timeout))
            .await
            .map_err(|e| Error::Database {
                op: "connect (enqueue connection)",
                source: sqlx::Error::Io(std::io::Error::other(e)),
            })??;
        Ok(Self::Held(Arc::new(Mutex::new(Slot {
            conn: Some(conn),
            in_tx: false,
            direct: Some(direct),
        }))))
    }

    /// Whether writes can go through [`Writer::direct`] (a file database).
    pub(super) fn has_direct(&self) -> bool {
        matches!(self, Self::Held(_))
    }

    /// Runs `job` on the enqueue connection's thread while this store's write slot is held
    /// (until the job has finished, even if the caller is dropped). `job` must end any
    /// transaction it begins. An in-memory database has no enqueue connection: an error.
    pub(super) async fn direct<R, F>(&self, op: &'static str, job: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut DirectConn) -> Result<R> + Send + 'static,
    {
        let (guard, direct) = self.direct_slot(op).await?;
        direct.run(guard, op, job).await
    }

    /// Like [`Writer::direct`], but when `inline_first`, first tries `inline` on the caller's
    /// thread in a transaction that does not wait for the file's write lock
    /// ([`Direct::inline`]); the job `on_thread` makes runs only when that wrote nothing.
    pub(super) async fn direct_inline_first<R, I, F>(
        &self,
        op: &'static str,
        inline_first: bool,
        inline: I,
        on_thread: impl FnOnce() -> F,
    ) -> Result<R>
    where
        R: Send + 'static,
        I: FnOnce(&DirectConn) -> Result<R>,
        F: FnOnce(&mut DirectConn) -> Result<R> + Send + 'static,
    {
        let (guard, direct) = self.direct_slot(op).await?;
        if inline_first {
            if let Some(r) = direct.inline(inline) {
                return Ok(r);
            }
        }
        direct.run(guard, op, on_thread()).await
    }

    /// The write slot and its enqueue connection.
    async fn direct_slot(&self, op: &'static str) -> Result<(OwnedMutexGuard<Slot>, Direct)> {
        let Self::Held(slot) = self else {
            return Err(Error::Config(format!(
                "{op}: an in-memory SQLite database has no enqueue connection"
            )));
        };
        let guard = clean_slot(slot, op).await?;
        let direct = guard.direct.clone().ok_or(Error::Database {
            op,
            source: sqlx::Error::PoolClosed,
        })?;
        Ok((guard, direct))
    }

    /// The write connection for autocommit statements; other writers wait until it is dropped.
    pub(super) async fn conn(&self, op: &'static str) -> Result<WriteConn> {
        match self {
            Self::Held(slot) => Ok(WriteConn::Held(clean_slot(slot, op).await?)),
            Self::Pooled(pool) => Ok(WriteConn::Pooled(
                pool.acquire().await.map_err(Error::db(op))?,
            )),
        }
    }

    /// Starts a write transaction (`BEGIN IMMEDIATE`: the write lock is taken at once, so a
    /// read-then-write inside it never fails to upgrade).
    pub(super) async fn begin(&self, op: &'static str) -> Result<WriteTx> {
        match self {
            Self::Held(slot) => {
                let mut guard = clean_slot(slot, op).await?;
                guard.in_tx = true;
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(held(&mut guard, op)?)
                    .await
                    .map_err(Error::db(op))?;
                Ok(WriteTx(TxInner::Held(Some(guard))))
            }
            Self::Pooled(pool) => {
                let pool = pool.clone();
                match tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await }).await {
                    Ok(begun) => Ok(WriteTx(TxInner::Pooled(begun.map_err(Error::db(op))?))),
                    // The task panicked or the runtime is shutting down.
                    Err(_) => Err(Error::Database {
                        op,
                        source: sqlx::Error::WorkerCrashed,
                    }),
                }
            }
        }
    }

    /// Closes the write connection (a held one; the pool is closed by its owner).
    pub(super) async fn close(&self) {
        if let Self::Held(slot) = self {
            let (conn, direct) = {
                let mut slot = slot.lock().await;
                (slot.conn.take(), slot.direct.take())
            };
            // The enqueue connection's thread ends (and closes it) with its last handle.
            drop(direct);
            if let Some(conn) = conn {
                let _ = conn.close().await;
            }
        }
    }
}

/// Takes the slot, rolling back a transaction a dropped caller may have left open.
async fn clean_slot(slot: &Arc<Mutex<Slot>>, op: &'static str) -> Result<OwnedMutexGuard<Slot>> {
    let mut guard = Arc::clone(slot).lock_owned().await;
    // A closed store lends nothing: every lent guard holds its connection.
    held(&mut guard, op)?;
    if guard.in_tx {
        // "no transaction is active" when the BEGIN never ran: nothing to undo.
        let _ = sqlx::query("ROLLBACK").execute(held(&mut guard, op)?).await;
        guard.in_tx = false;
    }
    Ok(guard)
}

fn held<'a>(
    guard: &'a mut OwnedMutexGuard<Slot>,
    op: &'static str,
) -> Result<&'a mut SqliteConnection> {
    guard.conn.as_mut().ok_or(Error::Database {
        op,
        source: sqlx::Error::PoolClosed,
    })
}

/// The write connection lent for autocommit statements.
#[derive(Debug)]
pub(super) enum WriteConn {
    /// The held connection.
    Held(OwnedMutexGuard<Slot>),
    /// A pooled connection (in-memory databases).
    Pooled(PoolConnection<Sqlite>),
}

impl Deref for WriteConn {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        match self {
            // A closed store has no connection: `clean_slot` refuses to lend it, so a lent
            // guard always has one.
            Self::Held(g) => g
                .conn
                .as_ref()
                .expect("a lent write slot holds its connection"),
            Self::Pooled(c) => c,
        }
    }
}

impl DerefMut for WriteConn {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Self::Held(g) => g
                .conn
                .as_mut()
                .expect("a lent write slot holds its connection"),
            Self::Pooled(c) => c,
        }
    }
}

/// An open write transaction; dropped without [`WriteTx::commit`], it rolls back.
#[derive(Debug)]
pub(crate) struct WriteTx(TxInner);

#[derive(Debug)]
enum TxInner {
    /// On the held connection; `None` once committed or rolled back.
    Held(Option<OwnedMutexGuard<Slot>>),
    /// sqlx's transaction on a pooled connection.
    Pooled(Transaction<'static, Sqlite>),
}

impl WriteTx {
    /// Commits. On an error the transaction is rolled back before the connection is lent again.
    pub(crate) async fn commit(mut self) -> std::result::Result<(), sqlx::Error> {
        match &mut self.0 {
            TxInner::Held(slot) => {
                let Some(mut guard) = slot.take() else {
                    return Ok(());
                };
                let conn = guard.conn.as_mut().ok_or(sqlx::Error::PoolClosed)?;
                sqlx::query("COMMIT").execute(&mut *conn).await?;
                guard.in_tx = false;
                Ok(())
            }
            TxInner::Pooled(_) => {
                let TxInner::Pooled(tx) = std::mem::replace(&mut self.0, TxInner::Held(None))
                else {
                    return Ok(());
                };
                tx.commit().await
            }
        }
    }
}

impl WriteTx {
    /// Rolls back now (dropping the transaction rolls back too, on a spawned task).
    pub(crate) async fn rollback(mut self) -> std::result::Result<(), sqlx::Error> {
        match std::mem::replace(&mut self.0, TxInner::Held(None)) {
            TxInner::Held(Some(mut guard)) => {
                let conn = guard.conn.as_mut().ok_or(sqlx::Error::PoolClosed)?;
                sqlx::query("ROLLBACK").execute(&mut *conn).await?;
                guard.in_tx = false;
                Ok(())
            }
            TxInner::Held(None) => Ok(()),
            TxInner::Pooled(tx) => tx.rollback().await,
        }
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        match &self.0 {
            TxInner::Held(g) => g
                .as_ref()
                .and_then(|g| g.conn.as_ref())
                .expect("an open write transaction holds its connection"),
            TxInner::Pooled(tx) => tx,
        }
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match &mut self.0 {
            TxInner::Held(g) => g
                .as_mut()
                .and_then(|g| g.conn.as_mut())
                .expect("an open write transaction holds its connection"),
            TxInner::Pooled(tx) => tx,
        }
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let TxInner::Held(slot) = &mut self.0 else {
            // sqlx's transaction queues its own rollback.
            return;
        };
        let Some(guard) = slot.take() else { return };
        // `in_tx` is still set: if no task can run the rollback now, the next caller does.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = clean_slot_owned(guard).await;
            });
        }
    }
}

/// Rolls back the transaction left open on a slot already held.
async fn clean_slot_owned(mut guard: OwnedMutexGuard<Slot>) -> Result<()> {
    if guard.in_tx {
        let _ = sqlx::query("ROLLBACK")
            .execute(held(&mut guard, "rollback")?)
            .await;
        guard.in_tx = false;
    }
    Ok(())
}
