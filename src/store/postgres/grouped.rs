//! PostgreSQL: grouped step starts and bridge finishes ([`crate::Store::start_steps`],
//! [`crate::Store::finish_jobs`]): several jobs' transitions in one transaction, so c
//! concurrently running children of one parent cost one transaction (and one wait on the
//! parent's row lock) where they cost c. The group's job rows are locked first, in id order,
//! so concurrent groups cannot deadlock on each other; a start is then the single path's own
//! code per job ([`super::jobs::start_in_tx`]), a finish is written set-based
//! ([`super::finish_set::finish_set`]), and a group's parents get their counters bumped once
//! each, in id order, with the summed deltas ([`super::bridge::count_children`]). A deadlock
//! re-runs the whole group.

use super::bridge::count_children;
use super::finish_set::finish_set;
use super::jobs::start_in_tx;
use super::PgStore;
use crate::claims::CompletionRegistry;
use crate::error::{Error, Result};
use crate::jobs::{FinishRequest, GroupFinished, StepStart};
use crate::store::finish_group::{check_final, in_request_order, job_order, RollBack, SetFinished};
use crate::store::rerun::rerun_transaction;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Locks the rows of `ids` (jobs) in id order.
async fn lock_jobs(
    conn: &mut PgConnection,
    ids: impl Iterator<Item = i64>,
    op: &'static str,
) -> Result<()> {
    let mut ids: Vec<i64> = ids.collect();
    ids.sort_unstable();
    ids.dedup();
    sqlx::query("SELECT id FROM dockhand_jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    Ok(())
}

/// See [`crate::Store::start_steps`].
pub(super) async fn start_steps(
    store: &PgStore,
    reqs: &[(i64, i32)],
    now: DateTime<Utc>,
) -> Result<Vec<StepStart>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    rerun_transaction("postgres", "start_steps", || async {
        let op = "start_steps";
        let mut tx = store.begin(op).await?;
        lock_jobs(&mut tx, reqs.iter().map(|r| r.0), op).await?;
        let mut out = vec![None; reqs.len()];
        for i in job_order(reqs.iter().map(|r| r.0)) {
            let (job, step) = reqs[i];
            out[i] = Some(start_in_tx(&mut tx, job, step, now).await?);
        }
        tx.commit().await.map_err(Error::db(op))?;
        in_request_order(out)
    })
    .await
}

/// Whether `lease` is still a running action's, on the open transaction (its row share-locked
/// until commit, so the reaper cannot take it meanwhile).
pub(super) async fn lease_live(conn: &mut PgConnection, lease: Lease) -> Result<bool> {
    let row: Option<(i32,)> = sqlx::query_as(
        "SELECT 1 FROM dockhand_actions
         WHERE id = $1 AND status = 'running' AND lease_token = $2 FOR SHARE",
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
    store: &PgStore,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<GroupFinished> {
    check_final(reqs)?;
    if reqs.is_empty() {
        return Ok(GroupFinished::Committed(Vec::new()));
    }
    let (finished, due) = rerun_transaction("postgres", "finish_jobs", || {
        finish_once(store, reqs, completions, now)
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(finished)
}

/// One attempt of [`finish_jobs`]; the flag says a due finalize action was enqueued.
async fn finish_once(
    store: &PgStore,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<(GroupFinished, bool)> {
    let op = "finish_jobs";
    let mut tx = store.begin(op).await?;
    lock_jobs(&mut tx, reqs.iter().map(|r| r.job_id), op).await?;
    let group = match finish_set(&mut tx, reqs, completions, now).await? {
        SetFinished::Written(group) => group,
        SetFinished::RollBack(RollBack { job_id, error }) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok((GroupFinished::RolledBack { job_id, error }, false));
        }
    };
    let mut due = false;
    for (parent, deltas) in group.parents() {
        due |= count_children(&mut tx, store, parent, deltas, now).await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    Ok((GroupFinished::Committed(group.into_results()?), due))
}
