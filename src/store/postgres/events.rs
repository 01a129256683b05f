//! PostgreSQL: the lifecycle-event outbox (one row per job, rewritten on each transition; a
//! delivery marks it).

use super::jobs::DEFAULT_LIMIT;
use super::{ts, PgStore};
use crate::error::{Error, Result};
use crate::jobs::listeners::LISTENERS_TASK;
use crate::jobs::JobEvent;
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use sqlx::Row;

pub(super) async fn undelivered_events(store: &PgStore, limit: i64) -> Result<Vec<JobEvent>> {
    let rows = sqlx::query(
        "SELECT e.id, e.job_id, j.pipeline, e.status, e.reason, e.created_at
         FROM dockhand_job_events e JOIN dockhand_jobs j ON j.id = e.job_id
         WHERE e.delivered_at IS NULL
         ORDER BY e.id LIMIT $1",
    )
    .bind(if limit <= 0 { DEFAULT_LIMIT } else { limit })
    .fetch_all(&store.pool)
    .await
    .map_err(Error::db("undelivered_events"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("decode job event");
            let id: i64 = r.try_get("id").map_err(d())?;
            let status: String = r.try_get("status").map_err(d())?;
            Ok(JobEvent {
                id,
                job_id: r.try_get("job_id").map_err(d())?,
                pipeline: r.try_get("pipeline").map_err(d())?,
                status: status.parse::<JobStatus>().map_err(|e| Error::Corrupt {
                    what: "job event",
                    id,
                    message: e.to_string(),
                })?,
                reason: r.try_get("reason").map_err(d())?,
                created_at: r.try_get("created_at").map_err(d())?,
            })
        })
        .collect()
}

pub(super) async fn mark_event_delivered(
    store: &PgStore,
    event_id: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE dockhand_job_events SET delivered_at = $2
         WHERE id = $1 AND delivered_at IS NULL",
    )
    .bind(event_id)
    .bind(ts(now))
    .execute(&store.pool)
    .await
    .map_err(Error::db("mark_event_delivered"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn mark_events_unheard(
    store: &PgStore,
    event_ids: &[i64],
    now: DateTime<Utc>,
) -> Result<u64> {
    if event_ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "UPDATE dockhand_job_events SET delivered_at = $2
         WHERE id = ANY($1) AND delivered_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM dockhand_maintenance_leases
                           WHERE task = $3 AND until > $2)",
    )
    .bind(event_ids)
    .bind(ts(now))
    .bind(LISTENERS_TASK)
    .execute(&store.pool)
    .await
    .map_err(Error::db("mark_events_unheard"))?;
    Ok(done.rows_affected())
}
