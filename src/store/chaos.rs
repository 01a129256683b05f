//! The SQL of the chaos run (RELIABILITY.md §2, `dockhand chaos`), per backend: fresh databases
//! for a run, the side-effect ledger (`chaos_ledger`, a table without a unique key written in
//! each item claim's completion transaction, so a duplicate side effect is counted rather than
//! refused), and the faults that act through the database — terminated backend connections, a
//! transaction holding row locks, a held SQLite writer, a worker's pool held empty — and the
//! SQLite integrity check. No runtime uses this module.

use super::mysql::MySqlStore;
use super::postgres::PgStore;
use crate::claims::{CompletionError, CompletionTx};
use crate::error::{Error, Result};
use sqlx::mysql::MySqlPool;
use sqlx::postgres::PgPool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Connection, Executor, Row};
use std::str::FromStr;
use std::time::Duration;

/// One row of the side-effect ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRow {
    /// The item the side effect belongs to (its claim's item id).
    pub item_id: String,
    /// The claim token of the completion that wrote it.
    pub token: String,
}

/// A connection pool to the chaos run's database, for the ledger and the database faults.
#[derive(Debug, Clone)]
pub enum ChaosDb {
    /// SQLite.
    Sqlite(SqlitePool),
    /// PostgreSQL.
    Postgres(PgPool),
    /// MySQL / MariaDB.
    MySql(MySqlPool),
}

const LEDGER_DDL: &str = "CREATE TABLE IF NOT EXISTS chaos_ledger (item_id VARCHAR(400) NOT NULL, \
                          token VARCHAR(128) NOT NULL)";

fn db(op: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| Error::db(op)(e)
}

/// How often the row-lock blocker starts over after a deadlock.
const DEADLOCK_RETRIES: usize = 5;

/// Locks up to 50 pending or running actions (`FOR UPDATE`) on an open transaction
/// (`$conn`), waiting up to 10 s for some to exist (an idle queue has none); evaluates to how
/// many it locked.
macro_rules! lock_rows {
    ($conn:expr) => {
        async {
            const ROWS: &str = "SELECT id FROM dockhand_actions \
                                WHERE status IN ('pending', 'running') \
                                ORDER BY id LIMIT 50 FOR UPDATE";
            let mut n = 0;
            for _ in 0..50 {
                n = sqlx::query(ROWS)
                    .fetch_all(&mut *$conn)
                    .await
                    .map_err(db("lock rows"))?
                    .len();
                if n > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok::<u64, Error>(n as u64)
        }
    };
}

impl ChaosDb {
    /// Opens a pool of `max` connections on `url` (SQLite waits up to 60 s for a busy writer).
    pub async fn connect(url: &str, max: u32) -> Result<Self> {
        if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| Error::invalid("database_url", e.to_string()))?
                .busy_timeout(Duration::from_secs(60));
            // No reaper task (sqlx#3645, see `store::pool`).
            let pool = SqlitePoolOptions::new()
                .max_connections(max)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(opts)
                .await
                .map_err(db("connect"))?;
            return Ok(Self::Sqlite(pool));
        }
        if url.starts_with("postgres") {
            let store = PgStore::connect(url).await?;
            return Ok(Self::Postgres(store.pool().clone()));
        }
        let store = MySqlStore::connect(url).await?;
        Ok(Self::MySql(store.pool().clone()))
    }

    /// Creates a fresh database `name` on the server `server_url` names (dropping one left by
    /// an earlier run) and returns its URL. PostgreSQL and MySQL only; `name` is `[a-z0-9_]`.
    pub async fn create_database(server_url: &str, name: &str) -> Result<String> {
        if !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(Error::invalid(
                "database",
                format!("`{name}` is not [a-z0-9_]"),
            ));
        }
        if server_url.starts_with("postgres") {
            let mut conn = sqlx::PgConnection::connect(server_url)
                .await
                .map_err(db("connect"))?;
            conn.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                .await
                .map_err(db("drop database"))?;
            conn.execute(format!("CREATE DATABASE {name}").as_str())
                .await
                .map_err(db("create database"))?;
            let _ = conn.close().await;
            return Ok(replace_database(server_url, name));
        }
        MySqlStore::drop_database(server_url, name).await?;
        MySqlStore::create_database(server_url, name).await?;
        Ok(replace_database(server_url, name))
    }

    /// Drops database `name` (the counterpart of [`ChaosDb::create_database`]).
    pub async fn drop_database(server_url: &str, name: &str) -> Result<()> {
        if server_url.starts_with("postgres") {
            let mut conn = sqlx::PgConnection::connect(server_url)
                .await
                .map_err(db("connect"))?;
            let dropped = conn
                .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                .await;
            let _ = conn.close().await;
            return dropped.map(|_| ()).map_err(db("drop database"));
        }
        MySqlStore::drop_database(server_url, name).await
    }

    /// Creates the ledger table.
    pub async fn create_ledger(&self) -> Result<()> {
        match self {
            Self::Sqlite(p) => p.execute(LEDGER_DDL).await.map(|_| ()),
            Self::Postgres(p) => p.execute(LEDGER_DDL).await.map(|_| ()),
            Self::MySql(p) => p.execute(LEDGER_DDL).await.map(|_| ()),
        }
        .map_err(db("create chaos_ledger"))
    }

    /// Appends a ledger row inside a claim's completion transaction and hands the transaction
    /// back. A deadlock or lost connection is a transient failure (the store re-runs the
    /// completion transaction).
    pub async fn ledger_insert<'a>(
        tx: CompletionTx<'a>,
        item_id: &str,
        token: &str,
    ) -> std::result::Result<CompletionTx<'a>, CompletionError> {
        Ok(match tx {
            CompletionTx::Sqlite(c) => {
                sqlx::query("INSERT INTO chaos_ledger (item_id, token) VALUES (?, ?)")
                    .bind(item_id)
                    .bind(token)
                    .execute(&mut *c)
                    .await
                    .map_err(CompletionError::from)?;
                CompletionTx::Sqlite(c)
            }
            CompletionTx::Postgres(c) => {
                sqlx::query("INSERT INTO chaos_ledger (item_id, token) VALUES ($1, $2)")
                    .bind(item_id)
                    .bind(token)
                    .execute(&mut *c)
                    .await
                    .map_err(CompletionError::from)?;
                CompletionTx::Postgres(c)
            }
            CompletionTx::MySql(c) => {
                sqlx::query("INSERT INTO chaos_ledger (item_id, token) VALUES (?, ?)")
                    .bind(item_id)
                    .bind(token)
                    .execute(&mut *c)
                    .await
                    .map_err(CompletionError::from)?;
                CompletionTx::MySql(c)
            }
        })
    }

    /// Every ledger row.
    pub async fn ledger(&self) -> Result<Vec<LedgerRow>> {
        const Q: &str = "SELECT item_id, token FROM chaos_ledger";
        let rows: Vec<(String, String)> = match self {
            Self::Sqlite(p) => sqlx::query(Q).fetch_all(p).await.and_then(|r| {
                r.iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect()
            }),
            Self::Postgres(p) => sqlx::query(Q).fetch_all(p).await.and_then(|r| {
                r.iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect()
            }),
            // utf8mb4_bin columns come back as binary strings.
            Self::MySql(p) => sqlx::query(Q).fetch_all(p).await.and_then(|r| {
                r.iter()
                    .map(|r| {
                        let text = |i: usize| -> std::result::Result<String, sqlx::Error> {
                            let raw: Vec<u8> = r.try_get(i)?;
                            Ok(String::from_utf8_lossy(&raw).into_owned())
                        };
                        Ok((text(0)?, text(1)?))
                    })
                    .collect()
            }),
        }
        .map_err(db("read chaos_ledger"))?;
        Ok(rows
            .into_iter()
            .map(|(item_id, token)| LedgerRow { item_id, token })
            .collect())
    }

    /// Terminates every other connection to this database (PostgreSQL, MySQL); returns how
    /// many. SQLite has no server connections: 0.
    pub async fn terminate_backends(&self) -> Result<u64> {
        match self {
            Self::Sqlite(_) => Ok(0),
            Self::Postgres(p) => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     AND backend_type = 'client backend'",
                )
                .fetch_one(p)
                .await
                .map_err(db("terminate backends"))?;
                Ok(n as u64)
            }
            Self::MySql(p) => {
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
                     WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
                )
                .fetch_all(p)
                .await
                .map_err(db("list connections"))?;
                let mut n = 0;
                for id in ids {
                    // A connection may end on its own between the list and the kill.
                    if p.execute(format!("KILL CONNECTION {id}").as_str())
                        .await
                        .is_ok()
                    {
                        n += 1;
                    }
                }
                Ok(n)
            }
        }
    }

    /// Holds locks for `hold`, then rolls back: on PostgreSQL and MySQL a transaction that
    /// locks up to 50 pending or running actions (`FOR UPDATE`: claims skip them; heartbeats,
    /// finishes and the reaper wait); on SQLite the write lock (`BEGIN
    /// IMMEDIATE`), so no other process can write. Returns how many rows were locked (SQLite:
    /// 1 for the database).
    pub async fn hold_locks(&self, hold: Duration) -> Result<u64> {
        match self {
            Self::Sqlite(p) => {
                let mut c = p.acquire().await.map_err(db("acquire"))?;
                c.execute("BEGIN IMMEDIATE")
                    .await
                    .map_err(db("begin immediate"))?;
                tokio::time::sleep(hold).await;
                c.execute("ROLLBACK").await.map_err(db("rollback"))?;
                Ok(1)
            }
            Self::Postgres(p) => {
                // A deadlock with a worker's transaction (this one locks in id order, theirs
                // do not always) is retried: the fault is the lock held, not the deadlock.
                for _ in 0..DEADLOCK_RETRIES {
                    let mut tx = p.begin().await.map_err(db("begin"))?;
                    match lock_rows!(tx).await {
                        Ok(n) => {
                            tokio::time::sleep(hold).await;
                            tx.rollback().await.map_err(db("rollback"))?;
                            return Ok(n);
                        }
                        Err(e) if e.is_transient() => {
                            let _ = tx.rollback().await;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(Error::Config(
                    "row lock blocker: deadlocked on every try".into(),
                ))
            }
            Self::MySql(p) => {
                for _ in 0..DEADLOCK_RETRIES {
                    let mut tx = p.begin().await.map_err(db("begin"))?;
                    match lock_rows!(tx).await {
                        Ok(n) => {
                            tokio::time::sleep(hold).await;
                            tx.rollback().await.map_err(db("rollback"))?;
                            return Ok(n);
                        }
                        Err(e) if e.is_transient() => {
                            let _ = tx.rollback().await;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(Error::Config(
                    "row lock blocker: deadlocked on every try".into(),
                ))
            }
        }
    }

    /// Takes every connection of this pool and keeps them for `hold` (pool exhaustion for
    /// whoever shares the pool). Returns how many were held.
    pub async fn exhaust_pool(&self, hold: Duration) -> u64 {
        async fn grab<DB: sqlx::Database>(p: &sqlx::Pool<DB>, hold: Duration) -> u64 {
            let mut held = Vec::new();
            let deadline = tokio::time::Instant::now() + hold;
            while held.len() < p.options().get_max_connections() as usize {
                match tokio::time::timeout_at(deadline, p.acquire()).await {
                    Ok(Ok(c)) => held.push(c),
                    _ => break,
                }
            }
            tokio::time::sleep_until(deadline).await;
            held.len() as u64
        }
        match self {
            Self::Sqlite(p) => grab(p, hold).await,
            Self::Postgres(p) => grab(p, hold).await,
            Self::MySql(p) => grab(p, hold).await,
        }
    }

    /// SQLite's `PRAGMA integrity_check` result (`ok` when sound); `None` on the servers.
    pub async fn integrity_check(&self) -> Result<Option<String>> {
        match self {
            Self::Sqlite(p) => {
                let rows: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
                    .fetch_all(p)
                    .await
                    .map_err(db("integrity_check"))?;
                Ok(Some(rows.join("; ")))
            }
            _ => Ok(None),
        }
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(p) => p.close().await,
            Self::Postgres(p) => p.close().await,
            Self::MySql(p) => p.close().await,
        }
    }
}

/// `url` with its database (the path after the host) replaced by `name`, query kept.
fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn database_replaced_in_urls() {
        assert_eq!(
            replace_database("postgres://postgres@127.0.0.1:5432/postgres", "c1"),
            "postgres://postgres@127.0.0.1:5432/c1"
        );
        assert_eq!(
            replace_database("mysql://root@127.0.0.1:3306", "c1"),
            "mysql://root@127.0.0.1:3306/c1"
        );
        assert_eq!(
            replace_database("mysql://u:p@h/test?ssl-mode=disabled", "c1"),
            "mysql://u:p@h/c1?ssl-mode=disabled"
        );
    }
}
