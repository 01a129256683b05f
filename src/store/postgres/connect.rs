//! Opening a [`PgStore`] and its inherent API: the pool (plain, sized, or confined to a test
//! schema, and dropping that schema), the migrator, the pool and channel accessors,
//! transactional enqueue and in-process wake-ups, the `begin` helper every write transaction
//! starts with, URL and schema-name checks, and [`ts`], the millisecond truncation every bound
//! time goes through.

use super::{enqueue, listen, PgStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::{Enqueued, Wakeup};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, Postgres, Transaction};
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// Pool size used by [`PgStore::connect`] and [`PgStore::connect_in_schema`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

impl PgStore {
    /// Opens a pool of [`DEFAULT_MAX_CONNECTIONS`] on `url` (`postgres://…`). A `search_path`
    /// given in the URL's `options` selects the schema (and the wake-up channel). Does not
    /// migrate.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(parse_url(url)?, DEFAULT_MAX_CONNECTIONS).await
    }

    /// Opens a pool of at most `max_connections` with explicit options. Does not migrate.
    pub async fn connect_with(options: PgConnectOptions, max_connections: u32) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            // No reaper task (sqlx#3645); a stale connection is replaced, one idle a while
            // pinged, when it is next taken (see `store::pool`).
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move { crate::store::pool::check_before_acquire(conn, &meta).await })
            })
            .connect_with(options.clone())
            .await
            .map_err(Error::db("connect"))?;
        let channel = listen::channel_for(&listen::schema_from_options(&options));
        Ok(Self {
            pool,
            options,
            channel,
            wake: Arc::new(Wakeup::new()),
            listening: AtomicBool::new(false),
            limits_seen: AtomicBool::new(false),
            listener: Mutex::new(None),
        })
    }

    /// Test isolation: creates schema `schema` if missing (on a one-off connection), then opens a
    /// pool whose every connection has `search_path = schema`, so the tables, the migrations
    /// table and the wake-up channel all belong to that schema. Does not migrate.
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self> {
        validate_schema(schema)?;
        let options = parse_url(url)?;
        let mut conn = PgConnection::connect_with(&options)
            .await
            .map_err(Error::db("connect"))?;
        let created = conn
            .execute(format!(r#"CREATE SCHEMA IF NOT EXISTS "{schema}""#).as_str())
            .await;
        let _ = conn.close().await;
        match created {
            Ok(_) => {}
            // Two concurrent `IF NOT EXISTS` can still collide in the catalog: it exists now.
            Err(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some("23505") | Some("42P06")) => {}
            Err(e) => return Err(Error::db("create schema")(e)),
        }
        let options = options.options([("search_path", schema)]);
        Self::connect_with(options, DEFAULT_MAX_CONNECTIONS).await
    }

    /// Drops schema `schema` and everything in it (the counterpart of
    /// [`PgStore::connect_in_schema`]), on a one-off connection.
    pub async fn drop_schema(url: &str, schema: &str) -> Result<()> {
        validate_schema(schema)?;
        let mut conn = PgConnection::connect_with(&parse_url(url)?)
            .await
            .map_err(Error::db("connect"))?;
        let dropped = conn
            .execute(format!(r#"DROP SCHEMA "{schema}" CASCADE"#).as_str())
            .await;
        let _ = conn.close().await;
        dropped.map_err(Error::db("drop schema"))?;
        Ok(())
    }

    /// The pool, for callers that want transactional enqueue in their own transaction (see
    /// [`PgStore::enqueue_in`]).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The LISTEN/NOTIFY channel this store's enqueues notify and
    /// [`Store::listen`](crate::store::Store::listen) follows.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Transactional enqueue: inserts the action inside the caller's open transaction
    /// (`&mut *tx`), so it exists only if the caller commits; a due action's `pg_notify` is
    /// delivered at that commit (on the channel of the connection's current schema). Call
    /// [`PgStore::notify`] after the commit to wake an idle runner in this process at once.
    pub async fn enqueue_in(
        conn: &mut PgConnection,
        action: &PreparedAction,
        now: DateTime<Utc>,
    ) -> Result<Enqueued> {
        enqueue::enqueue_one(conn, action, now, None).await
    }

    /// Wakes runners in this process (after a transactional enqueue commits).
    pub fn notify(&self) {
        self.wake.notify();
    }

    pub(crate) async fn begin(&self, op: &'static str) -> Result<Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(Error::db(op))
    }
}

fn parse_url(url: &str) -> Result<PgConnectOptions> {
    PgConnectOptions::from_str(url).map_err(|e| crate::store::reach::url_error(url, e))
}

fn validate_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "schema",
            format!("`{schema}`: use 1 to 63 characters from [a-z0-9_]"),
        ))
    }
}

/// A time as bound to the database: truncated to whole milliseconds, like every backend.
pub(crate) fn ts(t: DateTime<Utc>) -> DateTime<Utc> {
    crate::clock::to_millis(t)
}
