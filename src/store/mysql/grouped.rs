//! MySQL: grouped step starts and bridge finishes ([`crate::Store::start_steps`],
//! [`crate::Store::finish_jobs`]): several jobs' transitions in one transaction, so c
//! concurrently running children of one parent cost one transaction (and one wait on the
//! parent's row lock) where they cost c. The group's job rows are locked first, in id order,
//! so concurrent groups cannot deadlock on each other; each job's part is then the single
//! path's own code ([`super::jobs::start_in_tx`], [`super::bridge::finish_in_tx`]), and a
//! group's parents get their counters bumped once each, in id order, with the summed deltas
//! ([`super::fence::child_finished`]). A deadlock re-runs the whole group
//! ([`retry_deadlocks`]).

use super::bridge::finish_in_tx;
use super::claim_upkeep::release_in_tx;
use super::connect::retry_deadlocks;
use super::fence::child_finished;
use super::finish::finish_on;
use super::jobs::start_in_tx;
use super::MySqlStore;
use crate::claims::ClaimRun;
use crate::claims::CompletionRegistry;
use crate::error::{Error, Result};
use crate::jobs::{FinishRequest, GroupFinished, StepStart};
use crate::store::finish_group::{
    check_final, in_request_order, job_order, GroupOutcomes, RollBack,
};
use crate::store::{Finish, FinishResult, Lease};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder};

/// Locks the rows of `ids` (jobs) in id order.
async fn lock_jobs(
    conn: &mut MySqlConnection,
    ids: impl Iterator<Item = i64>,
    op: &'static str,
) -> Result<()> {
    let mut ids: Vec<i64> = ids.collect();
    ids.sort_unstable();
    ids.dedup();
    let mut qb = QueryBuilder::<MySql>::new("SELECT id FROM dockhand_jobs WHERE id IN (");
    let mut list = qb.separated(", ");
    for id in &ids {
        list.push_bind(*id);
    }
    qb.push(") ORDER BY id FOR UPDATE");
    qb.build()
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    Ok(())
}

/// See [`crate::Store::start_steps`].
pub(super) async fn start_steps(
    store: &MySqlStore,
    reqs: &[(i64, i32)],
    now: DateTime<Utc>,
) -> Result<Vec<StepStart>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    retry_deadlocks("start_steps", || async {
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
async fn lease_live(conn: &mut MySqlConnection, lease: Lease) -> Result<bool> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT CAST(1 AS SIGNED) FROM dockhand_actions
         WHERE id = ? AND status = 'running' AND lease_token = ? LOCK IN SHARE MODE",
    )
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db("finish_jobs (lease)"))?;
    Ok(row.is_some())
}

/// Whether a request's step run still holds `lease`, on the open transaction; with
/// `complete` (the request's [`FinishRequest::complete_run`]) the action is completed under it
/// there and then, owner-guarded as the runner's acknowledgement would be
/// ([`super::finish::finish_on`]; a lost lease leaves its `lease_lost` log row).
async fn run_holds(
    conn: &mut MySqlConnection,
    lease: Lease,
    complete: bool,
    now: DateTime<Utc>,
) -> Result<bool> {
    if complete {
        let done = finish_on(&mut *conn, lease, &Finish::Complete, now).await?;
        return Ok(matches!(done, FinishResult::Applied));
    }
    lease_live(conn, lease).await
}

/// See [`crate::Store::finish_jobs`].
pub(super) async fn finish_jobs(
    store: &MySqlStore,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<GroupFinished> {
    check_final(reqs)?;
    if reqs.is_empty() {
        return Ok(GroupFinished::Committed(Vec::new()));
    }
    let (finished, due) =
        retry_deadlocks("finish_jobs", || finish_once(store, reqs, completions, now)).await?;
    if due {
        store.wake.notify();
    }
    Ok(finished)
}

/// One attempt of [`finish_jobs`]; the flag says a due finalize action was enqueued.
async fn finish_once(
    store: &MySqlStore,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<(GroupFinished, bool)> {
    let op = "finish_jobs";
    let mut tx = store.begin(op).await?;
    lock_jobs(&mut tx, reqs.iter().map(|r| r.job_id), op).await?;
    let mut group = GroupOutcomes::new(reqs.len());
    for i in job_order(reqs.iter().map(|r| r.job_id)) {
        let r = &reqs[i];
        if let Some(lease) = r.lease {
            if !run_holds(&mut tx, lease, r.complete_run, now).await? {
                group.lease_lost(i, lease);
                continue;
            }
            if let Some(s) = &r.superseded {
                let run = ClaimRun {
                    step: s.step,
                    lease,
                };
                release_in_tx(&mut tx, r.job_id, run, &s.keep, op).await?;
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
        if let Some(RollBack { job_id, error }) = group.record(i, r, done)? {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok((GroupFinished::RolledBack { job_id, error }, false));
        }
    }
    let mut due = false;
    for (parent, deltas) in group.parents() {
        due |= child_finished(&mut tx, parent, deltas, now).await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    Ok((GroupFinished::Committed(group.into_results()?), due))
}
