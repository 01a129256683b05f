//! PostgreSQL: inserting actions (single, unique, bulk, inside a caller's transaction), with
//! the `pg_notify` that wakes other processes' runners when a due action commits.

use super::{listen, ts, PgStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::Enqueued;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Rows per bulk INSERT statement.
const BULK_CHUNK: usize = 5_000;

/// How often a unique insert is retried when the conflicting row finished before it could be
/// read back.
const UNIQUE_ATTEMPTS: usize = 5;

const INSERT_ONE: &str = "INSERT INTO dockhand_actions
    (hook, args, group_name, priority, status, scheduled_at, max_attempts, timeout_ms,
     unique_key, created_at, schedule_id)
 VALUES ($1, $2::jsonb, $3, $4, 'pending', $5, $6, $7, $8, $9, $10)
 ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
 DO NOTHING
 RETURNING id";

const INSERT_BULK: &str = "INSERT INTO dockhand_actions
    (hook, args, group_name, priority, status, scheduled_at, max_attempts, timeout_ms,
     created_at, schedule_id)
 SELECT t.hook, t.args::jsonb, t.group_name, t.priority, 'pending', t.scheduled_at,
        t.max_attempts, t.timeout_ms, $9, t.schedule_id
 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[], $6::int4[],
             $7::int8[], $8::int8[])
      AS t(hook, args, group_name, priority, scheduled_at, max_attempts, timeout_ms, schedule_id)
 RETURNING id";

/// [`INSERT_ONE`] and, when due, the `pg_notify`, in one statement (`$11` is the channel).
/// The `created` log entry is the row's `created_at` (see [`crate::action::ActionLog`]).
const INSERT_ONE_NOTIFY: &str = "WITH ins AS (
     INSERT INTO dockhand_actions
         (hook, args, group_name, priority, status, scheduled_at, max_attempts, timeout_ms,
          unique_key, created_at, schedule_id)
     VALUES ($1, $2::jsonb, $3, $4, 'pending', $5, $6, $7, $8, $9, $10)
     ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
     DO NOTHING
     RETURNING id, scheduled_at),
 woke AS (
     SELECT pg_notify($11, '') FROM ins WHERE scheduled_at <= $9)
 SELECT id FROM ins WHERE (SELECT count(*) FROM woke) >= 0";

/// One enqueue in autocommit mode: a single statement on the success path (no BEGIN/COMMIT
/// round trips); a unique duplicate is then looked up (and the insert retried if the duplicate
/// finished in between).
pub(super) async fn enqueue(
    store: &PgStore,
    a: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let mut conn = store.pool.acquire().await.map_err(Error::db("enqueue"))?;
    for _ in 0..UNIQUE_ATTEMPTS {
        let inserted: Option<i64> = sqlx::query_scalar(INSERT_ONE_NOTIFY)
            .bind(&a.hook)
            .bind(&a.args_json)
            .bind(&a.group)
            .bind(a.priority)
            .bind(ts(a.scheduled_at))
            .bind(a.max_attempts)
            .bind(a.timeout_ms)
            .bind(&a.unique_key)
            .bind(ts(now))
            .bind(a.schedule_id)
            .bind(&store.channel)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db("enqueue"))?;
        if let Some(id) = inserted {
            return Ok(Enqueued { id, inserted: true });
        }
        if let Some(id) = active_duplicate(&mut conn, a).await? {
            return Ok(Enqueued {
                id,
                inserted: false,
            });
        }
    }
    Err(Error::Database {
        op: "enqueue (find duplicate)",
        source: sqlx::Error::RowNotFound,
    })
}

/// The active (pending or running) action holding `a`'s unique key. READ COMMITTED: this
/// statement sees the conflicting row once its inserter committed.
async fn active_duplicate(conn: &mut PgConnection, a: &PreparedAction) -> Result<Option<i64>> {
    sqlx::query_scalar(
        "SELECT id FROM dockhand_actions
         WHERE unique_key = $1 AND status IN ('pending', 'running')",
    )
    .bind(&a.unique_key)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db("enqueue (find duplicate)"))
}

/// Inserts one action on an open transaction; a unique duplicate yields the active id.
/// `channel` is the wake-up channel to notify when the action is due (`None`: the channel of
/// the connection's current schema).
pub(super) async fn enqueue_one(
    conn: &mut PgConnection,
    a: &PreparedAction,
    now: DateTime<Utc>,
    channel: Option<&str>,
) -> Result<Enqueued> {
    for _ in 0..UNIQUE_ATTEMPTS {
        // ON CONFLICT DO NOTHING waits for an in-flight inserter of the same key to finish.
        let inserted: Option<i64> = sqlx::query_scalar(INSERT_ONE)
            .bind(&a.hook)
            .bind(&a.args_json)
            .bind(&a.group)
            .bind(a.priority)
            .bind(ts(a.scheduled_at))
            .bind(a.max_attempts)
            .bind(a.timeout_ms)
            .bind(&a.unique_key)
            .bind(ts(now))
            .bind(a.schedule_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db("enqueue"))?;
        if let Some(id) = inserted {
            if a.scheduled_at <= now {
                listen::notify(conn, channel).await?;
            }
            return Ok(Enqueued { id, inserted: true });
        }
        if let Some(id) = active_duplicate(conn, a).await? {
            return Ok(Enqueued {
                id,
                inserted: false,
            });
        }
        // The conflicting action finished in between: its key is free again, insert anew.
    }
    Err(Error::Database {
        op: "enqueue (find duplicate)",
        source: sqlx::Error::RowNotFound,
    })
}

pub(super) async fn enqueue_bulk(
    store: &PgStore,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    let mut results: Vec<Option<Enqueued>> = vec![None; actions.len()];
    let mut tx = store.begin("enqueue_bulk").await?;
    // Unique actions go one by one (each may resolve to an existing id); the rest in chunks.
    let plain: Vec<usize> = (0..actions.len())
        .filter(|&i| actions[i].unique_key.is_none())
        .collect();
    for (i, a) in actions.iter().enumerate() {
        if a.unique_key.is_some() {
            results[i] = Some(enqueue_one(&mut tx, a, now, Some(&store.channel)).await?);
        }
    }
    for chunk in plain.chunks(BULK_CHUNK) {
        let rows = chunk.iter().map(|&i| &actions[i]);
        let hooks: Vec<&str> = rows.clone().map(|a| a.hook.as_str()).collect();
        let args: Vec<&str> = rows.clone().map(|a| a.args_json.as_str()).collect();
        let groups: Vec<Option<&str>> = rows.clone().map(|a| a.group.as_deref()).collect();
        let priorities: Vec<i32> = rows.clone().map(|a| a.priority).collect();
        let scheduled: Vec<DateTime<Utc>> = rows.clone().map(|a| ts(a.scheduled_at)).collect();
        let attempts: Vec<i32> = rows.clone().map(|a| a.max_attempts).collect();
        let timeouts: Vec<Option<i64>> = rows.clone().map(|a| a.timeout_ms).collect();
        let schedules: Vec<Option<i64>> = rows.map(|a| a.schedule_id).collect();
        let mut ids: Vec<i64> = sqlx::query_scalar(INSERT_BULK)
            .bind(hooks)
            .bind(args)
            .bind(groups)
            .bind(priorities)
            .bind(scheduled)
            .bind(attempts)
            .bind(timeouts)
            .bind(schedules)
            .bind(ts(now))
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("enqueue_bulk"))?;
        // Identity values follow the UNNEST row order; sort in case RETURNING order differs.
        ids.sort_unstable();
        if ids.len() != chunk.len() {
            return Err(Error::Config(format!(
                "bulk insert returned {} ids for {} rows",
                ids.len(),
                chunk.len()
            )));
        }
        for (&i, id) in chunk.iter().zip(ids) {
            results[i] = Some(Enqueued { id, inserted: true });
        }
    }
    if plain.iter().any(|&i| actions[i].scheduled_at <= now) {
        listen::notify(&mut tx, Some(&store.channel)).await?;
    }
    tx.commit().await.map_err(Error::db("enqueue_bulk"))?;
    Ok(results.into_iter().flatten().collect())
}

/// The group of `parent`'s chunk and finalize actions ([`crate::batch::action_group`]): its
/// pipeline's group, read in the caller's transaction.
pub(super) async fn batch_group(conn: &mut PgConnection, parent: i64) -> Result<String> {
    let pipeline: Option<String> =
        sqlx::query_scalar("SELECT pipeline FROM dockhand_jobs WHERE id = $1")
            .bind(parent)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db("batch_group"))?;
    Ok(crate::batch::action_group(pipeline.as_deref()))
}

/// `FROM UNNEST` of actions' columns as [`bind_unnested`] binds them (`$1`-`$8`: hook, args,
/// group, priority, scheduled_at, max_attempts, timeout_ms, unique_key), as the table `t`.
macro_rules! unnested_actions_sql {
    () => {
        "FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[],
                     $6::int4[], $7::int8[], $8::text[])
              AS t(hook, args, group_name, priority, scheduled_at, max_attempts, timeout_ms,
                   unique_key)"
    };
}
pub(super) use unnested_actions_sql;

/// Binds `actions`' columns as `$1`-`$8` of [`unnested_actions_sql`].
pub(super) fn bind_unnested<'q, O>(
    q: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    actions: &'q [PreparedAction],
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    let column = |f: fn(&PreparedAction) -> Option<&str>| actions.iter().map(f).collect::<Vec<_>>();
    q.bind(column(|a| Some(a.hook.as_str())))
        .bind(column(|a| Some(a.args_json.as_str())))
        .bind(column(|a| a.group.as_deref()))
        .bind(actions.iter().map(|a| a.priority).collect::<Vec<_>>())
        .bind(
            actions
                .iter()
                .map(|a| ts(a.scheduled_at))
                .collect::<Vec<_>>(),
        )
        .bind(actions.iter().map(|a| a.max_attempts).collect::<Vec<_>>())
        .bind(actions.iter().map(|a| a.timeout_ms).collect::<Vec<_>>())
        .bind(column(|a| a.unique_key.as_deref()))
}

/// Inserts actions whose unique keys no active action can hold (a fresh child's step actions)
/// on an open transaction, one statement per [`BULK_CHUNK`], and, when one is due, the
/// `pg_notify`. A key held after all (a leftover) is skipped, as
/// `ON CONFLICT … DO NOTHING`. Returns how many were inserted.
pub(super) async fn enqueue_fresh(
    conn: &mut PgConnection,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
    channel: Option<&str>,
) -> Result<usize> {
    let op = "enqueue (fresh)";
    let mut inserted = 0;
    for part in actions.chunks(BULK_CHUNK) {
        let ids: Vec<(i64,)> = bind_unnested(
            sqlx::query_as(concat!(
                "INSERT INTO dockhand_actions
                    (hook, args, group_name, priority, status, scheduled_at, max_attempts,
                     timeout_ms, unique_key, created_at)
                 SELECT t.hook, t.args::jsonb, t.group_name, t.priority, 'pending',
                        t.scheduled_at, t.max_attempts, t.timeout_ms, t.unique_key, $9 ",
                unnested_actions_sql!(),
                " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                     AND status IN ('pending', 'running')
                 DO NOTHING
                 RETURNING id"
            )),
            part,
        )
        .bind(ts(now))
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?;
        inserted += ids.len();
    }
    if actions.iter().any(|a| a.scheduled_at <= now) {
        listen::notify(conn, channel).await?;
    }
    Ok(inserted)
}
