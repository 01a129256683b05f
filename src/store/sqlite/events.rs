//! SQLite: the lifecycle-event outbox (one row per job, rewritten on each transition; a
//! delivery marks it).

use super::{from_ms, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::jobs::listeners::LISTENERS_TASK;
use crate::jobs::JobEvent;
use chrono::{DateTime, Utc};
use sqlx::Row;

pub(super) async fn undelivered_events(store: &SqliteStore, limit: i64) -> Result<Vec<JobEvent>> {
    let limit = if limit <= 0 { 100 } else { limit };
    let rows = sqlx::query(
        "SELECT e.id, e.job_id, j.pipeline, e.status, e.reason, e.created_at
         FROM dockhand_job_events e JOIN dockhand_jobs j ON j.id = e.job_id
         WHERE e.delivered_at IS NULL
         ORDER BY e.id
         LIMIT ?",
    )
    .bind(limit)
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db("undelivered_events"))?;
    let d = || Error::db("decode job event");
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get("id").map_err(d())?;
            let status: String = row.try_get("status").map_err(d())?;
            Ok(JobEvent {
                id,
                job_id: row.try_get("job_id").map_err(d())?,
                pipeline: row.try_get("pipeline").map_err(d())?,
                status: status.parse().map_err(|e: Error| Error::Corrupt {
                    what: "job event",
                    id,
                    message: e.to_string(),
                })?,
                reason: row.try_get("reason").map_err(d())?,
                created_at: from_ms(row.try_get("created_at").map_err(d())?),
            })
        })
        .collect()
}

pub(super) async fn mark_event_delivered(
    store: &SqliteStore,
    event_id: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut tx = store.begin_write("mark_event_delivered").await?;
    let done = sqlx::query(
        "UPDATE dockhand_job_events SET delivered_at = ?
         WHERE id = ? AND delivered_at IS NULL",
    )
    .bind(ms(now))
    .bind(event_id)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("mark_event_delivered"))?;
    tx.commit()
        .await
        .map_err(Error::db("mark_event_delivered"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn mark_events_unheard(
    store: &SqliteStore,
    event_ids: &[i64],
    now: DateTime<Utc>,
) -> Result<u64> {
    let op = "mark_events_unheard";
    if event_ids.is_empty() {
        return Ok(0);
    }
    let ids =
        serde_json::to_string(event_ids).map_err(|e| Error::invalid("event_ids", e.to_string()))?;
    let mut tx = store.begin_write(op).await?;
    let done = sqlx::query(
        "UPDATE dockhand_job_events SET delivered_at = ?1
         WHERE id IN (SELECT value FROM json_each(?2)) AND delivered_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM dockhand_maintenance_leases
                           WHERE task = ?3 AND until > ?1)",
    )
    .bind(ms(now))
    .bind(ids)
    .bind(LISTENERS_TASK)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(done.rows_affected())
}
