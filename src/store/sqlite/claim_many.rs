//! SQLite: many item claims in one transaction ([`crate::Store::claim_items`]). One
//! `BEGIN IMMEDIATE` on the held writer fences each distinct step run and reads each distinct
//! job once, then runs the claim upsert of [`super::claims`] per request (a prepared statement
//! on the one write connection: in-process, so a statement per row costs microseconds and
//! the transaction's single commit is what pays). Requests run in order, so a repeated identity
//! sees the claim an earlier request took.

use super::claim_upkeep::run_fence;
use super::claims::{claim_on, job_state};
use super::SqliteStore;
use crate::claims::{ClaimItemRequest, ClaimOutcome};
use crate::error::{Error, Result};
use crate::store::claim_rules::{distinct_jobs, distinct_runs, expiries, refused};
use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use std::collections::HashMap;

pub(super) async fn claim_items(
    store: &SqliteStore,
    reqs: &[ClaimItemRequest],
    now: DateTime<Utc>,
) -> Result<Vec<ClaimOutcome>> {
    let op = "claim_items";
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let expires = expiries(reqs, now)?;
    let mut tx = store.begin_write(op).await?;
    match claim_in_tx(&mut tx, reqs, &expires, now).await {
        Ok(out) => {
            if out.iter().any(|o| matches!(o, ClaimOutcome::Claimed(_))) {
                tx.commit().await.map_err(Error::db(op))?;
            } else {
                tx.rollback().await.map_err(Error::db(op))?;
            }
            Ok(out)
        }
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            Err(e)
        }
    }
}

/// The fences, the jobs, then each request's claim, on the open transaction.
async fn claim_in_tx(
    conn: &mut SqliteConnection,
    reqs: &[ClaimItemRequest],
    expires: &[DateTime<Utc>],
    now: DateTime<Utc>,
) -> Result<Vec<ClaimOutcome>> {
    let op = "claim_items";
    for lease in distinct_runs(reqs) {
        run_fence(&mut *conn, lease, op).await?;
    }
    let mut jobs = HashMap::new();
    for job_id in distinct_jobs(reqs) {
        if let Some(state) = job_state(&mut *conn, job_id).await? {
            jobs.insert(job_id, state);
        }
    }
    let mut out = Vec::with_capacity(reqs.len());
    for (req, &expires) in reqs.iter().zip(expires) {
        match refused(req, &jobs) {
            Some(refusal) => out.push(refusal),
            None => out.push(claim_on(&mut *conn, req, expires, now, op).await?),
        }
    }
    Ok(out)
}
