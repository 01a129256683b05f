//! MySQL: schedule rows and the materialisation of their occurrences (Q7).
//!
//! The upsert is `INSERT … ON DUPLICATE KEY UPDATE` on the unique name, with
//! `id = LAST_INSERT_ID(id)` so the statement reports the row's id whether it inserted or
//! updated. MySQL evaluates the update's assignments left to right on the updated row, so
//! `next_run_at` is decided first, while `kind`, `interval_ms`, … still hold the old values.

use super::{enqueue::enqueue_one, from_ms, ms, opt_text, retry_deadlocks, text, MySqlStore};
use crate::error::{Error, Result};
use crate::schedule::{recurrence_columns, PreparedSchedule, Schedule};
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

const UPSERT: &str = "INSERT INTO dockhand_schedules
    (name, hook, args, group_name, priority, max_attempts, timeout_ms, kind, interval_ms,
     fixed_delay, cron_expr, timezone, next_run_at, enabled, created_at, updated_at)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, TRUE, ?, ?)
 ON DUPLICATE KEY UPDATE
    id = LAST_INSERT_ID(id),
    next_run_at = CASE
        WHEN enabled AND kind = VALUES(kind) AND interval_ms <=> VALUES(interval_ms)
             AND fixed_delay = VALUES(fixed_delay) AND cron_expr <=> VALUES(cron_expr)
             AND timezone <=> VALUES(timezone)
        THEN next_run_at ELSE VALUES(next_run_at) END,
    hook = VALUES(hook), args = VALUES(args), group_name = VALUES(group_name),
    priority = VALUES(priority), max_attempts = VALUES(max_attempts),
    timeout_ms = VALUES(timeout_ms), kind = VALUES(kind), interval_ms = VALUES(interval_ms),
    fixed_delay = VALUES(fixed_delay), cron_expr = VALUES(cron_expr),
    timezone = VALUES(timezone), enabled = TRUE, updated_at = VALUES(updated_at)";

pub(super) async fn upsert(
    store: &MySqlStore,
    s: &PreparedSchedule,
    now: DateTime<Utc>,
) -> Result<i64> {
    let (kind, interval_ms, fixed_delay, cron_expr, timezone) = recurrence_columns(&s.recurrence);
    let t = &s.template;
    retry_deadlocks("upsert_schedule", || async move {
        let done = sqlx::query(UPSERT)
            .bind(s.name.as_bytes())
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
            .execute(store.pool())
            .await
            .map_err(Error::db("upsert_schedule"))?;
        i64::try_from(done.last_insert_id()).map_err(|_| {
            Error::Config(format!(
                "upsert_schedule: LAST_INSERT_ID {} out of range",
                done.last_insert_id()
            ))
        })
    })
    .await
}

fn schedule_from_row(row: &MySqlRow) -> Result<Schedule> {
    let d = || Error::db("decode schedule");
    let id: i64 = row.try_get("id").map_err(d())?;
    let args = text(row, "args").map_err(d())?;
    let recurrence = Schedule::recurrence_from_columns(
        id,
        &text(row, "kind").map_err(d())?,
        row.try_get("interval_ms").map_err(d())?,
        row.try_get("fixed_delay").map_err(d())?,
        opt_text(row, "cron_expr").map_err(d())?,
        opt_text(row, "timezone").map_err(d())?,
    )?;
    Ok(Schedule {
        id,
        name: text(row, "name").map_err(d())?,
        hook: text(row, "hook").map_err(d())?,
        args: serde_json::from_str(&args).map_err(|e| Error::Corrupt {
            what: "schedule",
            id,
            message: format!("args: {e}"),
        })?,
        group: opt_text(row, "group_name").map_err(d())?,
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
    store: &MySqlStore,
    horizon: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<Schedule>> {
    let rows = match horizon {
        Some(h) => {
            sqlx::query(
                "SELECT * FROM dockhand_schedules WHERE enabled = TRUE AND next_run_at <= ?
                 ORDER BY next_run_at LIMIT ?",
            )
            .bind(ms(h))
            .bind(limit.max(0))
            .fetch_all(store.pool())
            .await
        }
        None => {
            sqlx::query("SELECT * FROM dockhand_schedules ORDER BY id")
                .fetch_all(store.pool())
                .await
        }
    }
    .map_err(Error::db("schedules"))?;
    rows.iter().map(schedule_from_row).collect()
}

pub(super) async fn materialise(
    store: &MySqlStore,
    s: &Schedule,
    occurrence: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let action = s.occurrence(occurrence)?;
    let action = &action;
    retry_deadlocks("materialise", || async move {
        let mut tx = store.begin("materialise").await?;
        let moved = sqlx::query(
            "UPDATE dockhand_schedules SET next_run_at = ?, updated_at = ?
             WHERE id = ? AND next_run_at = ? AND enabled = TRUE",
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
        enqueue_one(&mut tx, action, now).await?;
        tx.commit().await.map_err(Error::db("materialise"))?;
        Ok(true)
    })
    .await
}

pub(super) async fn rearm_fixed_delay(store: &MySqlStore, now: DateTime<Utc>) -> Result<u64> {
    retry_deadlocks("rearm_fixed_delay", || async move {
        let done = sqlx::query(
            "UPDATE dockhand_schedules s SET
                s.next_run_at = COALESCE(
                    (SELECT MAX(a.finished_at) FROM dockhand_actions a
                     WHERE a.schedule_id = s.id), ?) + s.interval_ms,
                s.updated_at = ?
             WHERE s.enabled = TRUE AND s.kind = 'interval' AND s.fixed_delay = TRUE
               AND s.next_run_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM dockhand_actions a
                               WHERE a.schedule_id = s.id
                                 AND a.status IN ('pending', 'running'))",
        )
        .bind(ms(now))
        .bind(ms(now))
        .execute(store.pool())
        .await
        .map_err(Error::db("rearm_fixed_delay"))?;
        Ok(done.rows_affected())
    })
    .await
}

pub(super) async fn set_enabled(store: &MySqlStore, id: i64, enabled: bool) -> Result<bool> {
    retry_deadlocks("set_schedule_enabled", || async move {
        let done = sqlx::query(
            "UPDATE dockhand_schedules SET
                next_run_at = CASE WHEN ? THEN COALESCE(next_run_at, updated_at) ELSE NULL END,
                enabled = ?
             WHERE id = ?",
        )
        .bind(enabled)
        .bind(enabled)
        .bind(id)
        .execute(store.pool())
        .await
        .map_err(Error::db("set_schedule_enabled"))?;
        Ok(done.rows_affected() == 1)
    })
    .await
}
