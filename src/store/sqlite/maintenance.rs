//! SQLite: lease reaper, retention and the maintenance-task leases.

use super::finish::{enqueue_followup, returning_failed};
use super::{ms, SqliteStore};
use crate::error::{Error, Result};
use crate::store::{PruneCutoffs, ReapReport};
use chrono::{DateTime, Utc};
use sqlx::Row;

pub(super) async fn reap_expired(
    store: &SqliteStore,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<ReapReport> {
    let mut tx = store.begin_write("reap_expired").await?;
    // Out of attempts: failed. Otherwise: pending again (the attempt stays counted).
    // A failed step action leaves its job's finish action (jobs::finish), enqueued below.
    let failed_rows = sqlx::query(concat!(
        "UPDATE dockhand_actions SET status = 'failed', finished_at = ?1,
            last_error = 'lease expired (owner ' || COALESCE(lease_owner, '?') || ')',
            lease_owner = NULL, lease_until = NULL
         WHERE id IN (SELECT id FROM dockhand_actions
                      WHERE status = 'running' AND lease_until < ?1 AND attempt >= max_attempts
                      LIMIT ?2)",
        returning_failed!()
    ))
    .bind(ms(now))
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("reap_expired"))?;
    let mut failed = Vec::with_capacity(failed_rows.len());
    for row in &failed_rows {
        failed.push(row.try_get("id").map_err(Error::db("reap_expired"))?);
        enqueue_followup(&mut tx, row, now).await?;
    }
    let requeued: Vec<i64> = sqlx::query_scalar(
        "UPDATE dockhand_actions SET status = 'pending', scheduled_at = ?1,
            last_error = 'lease expired (owner ' || COALESCE(lease_owner, '?') || ')',
            lease_owner = NULL, lease_until = NULL
         WHERE id IN (SELECT id FROM dockhand_actions
                      WHERE status = 'running' AND lease_until < ?1 AND attempt < max_attempts
                      LIMIT ?2)
         RETURNING id",
    )
    .bind(ms(now))
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
        let ids_json =
            serde_json::to_string(ids).map_err(|e| Error::invalid("ids", e.to_string()))?;
        sqlx::query(
            "INSERT INTO dockhand_action_logs (action_id, at, event)
             SELECT value, ?, ? FROM json_each(?)",
        )
        .bind(ms(now))
        .bind(event)
        .bind(ids_json)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("reap_expired (log)"))?;
    }
    tx.commit().await.map_err(Error::db("reap_expired"))?;
    if !failed.is_empty() {
        store.wake.notify();
    }
    Ok(ReapReport {
        requeued: requeued.len() as u64,
        failed: failed.len() as u64,
        failed_ids: failed,
    })
}

pub(super) async fn prune(store: &SqliteStore, c: &PruneCutoffs) -> Result<u64> {
    let mut tx = store.begin_write("prune").await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM dockhand_actions
         WHERE (status IN ('complete', 'canceled') AND finished_at < ?)
            OR (status = 'failed' AND finished_at < ?)
         LIMIT ?",
    )
    .bind(ms(c.finished_before))
    .bind(ms(c.failed_before))
    .bind(c.batch)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("prune"))?;
    if ids.is_empty() {
        tx.rollback().await.map_err(Error::db("prune"))?;
        return Ok(0);
    }
    let ids_json = serde_json::to_string(&ids).map_err(|e| Error::invalid("ids", e.to_string()))?;
    sqlx::query(
        "DELETE FROM dockhand_action_logs WHERE action_id IN (SELECT value FROM json_each(?))",
    )
    .bind(&ids_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("prune (logs)"))?;
    let done = sqlx::query(
        "DELETE FROM dockhand_actions WHERE id IN (SELECT value FROM json_each(?))
           AND status IN ('complete', 'canceled', 'failed')",
    )
    .bind(&ids_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("prune"))?;
    tx.commit().await.map_err(Error::db("prune"))?;
    Ok(done.rows_affected())
}

pub(super) async fn try_lease(
    store: &SqliteStore,
    task: &str,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut tx = store.begin_write("maintenance lease").await?;
    let got: Option<String> = sqlx::query_scalar(
        "INSERT INTO dockhand_maintenance_leases (task, owner, until) VALUES (?, ?, ?)
         ON CONFLICT (task) DO UPDATE SET owner = excluded.owner, until = excluded.until
         WHERE dockhand_maintenance_leases.until <= ? OR dockhand_maintenance_leases.owner = excluded.owner
         RETURNING task",
    )
    .bind(task)
    .bind(owner)
    .bind(ms(until))
    .bind(ms(now))
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("maintenance lease"))?;
    tx.commit().await.map_err(Error::db("maintenance lease"))?;
    Ok(got.is_some())
}

pub(super) async fn lease_held(
    store: &SqliteStore,
    task: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM dockhand_maintenance_leases WHERE task = ? AND until > ?",
    )
    .bind(task)
    .bind(ms(now))
    .fetch_optional(&store.reader)
    .await
    .map_err(Error::db("maintenance lease held"))?;
    Ok(held.is_some())
}
