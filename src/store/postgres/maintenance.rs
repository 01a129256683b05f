//! PostgreSQL: lease reaper, retention and the maintenance-task leases.
//!
//! The reaper and retention pick their batch with `LIMIT … FOR UPDATE SKIP LOCKED` in a
//! subselect, so several processes running them at once take disjoint rows without waiting.

use super::finish::{enqueue_followup, returning_failed};
use super::{listen, ts, PgStore};
use crate::error::{Error, Result};
use crate::store::{PruneCutoffs, ReapReport};
use chrono::{DateTime, Utc};
use sqlx::Row;

pub(super) async fn reap_expired(
    store: &PgStore,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<ReapReport> {
    let now_utc = now;
    let now = ts(now);
    let limit = limit.max(0);
    let mut tx = store.begin("reap_expired").await?;
    // Out of attempts: failed. Otherwise: pending again (the attempt stays counted).
    // A failed step action leaves its job's finish action (jobs::finish), enqueued below.
    let failed_rows = sqlx::query(concat!(
        "UPDATE dockhand_actions SET status = 'failed', finished_at = $1,
            last_error = 'lease expired (owner ' || COALESCE(lease_owner, '?') || ')',
            lease_owner = NULL, lease_until = NULL
         WHERE id = ANY(ARRAY(SELECT id FROM dockhand_actions
                      WHERE status = 'running' AND lease_until < $1 AND attempt >= max_attempts
                      LIMIT $2
                      FOR UPDATE SKIP LOCKED))",
        returning_failed!()
    ))
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("reap_expired"))?;
    let mut failed = Vec::with_capacity(failed_rows.len());
    for row in &failed_rows {
        failed.push(row.try_get("id").map_err(Error::db("reap_expired"))?);
        enqueue_followup(&mut tx, Some(&store.channel), row, now_utc).await?;
    }
    let requeued: Vec<i64> = sqlx::query_scalar(
        "UPDATE dockhand_actions SET status = 'pending', scheduled_at = $1,
            last_error = 'lease expired (owner ' || COALESCE(lease_owner, '?') || ')',
            lease_owner = NULL, lease_until = NULL
         WHERE id = ANY(ARRAY(SELECT id FROM dockhand_actions
                      WHERE status = 'running' AND lease_until < $1 AND attempt < max_attempts
                      LIMIT $2
                      FOR UPDATE SKIP LOCKED))
         RETURNING id",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("reap_expired"))?;
    for (ids, event) in [
        (&failed, "lease_expired_failed"),
        (&requeued, "lease_expired"),
    ] {
        if ids.is_empty() {
            continue;
        }
        sqlx::query(
            "INSERT INTO dockhand_action_logs (action_id, at, event)
             SELECT unnest($1::bigint[]), $2, $3",
        )
        .bind(ids)
        .bind(now)
        .bind(event)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("reap_expired (log)"))?;
    }
    if !requeued.is_empty() {
        listen::notify(&mut tx, Some(&store.channel)).await?;
    }
    tx.commit().await.map_err(Error::db("reap_expired"))?;
    Ok(ReapReport {
        requeued: requeued.len() as u64,
        failed: failed.len() as u64,
        failed_ids: failed,
    })
}

pub(super) async fn prune(store: &PgStore, c: &PruneCutoffs) -> Result<u64> {
    // One statement: pick the batch, delete the actions, then their logs.
    let deleted: i64 = sqlx::query_scalar(
        "WITH doomed AS (
             SELECT id FROM dockhand_actions
             WHERE (status IN ('complete', 'canceled') AND finished_at < $1)
                OR (status = 'failed' AND finished_at < $2)
             LIMIT $3
             FOR UPDATE SKIP LOCKED),
         gone AS (
             DELETE FROM dockhand_actions
             WHERE id = ANY(ARRAY(SELECT id FROM doomed))
               AND status IN ('complete', 'canceled', 'failed')
             RETURNING id),
         gone_logs AS (
             DELETE FROM dockhand_action_logs WHERE action_id = ANY(ARRAY(SELECT id FROM gone)))
         SELECT COUNT(*) FROM gone",
    )
    .bind(ts(c.finished_before))
    .bind(ts(c.failed_before))
    .bind(c.batch.max(0))
    .fetch_one(&store.pool)
    .await
    .map_err(Error::db("prune"))?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}

pub(super) async fn try_lease(
    store: &PgStore,
    task: &str,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let got: Option<String> = sqlx::query_scalar(
        "INSERT INTO dockhand_maintenance_leases (task, owner, until) VALUES ($1, $2, $3)
         ON CONFLICT (task) DO UPDATE SET owner = excluded.owner, until = excluded.until
         WHERE dockhand_maintenance_leases.until <= $4
            OR dockhand_maintenance_leases.owner = excluded.owner
         RETURNING task",
    )
    .bind(task)
    .bind(owner)
    .bind(ts(until))
    .bind(ts(now))
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("maintenance lease"))?;
    Ok(got.is_some())
}

pub(super) async fn lease_held(store: &PgStore, task: &str, now: DateTime<Utc>) -> Result<bool> {
    let held: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM dockhand_maintenance_leases WHERE task = $1 AND until > $2",
    )
    .bind(task)
    .bind(ts(now))
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("maintenance lease held"))?;
    Ok(held.is_some())
}
