//! SQLite: grouped step starts and bridge finishes ([`crate::Store::start_steps`],
//! [`crate::Store::finish_jobs`]): several jobs' transitions in one `BEGIN IMMEDIATE`
//! transaction on the held writer, so c concurrently running children cost one write
//! transaction where they cost c. Each job's part is the single path's own code
//! ([`super::jobs::start_in_tx`], [`super::bridge::finish_in_tx`]); a group's parents get their
//! counters bumped once each, with the summed deltas ([`super::fence::child_finished`]).

use super::bridge::{finish_in_tx, InTx};
use super::fence::child_finished;
use super::jobs::start_in_tx;
use super::SqliteStore;
use crate::claims::CompletionRegistry;
use crate::error::{Error, Result};
use crate::jobs::{BridgeOutcome, FinishRequest, GroupFinished, StepStart};
use crate::store::finish_group::{check_final, in_request_order, job_order, ParentTally};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

/// See [`crate::Store::start_steps`].
pub(super) async fn start_steps(
    store: &SqliteStore,
    reqs: &[(i64, i32)],
    now: DateTime<Utc>,
) -> Result<Vec<StepStart>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let op = "start_steps";
    let mut tx = store.begin_write(op).await?;
    let mut out = vec![None; reqs.len()];
    for i in job_order(reqs.iter().map(|r| r.0)) {
        let (job, step) = reqs[i];
        out[i] = Some(start_in_tx(&mut tx, job, step, now).await?);
    }
    tx.commit().await.map_err(Error::db(op))?;
    in_request_order(out)
}

/// Whether `lease` is still a running action's, on the open transaction.
pub(super) async fn lease_live(conn: &mut SqliteConnection, lease: Lease) -> Result<bool> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT 1 FROM dockhand_actions WHERE id = ? AND status = 'running' AND lease_token = ?",
    )
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db("finish_jobs (lease)"))?;
    Ok(row.is_some())
}

/// See [`crate::Store::finish_jobs`].
pub(super) async fn finish_jobs(
    store: &SqliteStore,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<GroupFinished> {
    check_final(reqs)?;
    if reqs.is_empty() {
        return Ok(GroupFinished::Committed(Vec::new()));
    }
    let op = "finish_jobs";
    let mut tx = store.begin_write(op).await?;
    let mut out = vec![None; reqs.len()];
    let mut tally = ParentTally::default();
    for i in job_order(reqs.iter().map(|r| r.job_id)) {
        let r = &reqs[i];
        if let Some(lease) = r.lease {
            if !lease_live(&mut tx, lease).await? {
                out[i] = Some(BridgeOutcome::LeaseLost {
                    action_id: lease.id,
                    token: lease.token,
                });
                continue;
            }
        }
        let done = finish_in_tx(
            &mut tx,
            r.job_id,
            r.status,
            r.reason.as_deref(),
            completions,
            now,
        )
        .await;
        out[i] = Some(match done {
            Ok(InTx::Finished { parent }) => {
                if let Some(parent) = parent {
                    tally.add(parent, r.status);
                }
                BridgeOutcome::Finished
            }
            Ok(InTx::AlreadyFinal { status, reason }) => {
                BridgeOutcome::AlreadyFinal { status, reason }
            }
            Ok(InTx::ClaimCompletionFailed { error }) => {
                tx.rollback().await.map_err(Error::db(op))?;
                return Ok(GroupFinished::RolledBack {
                    job_id: r.job_id,
                    error,
                });
            }
            Err(e @ Error::TransientCompletion { .. }) => {
                tx.rollback().await.map_err(Error::db(op))?;
                return Ok(GroupFinished::RolledBack {
                    job_id: r.job_id,
                    error: e.to_string(),
                });
            }
            Err(e) => return Err(e),
        });
    }
    let mut due = false;
    for (parent, deltas) in tally.parents() {
        due |= child_finished(&mut tx, parent, deltas, now).await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    in_request_order(out).map(GroupFinished::Committed)
}
