//! PostgreSQL: schedule rows and the materialisation of their occurrences (Q7).
//!
//! Materialising is a compare-and-swap on `next_run_at` plus the occurrence's unique insert in
//! one transaction: a concurrent scheduler blocks on the row lock, then sees the moved
//! `next_run_at` and updates nothing.

use super::{enqueue::enqueue_one, ts, PgStore};
use crate::error::{Error, Result};
use crate::schedule::{recurrence_columns, PreparedSchedule, Schedule};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::Row;

pub(super) async fn upsert(
    store: &PgStore,
    s: &PreparedSchedule,
    now: DateTime<Utc>,
) -> Result<i64> {
    let (kind, interval_ms, fixed_delay, cron_expr, timezone) = recurrence_columns(&s.recurrence);
    let t = &s.template;
    sqlx::query_scalar(
        "INSERT INTO dockhand_schedules
            (name, hook, args, group_name, priority, max_attempts, timeout_ms, kind, interval_ms,
             fixed_delay, cron_expr, timezone, next_run_at, enabled, created_at, updated_at)
         VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, TRUE, $14, $14)
         ON CONFLICT (name) DO UPDATE SET
            hook = excluded.hook, args = excluded.args, group_name = excluded.group_name,
            priority = excluded.priority, max_attempts = excluded.max_attempts,
            timeout_ms = excluded.timeout_ms,
            next_run_at = CASE
                WHEN dockhand_schedules.enabled
                     AND dockhand_schedules.kind = excluded.kind
                     AND dockhand_schedules.interval_ms IS NOT DISTINCT FROM excluded.interval_ms
                     AND dockhand_schedules.fixed_delay = excluded.fixed_delay
                     AND dockhand_schedules.cron_expr IS NOT DISTINCT FROM excluded.cron_expr
                     AND dockhand_schedules.timezone IS NOT DISTINCT FROM excluded.timezone
                THEN dockhand_schedules.next_run_at ELSE excluded.next_run_at END,
            kind = excluded.kind, interval_ms = excluded.interval_ms,
            fixed_delay = excluded.fixed_delay, cron_expr = excluded.cron_expr,
            timezone = excluded.timezone, enabled = TRUE, updated_at = excluded.updated_at
         RETURNING id",
    )
    .bind(&s.name)
    .bind(&t.hook)
    .bind(&t.args_json)
    .bind(&t.group)
    .bind(t.priority)
    .bind(t.max_attempts)
    .bind(t.timeout_ms)
    .bind(kind)
    .bind(interval_ms)
    .bind(fixed_delay)
    .bind(cron_expr)
    .bind(timezone)
    .bind(ts(s.next_run_at))
    .bind(ts(now))
    .fetch_one(&store.pool)
    .await
    .map_err(Error::db("upsert_schedule"))
}

fn schedule_from_row(row: &PgRow) -> Result<Schedule> {
    let d = || Error::db("decode schedule");
    let id: i64 = row.try_get("id").map_err(d())?;
    let args: Json<Value> = row.try_get("args").map_err(d())?;
    let recurrence = Schedule::recurrence_from_columns(
        id,
        &row.try_get::<String, _>("kind").map_err(d())?,
        row.try_get("interval_ms").map_err(d())?,
        row.try_get("fixed_delay").map_err(d())?,
        row.try_get("cron_expr").map_err(d())?,
        row.try_get("timezone").map_err(d())?,
    )?;
    Ok(Schedule {
        id,
        name: row.try_get("name").map_err(d())?,
        hook: row.try_get("hook").map_err(d())?,
        args: args.0,
        group: row.try_get("group_name").map_err(d())?,
        priority: row.try_get("priority").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        timeout_ms: row.try_get("timeout_ms").map_err(d())?,
        recurrence,
        next_run_at: row.try_get("next_run_at").map_err(d())?,
        enabled: row.try_get("enabled").map_err(d())?,
    })
}

pub(super) async fn list(
    store: &PgStore,
    horizon: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<Schedule>> {
    let rows = match horizon {
        Some(h) => {
            sqlx::query(
                "SELECT * FROM dockhand_schedules WHERE enabled AND next_run_at <= $1
                 ORDER BY next_run_at LIMIT $2",
            )
            .bind(ts(h))
            .bind(limit.max(0))
            .fetch_all(&store.pool)
            .await
        }
        None => {
            sqlx::query("SELECT * FROM dockhand_schedules ORDER BY id")
                .fetch_all(&store.pool)
                .await
        }
    }
    .map_err(Error::db("schedules"))?;
    rows.iter().map(schedule_from_row).collect()
}

pub(super) async fn materialise(
    store: &PgStore,
    s: &Schedule,
    occurrence: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let action = s.occurrence(occurrence)?;
    let mut tx = store.begin("materialise").await?;
    let moved = sqlx::query(
        "UPDATE dockhand_schedules SET next_run_at = $1, updated_at = $2
         WHERE id = $3 AND next_run_at = $4 AND enabled",
    )
    .bind(next.map(ts))
    .bind(ts(now))
    .bind(s.id)
    .bind(ts(occurrence))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("materialise"))?;
    if moved.rows_affected() != 1 {
        tx.rollback().await.map_err(Error::db("materialise"))?;
        return Ok(false);
    }
    enqueue_one(&mut tx, &action, now, Some(&store.channel)).await?;
    tx.commit().await.map_err(Error::db("materialise"))?;
    Ok(true)
}

pub(super) async fn rearm_fixed_delay(store: &PgStore, now: DateTime<Utc>) -> Result<u64> {
    let done = sqlx::query(
        "UPDATE dockhand_schedules SET
            next_run_at = COALESCE(
                (SELECT MAX(a.finished_at) FROM dockhand_actions a
                 WHERE a.schedule_id = dockhand_schedules.id), $1)
                + interval_ms * interval '1 millisecond',
            updated_at = $1
         WHERE enabled AND kind = 'interval' AND fixed_delay AND next_run_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM dockhand_actions a
                           WHERE a.schedule_id = dockhand_schedules.id
                             AND a.status IN ('pending', 'running'))",
    )
    .bind(ts(now))
    .execute(&store.pool)
    .await
    .map_err(Error::db("rearm_fixed_delay"))?;
    Ok(done.rows_affected())
}

pub(super) async fn set_enabled(store: &PgStore, id: i64, enabled: bool) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE dockhand_schedules SET enabled = $1,
            next_run_at = CASE WHEN $1 THEN COALESCE(next_run_at, updated_at) ELSE NULL END
         WHERE id = $2",
    )
    .bind(enabled)
    .bind(id)
    .execute(&store.pool)
    .await
    .map_err(Error::db("set_schedule_enabled"))?;
    Ok(done.rows_affected() == 1)
}
