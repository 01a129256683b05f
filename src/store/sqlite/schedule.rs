//! SQLite: schedule rows and the materialisation of their occurrences (Q7).

use super::{enqueue::enqueue_one, from_ms, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::schedule::{recurrence_columns, PreparedSchedule, Schedule};
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

pub(super) async fn upsert(
    store: &SqliteStore,
    s: &PreparedSchedule,
    now: DateTime<Utc>,
) -> Result<i64> {
    let (kind, interval_ms, fixed_delay, cron_expr, timezone) = recurrence_columns(&s.recurrence);
    let t = &s.template;
    let mut tx = store.begin_write("upsert_schedule").await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO dockhand_schedules
            (name, hook, args, group_name, priority, max_attempts, timeout_ms, kind, interval_ms,
             fixed_delay, cron_expr, timezone, next_run_at, enabled, created_at, updated_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)
         ON CONFLICT (name) DO UPDATE SET
            hook = excluded.hook, args = excluded.args, group_name = excluded.group_name,
            priority = excluded.priority, max_attempts = excluded.max_attempts,
            timeout_ms = excluded.timeout_ms,
            next_run_at = CASE
                WHEN enabled = 1 AND kind = excluded.kind AND interval_ms IS excluded.interval_ms
                     AND fixed_delay = excluded.fixed_delay AND cron_expr IS excluded.cron_expr
                     AND timezone IS excluded.timezone
                THEN next_run_at ELSE excluded.next_run_at END,
            kind = excluded.kind, interval_ms = excluded.interval_ms,
            fixed_delay = excluded.fixed_delay, cron_expr = excluded.cron_expr,
            timezone = excluded.timezone, enabled = 1, updated_at = excluded.updated_at
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
    .bind(ms(s.next_run_at))
    .bind(ms(now))
    .bind(ms(now))
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db("upsert_schedule"))?;
    tx.commit().await.map_err(Error::db("upsert_schedule"))?;
    Ok(id)
}

fn schedule_from_row(row: &SqliteRow) -> Result<Schedule> {
    let d = || Error::db("decode schedule");
    let id: i64 = row.try_get("id").map_err(d())?;
    let args: String = row.try_get("args").map_err(d())?;
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
        args: serde_json::from_str(&args).map_err(|e| Error::Corrupt {
            what: "schedule",
            id,
            message: format!("args: {e}"),
        })?,
        group: row.try_get("group_name").map_err(d())?,
        priority: row.try_get("priority").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        timeout_ms: row.try_get("timeout_ms").map_err(d())?,
        recurrence,
        next_run_at: row
            .try_get::<Option<i64>, _>("next_run_at")
            .map_err(d())?
            .map(from_ms),
        enabled: row.try_get("enabled").map_err(d())?,
    })
}

pub(super) async fn list(
    store: &SqliteStore,
    horizon: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<Schedule>> {
    let rows = match horizon {
        Some(h) => {
            sqlx::query(
                "SELECT * FROM dockhand_schedules WHERE enabled = 1 AND next_run_at <= ?
             ORDER BY next_run_at LIMIT ?",
            )
            .bind(ms(h))
            .bind(limit)
            .fetch_all(&store.reader)
            .await
        }
        None => {
            sqlx::query("SELECT * FROM dockhand_schedules ORDER BY id")
                .fetch_all(&store.reader)
                .await
        }
    }
    .map_err(Error::db("schedules"))?;
    rows.iter().map(schedule_from_row).collect()
}

pub(super) async fn materialise(
    store: &SqliteStore,
    s: &Schedule,
    occurrence: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let action = s.occurrence(occurrence)?;
    let mut tx = store.begin_write("materialise").await?;
    let moved = sqlx::query(
        "UPDATE dockhand_schedules SET next_run_at = ?, updated_at = ?
         WHERE id = ? AND next_run_at = ? AND enabled = 1",
    )
    .bind(next.map(ms))
    .bind(ms(now))
    .bind(s.id)
    .bind(ms(occurrence))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("materialise"))?;
    if moved.rows_affected() != 1 {
        tx.rollback().await.map_err(Error::db("materialise"))?;
        return Ok(false);
    }
    enqueue_one(&mut tx, &action, now).await?;
    tx.commit().await.map_err(Error::db("materialise"))?;
    Ok(true)
}

pub(super) async fn rearm_fixed_delay(store: &SqliteStore, now: DateTime<Utc>) -> Result<u64> {
    let mut tx = store.begin_write("rearm_fixed_delay").await?;
    let done = sqlx::query(
        "UPDATE dockhand_schedules SET
            next_run_at = COALESCE(
                (SELECT MAX(a.finished_at) FROM dockhand_actions a
                 WHERE a.schedule_id = dockhand_schedules.id), ?) + interval_ms,
            updated_at = ?
         WHERE enabled = 1 AND kind = 'interval' AND fixed_delay = 1 AND next_run_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM dockhand_actions a
                           WHERE a.schedule_id = dockhand_schedules.id
                             AND a.status IN ('pending', 'running'))",
    )
    .bind(ms(now))
    .bind(ms(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("rearm_fixed_delay"))?;
    tx.commit().await.map_err(Error::db("rearm_fixed_delay"))?;
    Ok(done.rows_affected())
}

pub(super) async fn set_enabled(store: &SqliteStore, id: i64, enabled: bool) -> Result<bool> {
    let mut tx = store.begin_write("set_schedule_enabled").await?;
    let done = sqlx::query(
        "UPDATE dockhand_schedules SET enabled = ?,
            next_run_at = CASE WHEN ? THEN COALESCE(next_run_at, updated_at) ELSE NULL END
         WHERE id = ?",
    )
    .bind(enabled)
    .bind(enabled)
    .bind(id)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("set_schedule_enabled"))?;
    tx.commit()
        .await
        .map_err(Error::db("set_schedule_enabled"))?;
    Ok(done.rows_affected() == 1)
}
