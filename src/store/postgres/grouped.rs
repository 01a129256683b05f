//! PostgreSQL: grouped step starts and bridge finishes ([`crate::Store::start_steps`],
//! [`crate::Store::finish_jobs`]): several jobs' transitions in one transaction, so c
//! concurrently running children of one parent cost one transaction (and one wait on the
//! parent's row lock) where they cost c. The group's job rows are locked first, in id order,
//! so concurrent groups cannot deadlock on each other; a start group then reads and writes
//! in one statement each, deciding per job as the single path does ([`step_gate`]), a finish is written set-based
//! ([`super::finish_set::finish_set`]), and a group's parents get their counters bumped once
//! each, in id order, with the summed deltas ([`super::bridge::count_children`]). A deadlock
//! re-runs the whole group.

use super::bridge::count_children;
use super::finish_set::finish_set;
use super::jobs::{job_from_row, COLUMNS};
use super::{ts, PgStore};
use crate::claims::CompletionRegistry;
use crate::error::{Error, Result};
use crate::jobs::{FinishRequest, GroupFinished, Job, StepStart};
use crate::state::{JobStatus, ParentView};
use crate::store::finish_group::{
    all_moved, check_final, in_request_order, job_order, RollBack, SetFinished,
};
use crate::store::rerun::rerun_transaction;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use std::collections::HashMap;

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

/// See [`crate::Store::start_steps`]: the group's job rows locked in id order, then read with
/// their parents (share-locked, in id order) in two statements, the single path's decision
/// ([`step_gate`]) per request in job order, and the starts written in one statement (a job
/// that appears twice is seen started by its second request, as the single path would see it).
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
        let ids: Vec<i64> = reqs.iter().map(|r| r.0).collect();
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS}, batch_state IS NOT NULL AS fanned_out
             FROM dockhand_jobs WHERE id = ANY($1)"
        ))
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        let mut jobs: HashMap<i64, (Job, bool)> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let job = job_from_row(row)?;
            let fanned_out: bool = row.try_get("fanned_out").map_err(Error::db(op))?;
            jobs.insert(job.id, (job, fanned_out));
        }
        // The parents in key share mode: an operator's stop (which locks a parent for update)
        // and these starts are ordered, so a child either started before the stop committed or
        // sees it; the counter updates of the parents' finishing children do not wait for it.
        let mut parent_ids: Vec<i64> = jobs.values().filter_map(|(j, _)| j.parent_id).collect();
        parent_ids.sort_unstable();
        parent_ids.dedup();
        let mut parents: HashMap<i64, (JobStatus, Option<String>)> = HashMap::new();
        if !parent_ids.is_empty() {
            let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
                "SELECT id, status, batch_outcome FROM dockhand_jobs
                 WHERE id = ANY($1) ORDER BY id FOR KEY SHARE",
            )
            .bind(&parent_ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(op))?;
            for (id, status, outcome) in rows {
                parents.insert(id, (super::batch::parse_status(id, &status)?, outcome));
            }
        }
        let mut out: Vec<Option<StepStart>> = vec![None; reqs.len()];
        let mut starts: Vec<i64> = Vec::new();
        for i in job_order(reqs.iter().map(|r| r.0)) {
            let (job_id, step) = reqs[i];
            let Some((job, fanned_out)) = jobs.get_mut(&job_id) else {
                out[i] = Some(StepStart::Stale);
                continue;
            };
            let view = job
                .parent_id
                .and_then(|p| parents.get(&p))
                .map(|(status, outcome)| ParentView {
                    status: *status,
                    outcome: outcome.as_deref(),
                });
            let (start, moves) = StepStart::decide(job, step, *fanned_out, view, now);
            if moves {
                // A second request for the job sees it started, as the single path would.
                if let StepStart::Run(started) = &start {
                    *job = started.clone();
                }
                starts.push(job_id);
            }
            out[i] = Some(start);
        }
        start_pending(&mut tx, &starts, now, op).await?;
        tx.commit().await.map_err(Error::db(op))?;
        in_request_order(out)
    })
    .await
}

/// Starts the pending jobs `ids` (`pending` → `processing`), whose rows the transaction
/// locked or inserted: all of them, or the error (see [`all_moved`]). Grouped step starts
/// and `create_children`'s leased children both start this way.
pub(super) async fn start_pending(
    conn: &mut PgConnection,
    ids: &[i64],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET status = 'processing', updated_at = $2
         WHERE id = ANY($1) AND status = 'pending'",
    )
    .bind(ids)
    .bind(ts(now))
    .execute(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    all_moved(op, done.rows_affected(), ids.len())
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
