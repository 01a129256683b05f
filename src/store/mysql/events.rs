//! MySQL: the lifecycle-event outbox (one row per job, rewritten on each transition; a
//! delivery marks it).

use super::claim::push_in;
use super::connect::retry_deadlocks;
use super::jobs::{opt_text, text};
use super::{from_ms, ms, MySqlStore};
use crate::error::{Error, Result};
use crate::jobs::listeners::LISTENERS_TASK;
use crate::jobs::JobEvent;
use chrono::{DateTime, Utc};
use sqlx::Row;

pub(super) async fn undelivered_events(store: &MySqlStore, limit: i64) -> Result<Vec<JobEvent>> {
    let limit = if limit <= 0 { 100 } else { limit };
    let rows = sqlx::query(
        "SELECT e.id, e.job_id, j.pipeline, e.status, e.reason, e.created_at
         FROM dockhand_job_events e JOIN dockhand_jobs j ON j.id = e.job_id
         WHERE e.delivered_at IS NULL
         ORDER BY e.id
         LIMIT ?",
    )
    .bind(limit)
    .fetch_all(store.pool())
    .await
    .map_err(Error::db("undelivered_events"))?;
    let d = || Error::db("decode job event");
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get("id").map_err(d())?;
            let status = text(row, "status")?;
            Ok(JobEvent {
                id,
                job_id: row.try_get("job_id").map_err(d())?,
                pipeline: text(row, "pipeline")?,
                status: status.parse().map_err(|e: Error| Error::Corrupt {
                    what: "job event",
                    id,
                    message: e.to_string(),
                })?,
                reason: opt_text(row, "reason")?,
                created_at: from_ms(row.try_get("created_at").map_err(d())?),
            })
        })
        .collect()
}

pub(super) async fn mark_event_delivered(
    store: &MySqlStore,
    event_id: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "mark_event_delivered";
    retry_deadlocks(op, move || async move {
        let done = sqlx::query(
            "UPDATE dockhand_job_events SET delivered_at = ?
             WHERE id = ? AND delivered_at IS NULL",
        )
        .bind(ms(now))
        .bind(event_id)
        .execute(store.pool())
        .await
        .map_err(Error::db(op))?;
        Ok(done.rows_affected() == 1)
    })
    .await
}

pub(super) async fn mark_events_unheard(
    store: &MySqlStore,
    event_ids: &[i64],
    now: DateTime<Utc>,
) -> Result<u64> {
    let op = "mark_events_unheard";
    if event_ids.is_empty() {
        return Ok(0);
    }
    retry_deadlocks(op, move || async move {
        let mut qb: sqlx::QueryBuilder<sqlx::MySql> =
            sqlx::QueryBuilder::new("UPDATE dockhand_job_events SET delivered_at = ");
        qb.push_bind(ms(now))
            .push(
                " WHERE NOT EXISTS (SELECT 1 FROM dockhand_maintenance_leases
                   WHERE task = ",
            )
            .push_bind(LISTENERS_TASK.as_bytes())
            .push(" AND until > ")
            .push_bind(ms(now))
            .push(") AND delivered_at IS NULL AND id");
        push_in(&mut qb, event_ids);
        let done = qb
            .build()
            .execute(store.pool())
            .await
            .map_err(Error::db(op))?;
        Ok(done.rows_affected())
    })
    .await
}
