//! PostgreSQL: keeping item claims true to their owners while work goes on — renewing the
//! claims of live jobs ([`crate::Store::renew_claims`]) and releasing the claims superseded
//! step runs took ([`crate::Store::release_superseded_claims`]).

use super::lease_fence::run_fence;
use super::{ts, PgStore};
use crate::claims::ClaimRun;
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

/// One bounded batch: the due claims of live jobs, soonest expiry first (over the partial
/// index on `expires_at`), locked `SKIP LOCKED` so a claim being completed or taken over is
/// left for the next pass; the job rows are only read.
const RENEW: &str = "UPDATE dockhand_item_claims c
    SET expires_at = $1 + c.ttl_ms * INTERVAL '1 millisecond'
    FROM (SELECT d.id FROM dockhand_item_claims d
          JOIN dockhand_jobs j ON j.id = d.job_id
          WHERE d.status = 'claimed' AND d.ttl_ms IS NOT NULL
            AND d.expires_at <= $1 + (d.ttl_ms / 2) * INTERVAL '1 millisecond'
            AND j.status IN ('pending', 'processing', 'waiting')
          ORDER BY d.expires_at
          LIMIT $2
          FOR UPDATE OF d SKIP LOCKED) due
    WHERE c.id = due.id AND c.status = 'claimed'";

pub(super) async fn renew_claims(store: &PgStore, now: DateTime<Utc>, limit: i64) -> Result<u64> {
    let done = sqlx::query(RENEW)
        .bind(ts(now))
        .bind(limit.max(1))
        .execute(&store.pool)
        .await
        .map_err(Error::db("renew_claims"))?;
    Ok(done.rows_affected())
}

/// The claims of `job_id` that another run of step `run.step` took and that are still
/// claimed (`FOR UPDATE` when `lock`).
fn superseded_sql(lock: bool) -> String {
    format!(
        "SELECT id, token FROM dockhand_item_claims
         WHERE job_id = $1 AND status = 'claimed' AND run_step = $2
           AND (run_action <> $3 OR run_token <> $4)
         ORDER BY id{}",
        if lock { " FOR UPDATE" } else { "" }
    )
}

pub(super) async fn release_superseded_claims(
    store: &PgStore,
    job_id: i64,
    run: ClaimRun,
    keep_tokens: &[String],
) -> Result<u64> {
    let op = "release_superseded_claims";
    // The common case releases nothing: one read checks the lease and finds no candidate.
    let row = sqlx::query(&format!(
        "SELECT EXISTS (SELECT 1 FROM dockhand_actions
                        WHERE id = $3 AND status = 'running' AND lease_token = $4) AS live,
                EXISTS ({}) AS any",
        superseded_sql(false)
    ))
    .bind(job_id)
    .bind(run.step)
    .bind(run.lease.id)
    .bind(run.lease.token)
    .fetch_one(&store.pool)
    .await
    .map_err(Error::db(op))?;
    if !row.try_get::<bool, _>("live").map_err(Error::db(op))? {
        return Err(run.lease.lost());
    }
    if !row.try_get::<bool, _>("any").map_err(Error::db(op))? {
        return Ok(0);
    }
    let mut tx = store.begin(op).await?;
    run_fence(&mut tx, run.lease, op).await?;
    let released = release_in_tx(&mut tx, job_id, run, keep_tokens, op).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(released)
}

/// Releases, on the open transaction, the claims of `job_id` that another run of `run.step`
/// took and that `keep_tokens` does not hold (locked first); the caller fenced the run's
/// lease. How many were released.
pub(super) async fn release_in_tx(
    tx: &mut PgConnection,
    job_id: i64,
    run: ClaimRun,
    keep_tokens: &[String],
    op: &'static str,
) -> Result<u64> {
    let rows = sqlx::query(&superseded_sql(true))
        .bind(job_id)
        .bind(run.step)
        .bind(run.lease.id)
        .bind(run.lease.token)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in &rows {
        let token: Option<String> = row.try_get("token").map_err(Error::db(op))?;
        if !token.is_some_and(|t| keep_tokens.contains(&t)) {
            ids.push(row.try_get::<i64, _>("id").map_err(Error::db(op))?);
        }
    }
    let done = sqlx::query("DELETE FROM dockhand_item_claims WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    Ok(done.rows_affected())
}
