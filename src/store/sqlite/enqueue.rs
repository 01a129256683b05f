//! SQLite: inserting actions (single, unique, bulk, inside a caller's transaction).

use super::{ms, SqliteStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::Enqueued;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

/// Bound parameters per inserted row; chunks stay under SQLite's 32,766-parameter limit.
const PARAMS_PER_ROW: usize = 10;
const MAX_PARAMS: usize = 32_000;

const INSERT_ONE: &str = "INSERT INTO dockhand_actions
    (hook, args, group_name, priority, status, scheduled_at, max_attempts, timeout_ms,
     unique_key, created_at, schedule_id)
 VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)
 ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
 DO NOTHING
 RETURNING id";

pub(super) async fn enqueue(
    store: &SqliteStore,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let mut tx = store.begin_write("enqueue").await?;
    let r = enqueue_one(&mut tx, action, now).await?;
    tx.commit().await.map_err(Error::db("enqueue"))?;
    Ok(r)
}

/// Inserts one action on an open write transaction; a unique duplicate yields the active id.
pub(super) async fn enqueue_one(
    conn: &mut SqliteConnection,
    a: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let inserted: Option<i64> = sqlx::query_scalar(INSERT_ONE)
        .bind(&a.hook)
        .bind(&a.args_json)
        .bind(&a.group)
        .bind(a.priority)
        .bind(ms(a.scheduled_at))
        .bind(a.max_attempts)
        .bind(a.timeout_ms)
        .bind(&a.unique_key)
        .bind(ms(now))
        .bind(a.schedule_id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::db("enqueue"))?;
    match inserted {
        Some(id) => {
            log_created(conn, &[id], now).await?;
            Ok(Enqueued { id, inserted: true })
        }
        None => {
            // Inside the same write transaction, so the conflicting row is still active.
            let id: i64 = sqlx::query_scalar(
                "SELECT id FROM dockhand_actions
                 WHERE unique_key = ? AND status IN ('pending', 'running')",
            )
            .bind(&a.unique_key)
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::db("enqueue (find duplicate)"))?;
            Ok(Enqueued {
                id,
                inserted: false,
            })
        }
    }
}

async fn log_created(conn: &mut SqliteConnection, ids: &[i64], now: DateTime<Utc>) -> Result<()> {
    let ids_json = serde_json::to_string(ids).map_err(|e| Error::invalid("ids", e.to_string()))?;
    sqlx::query(
        "INSERT INTO dockhand_action_logs (action_id, at, event)
         SELECT value, ?, 'created' FROM json_each(?)",
    )
    .bind(ms(now))
    .bind(ids_json)
    .execute(&mut *conn)
    .await
    .map_err(Error::db("enqueue (log)"))?;
    Ok(())
}

pub(super) async fn enqueue_bulk(
    store: &SqliteStore,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    let mut results: Vec<Option<Enqueued>> = vec![None; actions.len()];
    let mut tx = store.begin_write("enqueue_bulk").await?;
    // Unique actions go one by one (each may resolve to an existing id); the rest in chunks.
    let plain: Vec<usize> = (0..actions.len())
        .filter(|&i| actions[i].unique_key.is_none())
        .collect();
    for (i, a) in actions.iter().enumerate() {
        if a.unique_key.is_some() {
            results[i] = Some(enqueue_one(&mut tx, a, now).await?);
        }
    }
    for chunk in plain.chunks(MAX_PARAMS / PARAMS_PER_ROW) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO dockhand_actions (hook, args, group_name, priority, status, scheduled_at,
             max_attempts, timeout_ms, created_at, schedule_id) ",
        );
        qb.push_values(chunk, |mut b, &i| {
            let a = &actions[i];
            b.push_bind(&a.hook)
                .push_bind(&a.args_json)
                .push_bind(&a.group)
                .push_bind(a.priority)
                .push_bind("pending")
                .push_bind(ms(a.scheduled_at))
                .push_bind(a.max_attempts)
                .push_bind(a.timeout_ms)
                .push_bind(ms(now))
                .push_bind(a.schedule_id);
        });
        qb.push(" RETURNING id");
        let mut ids: Vec<i64> = qb
            .build_query_scalar()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("enqueue_bulk"))?;
        // Row ids are assigned in VALUES order; sort in case RETURNING order differs.
        ids.sort_unstable();
        if ids.len() != chunk.len() {
            return Err(Error::Config(format!(
                "bulk insert returned {} ids for {} rows",
                ids.len(),
                chunk.len()
            )));
        }
        log_created(&mut tx, &ids, now).await?;
        for (&i, id) in chunk.iter().zip(ids) {
            results[i] = Some(Enqueued { id, inserted: true });
        }
    }
    tx.commit().await.map_err(Error::db("enqueue_bulk"))?;
    Ok(results.into_iter().flatten().collect())
}
