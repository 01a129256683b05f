//! SQLite: keeping item claims true to their owners while work goes on — renewing the claims
//! of live jobs ([`crate::Store::renew_claims`]) and releasing the claims superseded step runs
//! took ([`crate::Store::release_superseded_claims`]) — and the step-run fence a claim takes.

use super::lease_fence::run_fence;
use super::{ms, SqliteStore};
use crate::claims::ClaimRun;
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite};

/// One bounded batch: the due claims of live jobs, soonest expiry first (over the partial
/// index on `expires_at`), under the single writer.
const RENEW: &str = "UPDATE dockhand_item_claims SET expires_at = ?1 + ttl_ms
    WHERE id IN (
        SELECT d.id FROM dockhand_item_claims d
        JOIN dockhand_jobs j ON j.id = d.job_id
        WHERE d.status = 'claimed' AND d.ttl_ms IS NOT NULL
          AND d.expires_at <= ?1 + d.ttl_ms / 2
          AND j.status IN ('pending', 'processing', 'waiting')
        ORDER BY d.expires_at
        LIMIT ?2)";

pub(super) async fn renew_claims(
    store: &SqliteStore,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let mut tx = store.begin_write("renew_claims").await?;
    let done = sqlx::query(RENEW)
        .bind(ms(now))
        .bind(limit.max(1))
        .execute(&mut *tx)
        .await
        .map_err(Error::db("renew_claims"))?;
    tx.commit().await.map_err(Error::db("renew_claims"))?;
    Ok(done.rows_affected())
}

/// The claims of job `?1` that another run of step `?2` took and that are still claimed.
const SUPERSEDED: &str = "SELECT id, token FROM dockhand_item_claims
    WHERE job_id = ?1 AND status = 'claimed' AND run_step = ?2
      AND (run_action <> ?3 OR run_token <> ?4)
    ORDER BY id";

pub(super) async fn release_superseded_claims(
    store: &SqliteStore,
    job_id: i64,
    run: ClaimRun,
    keep_tokens: &[String],
) -> Result<u64> {
    let op = "release_superseded_claims";
    // The common case releases nothing: one read (no writer) checks the lease and finds no
    // candidate.
    let (live, any): (bool, bool) = sqlx::query_as(&format!(
        "SELECT EXISTS (SELECT 1 FROM dockhand_actions
                        WHERE id = ?3 AND status = 'running' AND lease_token = ?4),
                EXISTS ({SUPERSEDED})"
    ))
    .bind(job_id)
    .bind(run.step)
    .bind(run.lease.id)
    .bind(run.lease.token)
    .fetch_one(&store.reader)
    .await
    .map_err(Error::db(op))?;
    if !live {
        return Err(run.lease.lost());
    }
    if !any {
        return Ok(0);
    }
    let mut tx = store.begin_write(op).await?;
    if let Err(lost) = run_fence(&mut tx, run.lease, op).await {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(lost);
    }
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(SUPERSEDED)
        .bind(job_id)
        .bind(run.step)
        .bind(run.lease.id)
        .bind(run.lease.token)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let ids: Vec<i64> = rows
        .into_iter()
        .filter(|(_, token)| !token.as_ref().is_some_and(|t| keep_tokens.contains(t)))
        .map(|(id, _)| id)
        .collect();
    let mut released = 0;
    // Chunks well under SQLite's bound-parameter limit.
    for chunk in ids.chunks(500) {
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new("DELETE FROM dockhand_item_claims WHERE id IN (");
        let mut list = qb.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        qb.push(")");
        released += qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?
            .rows_affected();
    }
    tx.commit().await.map_err(Error::db(op))?;
    Ok(released)
}
