//! Opening a [`MySqlStore`] and its inherent API: the pool (every session at READ COMMITTED,
//! UTC, strict), test databases (created and dropped by name), the migrator, the pool accessor,
//! transactional enqueue and in-process wake-ups, the `begin` helper, [`retry_deadlocks`] (the
//! whole-transaction retry every multi-statement write goes through), and [`ms`] / [`from_ms`],
//! the stored form of a time.

use super::{enqueue, MySqlStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::{Enqueued, Wakeup};
use crate::telemetry;
use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Connection, Executor, MySql, MySqlConnection, Row, Transaction};
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/mysql");

/// Pool size used by [`MySqlStore::connect`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// How many times a store transaction runs at most when it keeps deadlocking.
const DEADLOCK_ATTEMPTS: usize = 10;

/// MySQL error numbers a whole-transaction retry clears: deadlock, lock wait timeout.
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// Deadlock retries in this process (every store), see [`MySqlStore::deadlock_retries`].
static DEADLOCK_RETRIES: AtomicU64 = AtomicU64::new(0);

/// What every pooled session runs once when it opens.
const SESSION_SETUP: [&str; 3] = [
    // Snapshot per statement and no gap locks on range scans: far fewer InnoDB deadlocks.
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET time_zone = '+00:00'",
    // Strict: an oversized value is an error, never silently truncated.
    "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_TRANS_TABLES')",
];

impl MySqlStore {
    /// Opens a pool of [`DEFAULT_MAX_CONNECTIONS`] on `url` (`mysql://USER:PASSWORD@HOST/DB` or
    /// `mariadb://…`; the database must exist). Does not migrate.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = parse_url(url)?;
        if options.get_database().map_or(true, str::is_empty) {
            return Err(Error::invalid(
                "database_url",
                format!(
                    "`{}` names no database; use mysql://USER:PASSWORD@HOST/DB",
                    crate::store::redact_url(url)
                ),
            ));
        }
        Self::connect_with(options, DEFAULT_MAX_CONNECTIONS).await
    }

    /// Opens a pool of at most `max_connections` with explicit options; every session is set
    /// to READ COMMITTED, UTC and strict mode when it opens. Does not migrate.
    pub async fn connect_with(options: MySqlConnectOptions, max_connections: u32) -> Result<Self> {
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            // No reaper task (sqlx#3645); a stale connection is replaced, one idle a while
            // pinged, when it is next taken (see `store::pool`).
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move { crate::store::pool::check_before_acquire(conn, &meta).await })
            })
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    for sql in SESSION_SETUP {
                        conn.execute(sql).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(Error::db("connect"))?;
        check_session(&pool).await?;
        Ok(Self {
            pool,
            wake: Wakeup::new(),
        })
    }

    /// Test isolation: creates database `name` (1 to 64 characters from `[a-z0-9_]`) on the
    /// server `url` names, on a one-off connection; an existing one is kept.
    pub async fn create_database(url: &str, name: &str) -> Result<()> {
        validate_database(name)?;
        let mut conn = MySqlConnection::connect_with(&parse_url(url)?)
            .await
            .map_err(Error::db("connect"))?;
        let created = conn
            .execute(
                format!(
                    "CREATE DATABASE IF NOT EXISTS `{name}` \
                     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
                .as_str(),
            )
            .await;
        let _ = conn.close().await;
        created.map_err(Error::db("create database"))?;
        Ok(())
    }

    /// Drops database `name` and everything in it (the counterpart of
    /// [`MySqlStore::create_database`]), on a one-off connection.
    pub async fn drop_database(url: &str, name: &str) -> Result<()> {
        validate_database(name)?;
        let mut conn = MySqlConnection::connect_with(&parse_url(url)?)
            .await
            .map_err(Error::db("connect"))?;
        let dropped = conn
            .execute(format!("DROP DATABASE IF EXISTS `{name}`").as_str())
            .await;
        let _ = conn.close().await;
        dropped.map_err(Error::db("drop database"))?;
        Ok(())
    }

    /// `url` with its database replaced by `name` (checked like
    /// [`MySqlStore::create_database`]), for opening a store on a test database.
    pub fn url_for_database(url: &str, name: &str) -> Result<MySqlConnectOptions> {
        validate_database(name)?;
        Ok(parse_url(url)?.database(name))
    }

    /// The pool, for callers that want transactional enqueue in their own transaction (see
    /// [`MySqlStore::enqueue_in`]).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Transactional enqueue: inserts the action inside the caller's open transaction
    /// (`&mut *tx`), so it exists only if the caller commits. Call [`MySqlStore::notify`] after
    /// the commit to wake an idle runner in this process at once (otherwise it is found at the
    /// next poll). A deadlock here is the caller's to retry: it owns the transaction.
    pub async fn enqueue_in(
        conn: &mut MySqlConnection,
        action: &PreparedAction,
        now: DateTime<Utc>,
    ) -> Result<Enqueued> {
        enqueue::enqueue_one(conn, action, now).await
    }

    /// Wakes runners in this process (after a transactional enqueue commits).
    pub fn notify(&self) {
        self.wake.notify();
    }

    /// How many store transactions this process re-ran after a deadlock or lock wait timeout
    /// (all MySQL stores together; also counted in the
    /// [`telemetry::STORE_DEADLOCK_RETRIES`] metric).
    pub fn deadlock_retries() -> u64 {
        DEADLOCK_RETRIES.load(Ordering::Relaxed)
    }

    pub(crate) async fn begin(&self, op: &'static str) -> Result<Transaction<'static, MySql>> {
        self.pool.begin().await.map_err(Error::db(op))
    }
}

/// Runs `f` (a whole store transaction: begin, work, commit) and runs it again, after a short
/// jittered backoff, when it failed with a deadlock (1213) or lock wait timeout (1205), or a
/// completion handler in it failed transiently ([`Error::TransientCompletion`]), up to
/// a bounded number of attempts; each retry is counted in
/// [`telemetry::STORE_DEADLOCK_RETRIES`]. Any other error, or the last attempt's, is returned.
pub(crate) async fn retry_deadlocks<T, F, Fut>(op: &'static str, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(2))
        .with_max_delay(Duration::from_millis(200))
        .with_factor(2.0)
        .with_jitter()
        .with_max_times(DEADLOCK_ATTEMPTS - 1);
    f.retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| is_deadlock(e) || matches!(e, Error::TransientCompletion { .. }))
        .notify(|e, after| {
            DEADLOCK_RETRIES.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(
                telemetry::STORE_DEADLOCK_RETRIES,
                "backend" => "mysql",
                "op" => op
            )
            .increment(1);
            tracing::debug!(op, error = %e, ?after, "mysql: transaction retried");
        })
        .await
}

/// True for a deadlock or a lock wait timeout.
pub(crate) fn is_deadlock(e: &Error) -> bool {
    let Error::Database {
        source: sqlx::Error::Database(db),
        ..
    } = e
    else {
        return false;
    };
    db.try_downcast_ref::<MySqlDatabaseError>()
        .is_some_and(|m| matches!(m.number(), ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT))
}

/// Startup check: the session settings took.
async fn check_session(pool: &MySqlPool) -> Result<()> {
    let tz: String = sqlx::query_scalar("SELECT CAST(@@session.time_zone AS CHAR)")
        .fetch_one(pool)
        .await
        .map_err(Error::db("check session"))?;
    if tz != "+00:00" {
        return Err(Error::Config(format!(
            "MySQL session time_zone is `{tz}`, expected `+00:00`"
        )));
    }
    Ok(())
}

fn parse_url(url: &str) -> Result<MySqlConnectOptions> {
    MySqlConnectOptions::from_str(url).map_err(|e| crate::store::reach::url_error(url, e))
}

fn validate_database(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "database",
            format!("`{name}`: use 1 to 64 characters from [a-z0-9_]"),
        ))
    }
}

/// A text column as a `String`. Columns with a binary collation (`utf8mb4_bin`, every table's
/// default) carry MySQL's BINARY flag, which sqlx's type check reads as VARBINARY and refuses
/// for `String` (sqlx issue 3387); the bytes are UTF-8 text all the same, so they are decoded
/// without that check (invalid UTF-8 is still an error).
pub(crate) fn text(row: &MySqlRow, col: &str) -> std::result::Result<String, sqlx::Error> {
    row.try_get_unchecked::<String, _>(col)
}

/// A nullable text column as an `Option<String>` (see [`text`]).
pub(crate) fn opt_text(
    row: &MySqlRow,
    col: &str,
) -> std::result::Result<Option<String>, sqlx::Error> {
    row.try_get_unchecked::<Option<String>, _>(col)
}

/// Milliseconds since the epoch, the stored form of a time.
pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// A stored time back to a `DateTime`.
pub(crate) fn from_ms(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(v).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_checked() {
        assert!(validate_database("dh_0123abc").is_ok());
        for bad in ["", "Dh", "a-b", "x`; DROP", &"a".repeat(65)] {
            assert!(validate_database(bad).is_err(), "{bad}");
        }
    }

    /// Two transactions lock two rows in opposite orders: InnoDB kills one with 1213, and
    /// `retry_deadlocks` re-runs it, so both succeed and the retry is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_real_deadlock_is_retried() {
        let Some(url) = std::env::var("DOCKHAND_TEST_MYSQL_URL")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            eprintln!("SKIPPED: set DOCKHAND_TEST_MYSQL_URL to run the MySQL deadlock-retry test");
            return;
        };
        let name = format!("dh_{}", uuid::Uuid::new_v4().simple());
        MySqlStore::create_database(&url, &name).await.unwrap();
        let options = MySqlStore::url_for_database(&url, &name).unwrap();
        let store = std::sync::Arc::new(MySqlStore::connect_with(options, 4).await.unwrap());
        sqlx::raw_sql(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB;
             INSERT INTO t VALUES (1, 0), (2, 0)",
        )
        .execute(store.pool())
        .await
        .unwrap();
        let before = MySqlStore::deadlock_retries();
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let side = |first: i64, second: i64| {
            let (store, barrier) = (store.clone(), barrier.clone());
            let attempts = std::sync::Arc::new(AtomicU64::new(0));
            tokio::spawn(async move {
                retry_deadlocks("test", || {
                    let (store, barrier, attempts) =
                        (store.clone(), barrier.clone(), attempts.clone());
                    async move {
                        let mut tx = store.begin("test").await?;
                        for (i, id) in [first, second].into_iter().enumerate() {
                            sqlx::query("UPDATE t SET v = v + 1 WHERE id = ?")
                                .bind(id)
                                .execute(&mut *tx)
                                .await
                                .map_err(Error::db("test"))?;
                            // First attempt only: wait until both hold their first row.
                            if i == 0 && attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                                barrier.wait().await;
                            }
                        }
                        tx.commit().await.map_err(Error::db("test"))
                    }
                })
                .await
            })
        };
        let (a, b) = (side(1, 2), side(2, 1));
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        let v: Vec<i64> = sqlx::query_scalar("SELECT v FROM t ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(v, [2, 2], "both transactions committed once");
        assert!(
            MySqlStore::deadlock_retries() > before,
            "the victim was retried"
        );
        store.pool().close().await;
        MySqlStore::drop_database(&url, &name).await.unwrap();
    }

    #[tokio::test]
    async fn a_url_without_a_database_is_refused_before_connecting() {
        let e = MySqlStore::connect("mysql://root:secret@127.0.0.1:1/")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("names no database"), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn times_round_trip_in_milliseconds() {
        let t = DateTime::from_timestamp_millis(1_774_612_800_123).unwrap_or_default();
        assert_eq!(from_ms(ms(t)), t);
    }
}
