//! MySQL: keeping item claims true to their owners while work goes on — renewing the claims of
//! live jobs ([`crate::Store::renew_claims`]) and releasing the claims superseded step runs took
//! ([`crate::Store::release_superseded_claims`]) — and the step-run fence a claim takes.

use super::claim::push_in;
use super::connect::retry_deadlocks;
use super::lease_fence::run_fence;
use super::{ms, MySqlStore};
use crate::claims::ClaimRun;
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// The due claims of live jobs, soonest expiry first (over the `(status, expires_at)` index).
/// A plain (non-locking) read: a locking read over the join would lock the job rows too.
const DUE: &str = "SELECT d.id FROM dockhand_item_claims d
    JOIN dockhand_jobs j ON j.id = d.job_id
    WHERE d.status = 'claimed' AND d.ttl_ms IS NOT NULL
      AND d.expires_at <= ? + d.ttl_ms DIV 2
      AND j.status IN ('pending', 'processing', 'waiting')
    ORDER BY d.expires_at
    LIMIT ?";

pub(super) async fn renew_claims(
    store: &MySqlStore,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let op = "renew_claims";
    let ids: Vec<i64> = sqlx::query_scalar(DUE)
        .bind(ms(now))
        .bind(limit.max(1))
        .fetch_all(store.pool())
        .await
        .map_err(Error::db(op))?;
    if ids.is_empty() {
        return Ok(0);
    }
    let ids = &ids;
    retry_deadlocks(op, move || async move {
        // The row lock re-checks `claimed`: a claim completed or released since the read is
        // left alone (its job's bridge settled it).
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("UPDATE dockhand_item_claims SET expires_at = ");
        qb.push_bind(ms(now))
            .push(" + ttl_ms WHERE status = 'claimed' AND ttl_ms IS NOT NULL AND id");
        push_in(&mut qb, ids);
        let done = qb
            .build()
            .execute(store.pool())
            .await
            .map_err(Error::db(op))?;
        Ok(done.rows_affected())
    })
    .await
}

/// The claims of job `?` that another run of step `?` took and that are still claimed.
const SUPERSEDED: &str = "SELECT id, token FROM dockhand_item_claims
    WHERE job_id = ? AND status = 'claimed' AND run_step = ?
      AND (run_action <> ? OR run_token <> ?)
    ORDER BY id";

pub(super) async fn release_superseded_claims(
    store: &MySqlStore,
    job_id: i64,
    run: ClaimRun,
    keep_tokens: &[String],
) -> Result<u64> {
    let op = "release_superseded_claims";
    // The common case releases nothing: one read checks the lease and finds no candidate.
    let row = sqlx::query(&format!(
        "SELECT EXISTS (SELECT 1 FROM dockhand_actions
                        WHERE id = ? AND status = 'running' AND lease_token = ?) AS live,
                EXISTS ({SUPERSEDED}) AS any_superseded"
    ))
    .bind(run.lease.id)
    .bind(run.lease.token)
    .bind(job_id)
    .bind(run.step)
    .bind(run.lease.id)
    .bind(run.lease.token)
    .fetch_one(store.pool())
    .await
    .map_err(Error::db(op))?;
    let flag =
        |c: &str| -> Result<bool> { Ok(row.try_get::<i64, _>(c).map_err(Error::db(op))? != 0) };
    if !flag("live")? {
        return Err(run.lease.lost());
    }
    if !flag("any_superseded")? {
        return Ok(0);
    }
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        if let Err(lost) = run_fence(&mut tx, run.lease, op).await {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(lost);
        }
        let released = release_in_tx(&mut tx, job_id, run, keep_tokens, op).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(released)
    })
    .await
}

/// Releases, on the open transaction, the claims of `job_id` that another run of `run.step`
/// took and that `keep_tokens` does not hold (locked first); the caller fenced the run's
/// lease. How many were released.
pub(super) async fn release_in_tx(
    tx: &mut MySqlConnection,
    job_id: i64,
    run: ClaimRun,
    keep_tokens: &[String],
    op: &'static str,
) -> Result<u64> {
    let rows = sqlx::query(&format!("{SUPERSEDED} FOR UPDATE"))
        .bind(job_id)
        .bind(run.step)
        .bind(run.lease.id)
        .bind(run.lease.token)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in &rows {
        let token = super::opt_text(row, "token").map_err(Error::db(op))?;
        if !token.is_some_and(|t| keep_tokens.contains(&t)) {
            ids.push(row.try_get::<i64, _>("id").map_err(Error::db(op))?);
        }
    }
    let mut released = 0;
    for chunk in ids.chunks(500) {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("DELETE FROM dockhand_item_claims WHERE id");
        push_in(&mut qb, chunk);
        released += qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?
            .rows_affected();
    }
    Ok(released)
}
