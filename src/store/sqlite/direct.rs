//! SQLite: the store's hottest writes (enqueues here; claims, completions and rounds in `hot`)
//! on a write connection of their own, driven by rusqlite, inline where that cannot block and
//! on a thread of its own otherwise.
//!
//! Through sqlx every statement is a command sent to its connection's worker thread and every
//! result a message back: a single enqueue cost ~8.6 futex calls, and on this project's 2-core
//! virtual machines a thread wake-up (an inter-processor interrupt and a context switch) costs
//! more than the insert itself; ~45 % of W1's CPU was in wake-ups and task switches (`perf`,
//! docs/BENCHMARKS.md session 22). A sequential enqueue waits for two of them per round trip
//! whatever thread runs the statement, so the short writes run inline:
//!
//! - [`Direct::inline`] runs a write on the caller's thread inside `BEGIN IMMEDIATE` with no
//!   busy timeout: when another connection holds the file's write lock, it gives up at once,
//!   having written nothing, instead of blocking an async worker thread while it waits;
//! - [`Direct::run`] runs a write on the connection's own thread, with the busy timeout (a
//!   write that found the lock taken, and bulk inserts, which take milliseconds).
//!
//! The connection is a second writer on the file, used only while the store's write slot is
//! held (see `writer`): a job on the thread carries the slot's guard and drops it there once
//! the job has finished, so no other write of this store starts while a job runs, even when its
//! caller was dropped meanwhile; an inline write cannot be interrupted at all. A write never
//! leaves a transaction open: rusqlite's transaction rolls back when dropped uncommitted. In-
//! memory databases have no such connection (a second connection to `:memory:` opens another
//! database).

use crate::error::{Error, Result};
use std::borrow::Cow;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

pub(super) use rusqlite::Connection;

/// A job for the connection's thread.
type Job = Box<dyn FnOnce() + Send>;

/// The connection and the handle of its thread; the thread ends when the last handle is
/// dropped, and the connection closes with the last of them.
#[derive(Debug, Clone)]
pub(super) struct Direct {
    conn: Arc<Mutex<Connection>>,
    jobs: mpsc::Sender<Job>,
    busy_timeout: Duration,
}

impl Direct {
    /// Opens the connection on the (already created, WAL-mode) database file at `path`, as
    /// `url` asks (read-only, a VFS) and with the pragmas of the store's sqlx writer, and
    /// starts its thread.
    pub(super) fn open(path: &Path, url: &str, busy_timeout: Duration) -> Result<Self> {
        let op = "connect (enqueue connection)";
        let mode = UrlMode::of(url);
        let flags = if mode.read_only {
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        } else {
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        };
        let conn = match &mode.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs.as_str()),
            None => Connection::open_with_flags(path, flags),
        }
        .map_err(db_error(op))?;
        // `journal_mode` is the file's own (WAL, set by the writer opened before this one);
        // the rest are per connection, as `SqliteStore::connect` sets them on the others.
        for (pragma, value) in [
            ("synchronous", "NORMAL"),
            ("foreign_keys", "ON"),
            ("wal_autocheckpoint", "0"),
        ] {
            conn.pragma_update(None, pragma, value)
                .map_err(db_error(op))?;
        }
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dockhand-sqlite-enqueue".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    // A panicking job drops its answer's sender (its caller gets an error).
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .map_err(|e| Error::Database {
                op,
                source: sqlx::Error::Io(e),
            })?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            jobs,
            busy_timeout,
        })
    }

    /// Runs `write` on the caller's thread inside a `BEGIN IMMEDIATE` transaction, with no
    /// busy timeout, and commits it. `None` when it did not commit (the write lock was taken,
    /// or `write` or the commit failed): nothing was written, and the caller runs the write
    /// again with [`Direct::run`], which waits for the lock and reports errors. The caller
    /// holds the store's write slot.
    pub(super) fn inline<R>(&self, write: impl FnOnce(&Connection) -> Result<R>) -> Option<R> {
        let mut conn = lock(&self.conn);
        conn.busy_timeout(Duration::ZERO).ok()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .ok()?;
        let r = write(&tx).ok()?;
        tx.commit().ok()?;
        Some(r)
    }

    /// Runs `job` on the connection's thread, with the busy timeout, holding `guard` (the
    /// store's write slot) until the job has finished there, and returns its answer.
    pub(super) async fn run<G, R, F>(&self, guard: G, op: &'static str, job: F) -> Result<R>
    where
        G: Send + 'static,
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let (conn, busy_timeout) = (Arc::clone(&self.conn), self.busy_timeout);
        self.jobs
            .send(Box::new(move || {
                let r = {
                    let mut conn = lock(&conn);
                    match conn.busy_timeout(busy_timeout) {
                        Ok(()) => job(&mut conn),
                        Err(e) => Err(db_error(op)(e)),
                    }
                };
                drop(guard);
                let _ = answer.send(r);
            }))
            .map_err(|_| gone(op))?;
        answered.await.map_err(|_| gone(op))?
    }
}

/// What a store URL's query asks of every connection, as sqlx reads it: `mode=ro` or
/// `immutable=true` open read-only, `vfs=NAME` names the VFS.
#[derive(Debug, Default, PartialEq, Eq)]
struct UrlMode {
    read_only: bool,
    vfs: Option<String>,
}

impl UrlMode {
    fn of(url: &str) -> Self {
        let mut mode = Self::default();
        let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
        for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
            match (key, value) {
                ("mode", "ro") | ("immutable", "true" | "1") => mode.read_only = true,
                ("vfs", vfs) => mode.vfs = Some(vfs.to_owned()),
                _ => {}
            }
        }
        mode
    }
}

/// The connection; only ever taken by a holder of the store's write slot, so never contended.
fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}

/// The connection's thread is gone (the store was closed) or the job panicked.
fn gone(op: &'static str) -> Error {
    Error::Database {
        op,
        source: sqlx::Error::PoolClosed,
    }
}

/// Maps a rusqlite error to the crate's database error, carrying SQLite's extended result code
/// as sqlx's own SQLite errors do (so `Error::is_transient` and `Error::is_permanent` read it
/// the same way).
pub(super) fn db_error(op: &'static str) -> impl Fn(rusqlite::Error) -> Error {
    move |e| {
        let source = match e {
            rusqlite::Error::SqliteFailure(failure, message) => {
                sqlx::Error::Database(Box::new(SqliteFailure {
                    code: failure.extended_code,
                    message: message.unwrap_or_else(|| failure.to_string()),
                }))
            }
            other => sqlx::Error::Protocol(format!("SQLite (enqueue connection): {other}")),
        };
        Error::Database { op, source }
    }
}

/// A failed SQLite call on the enqueue connection.
#[derive(Debug, thiserror::Error)]
#[error("(code: {code}) {message}")]
struct SqliteFailure {
    /// SQLite's extended result code.
    code: i32,
    message: String,
}

impl sqlx::error::DatabaseError for SqliteFailure {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        // SQLite's extended constraint codes.
        match self.code {
            2067 | 1555 => ErrorKind::UniqueViolation,
            787 => ErrorKind::ForeignKeyViolation,
            1299 => ErrorKind::NotNullViolation,
            275 => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_keep_sqlites_extended_code() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT NOT NULL UNIQUE)")
            .unwrap();
        conn.execute("INSERT INTO t VALUES ('a')", []).unwrap();
        let e = conn
            .execute("INSERT INTO t VALUES ('a')", [])
            .map_err(db_error("enqueue"))
            .unwrap_err();
        let Error::Database {
            source: sqlx::Error::Database(db),
            op,
        } = &e
        else {
            panic!("not a database error: {e:?}");
        };
        assert_eq!(*op, "enqueue");
        assert_eq!(db.code().as_deref(), Some("2067"));
        assert!(db.is_unique_violation());
        assert!(!e.is_transient());
    }

    #[test]
    fn url_modes_as_sqlx_reads_them() {
        assert_eq!(UrlMode::of("sqlite:/tmp/x.db"), UrlMode::default());
        assert!(UrlMode::of("sqlite:/tmp/x.db?mode=ro").read_only);
        assert!(UrlMode::of("sqlite:///tmp/x.db?cache=private&immutable=1").read_only);
        assert!(!UrlMode::of("sqlite:/tmp/x.db?mode=rwc").read_only);
        assert_eq!(
            UrlMode::of("sqlite:/tmp/x.db?vfs=unix-dotfile")
                .vfs
                .as_deref(),
            Some("unix-dotfile")
        );
    }

    #[test]
    fn busy_is_transient() {
        let e = db_error("enqueue")(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(5),
            None,
        ));
        assert!(e.is_transient(), "{e}");
    }
}
