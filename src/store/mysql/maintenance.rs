//! MySQL: lease reaper, retention and the maintenance-task leases.
//!
//! The reaper and retention pick their batch with `LIMIT … FOR UPDATE SKIP LOCKED` and then
//! write it by id in the same transaction, so several processes running them at once take
//! disjoint rows without waiting.

use super::claim::{push_in, push_list};
use super::finish::enqueue_followups;
use super::{ms, retry_deadlocks, text, MySqlStore};
use crate::error::{Error, Result};
use crate::store::{PruneCutoffs, ReapReport};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// MySQL's duplicate-key error number.
const ER_DUP_ENTRY: u16 = 1062;

pub(super) async fn reap_expired(
    store: &MySqlStore,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<ReapReport> {
    let limit = limit.max(0);
    let report = retry_deadlocks("reap_expired", || async move {
        let mut tx = store.begin("reap_expired").await?;
        // Out of attempts: failed (unique key freed). Otherwise: pending again (the attempt
        // stays counted).
        let failed = reap(
            &mut tx,
            now,
            limit,
            "attempt >= max_attempts",
            "status = 'failed', finished_at = ?, active_key = NULL",
            "lease_expired_failed",
        )
        .await?;
        // A failed step action leaves its job's finish action (jobs::finish).
        enqueue_followups(&mut tx, &failed, now).await?;
        let requeued = reap(
            &mut tx,
            now,
            limit,
            "attempt < max_attempts",
            "status = 'pending', scheduled_at = ?",
            "lease_expired",
        )
        .await?;
        tx.commit().await.map_err(Error::db("reap_expired"))?;
        Ok(ReapReport {
            requeued: requeued.len() as u64,
            failed: failed.len() as u64,
            failed_ids: failed,
        })
    })
    .await?;
    if report.failed > 0 {
        store.wake.notify();
    }
    Ok(report)
}

/// Picks up to `limit` expired running actions matching `cond`, applies `set` (whose one `?`
/// is `now`) plus the lease-expired error, and logs `event` for each; returns their ids.
async fn reap(
    tx: &mut MySqlConnection,
    now: DateTime<Utc>,
    limit: i64,
    cond: &str,
    set: &str,
    event: &str,
) -> Result<Vec<i64>> {
    let ids: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT id FROM dockhand_actions
         WHERE status = 'running' AND lease_until < ? AND {cond}
         LIMIT ? FOR UPDATE SKIP LOCKED"
    ))
    .bind(ms(now))
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("reap_expired"))?;
    if ids.is_empty() {
        return Ok(ids);
    }
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new("UPDATE dockhand_actions SET ");
    let (head, tail) = set.split_once('?').unwrap_or((set, ""));
    qb.push(head).push_bind(ms(now)).push(tail).push(
        ", last_error = CONCAT('lease expired (owner ', COALESCE(lease_owner, '?'), ')'),
         lease_owner = NULL, lease_until = NULL
         WHERE status = 'running' AND id IN (",
    );
    push_list(&mut qb, &ids);
    qb.push(")");
    qb.build()
        .execute(&mut *tx)
        .await
        .map_err(Error::db("reap_expired"))?;
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("INSERT INTO dockhand_action_logs (action_id, at, event) ");
    qb.push_values(&ids, |mut b, id| {
        b.push_bind(*id).push_bind(ms(now)).push_bind(event);
    });
    qb.build()
        .execute(&mut *tx)
        .await
        .map_err(Error::db("reap_expired (log)"))?;
    Ok(ids)
}

pub(super) async fn prune(store: &MySqlStore, c: &PruneCutoffs) -> Result<u64> {
    retry_deadlocks("prune", || async move {
        let mut tx = store.begin("prune").await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM dockhand_actions
             WHERE (status IN ('complete', 'canceled') AND finished_at < ?)
                OR (status = 'failed' AND finished_at < ?)
             LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(ms(c.finished_before))
        .bind(ms(c.failed_before))
        .bind(c.batch.max(0))
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("prune"))?;
        if ids.is_empty() {
            tx.rollback().await.map_err(Error::db("prune"))?;
            return Ok(0);
        }
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("DELETE FROM dockhand_action_logs WHERE action_id");
        push_in(&mut qb, &ids);
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("prune (logs)"))?;
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("DELETE FROM dockhand_actions WHERE id");
        push_in(&mut qb, &ids);
        qb.push(" AND status IN ('complete', 'canceled', 'failed')");
        let done = qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("prune"))?;
        tx.commit().await.map_err(Error::db("prune"))?;
        Ok(done.rows_affected())
    })
    .await
}

pub(super) async fn try_lease(
    store: &MySqlStore,
    task: &str,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool> {
    retry_deadlocks("maintenance lease", || async move {
        let mut tx = store.begin("maintenance lease").await?;
        let row = sqlx::query(
            "SELECT owner, until FROM dockhand_maintenance_leases WHERE task = ? FOR UPDATE",
        )
        .bind(task.as_bytes())
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("maintenance lease"))?;
        let got = match row {
            None => {
                let inserted = sqlx::query(
                    "INSERT INTO dockhand_maintenance_leases (task, owner, until) VALUES (?, ?, ?)",
                )
                .bind(task.as_bytes())
                .bind(owner)
                .bind(ms(until))
                .execute(&mut *tx)
                .await;
                match inserted {
                    Ok(_) => true,
                    // Another owner took the free task first.
                    Err(sqlx::Error::Database(db))
                        if db
                            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                            .is_some_and(|m| m.number() == ER_DUP_ENTRY) =>
                    {
                        false
                    }
                    Err(e) => return Err(Error::db("maintenance lease")(e)),
                }
            }
            Some(row) => {
                let holder = text(&row, "owner").map_err(Error::db("maintenance lease"))?;
                let held_until: i64 = row
                    .try_get("until")
                    .map_err(Error::db("maintenance lease"))?;
                if held_until <= ms(now) || holder == owner {
                    sqlx::query(
                        "UPDATE dockhand_maintenance_leases SET owner = ?, until = ?
                         WHERE task = ?",
                    )
                    .bind(owner)
                    .bind(ms(until))
                    .bind(task.as_bytes())
                    .execute(&mut *tx)
                    .await
                    .map_err(Error::db("maintenance lease"))?;
                    true
                } else {
                    false
                }
            }
        };
        tx.commit().await.map_err(Error::db("maintenance lease"))?;
        Ok(got)
    })
    .await
}

pub(super) async fn lease_held(store: &MySqlStore, task: &str, now: DateTime<Utc>) -> Result<bool> {
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM dockhand_maintenance_leases WHERE task = ? AND until > ?",
    )
    .bind(task.as_bytes())
    .bind(ms(now))
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("maintenance lease held"))?;
    Ok(held.is_some())
}
