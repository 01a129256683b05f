//! MySQL: grouped step starts and bridge finishes ([`crate::Store::start_steps`],
//! [`crate::Store::finish_jobs`]): several jobs' transitions in one transaction, so c
//! concurrently running children of one parent cost one transaction (and one wait on the
//! parent's row lock) where they cost c. The group's job rows are locked first, in id order,
//! so concurrent groups cannot deadlock on each other. Starts are set-based (one read of the
//! jobs, one of their parents, one UPDATE); finishes too ([`super::finish_set`]: about eight
//! statements for the group), and a group's parents get their counters bumped once each, in
//! id order, with the summed deltas ([`super::fence::child_finished`]). A deadlock
//! re-runs the whole group ([`retry_deadlocks`]).

use super::claim::{push_in, push_list};
use super::connect::retry_deadlocks;
use super::fence::child_finished;
use super::finish_set::finish_set;
use super::jobs::{job_from_row, opt_text, text, JOB_COLUMNS};
use super::ms;
use super::MySqlStore;
use crate::claims::CompletionRegistry;
use crate::error::{Error, Result};
use crate::jobs::Job;
use crate::jobs::{FinishRequest, GroupFinished, StepStart};
use crate::state::{JobStatus, ParentView};
use crate::store::finish_group::{all_moved, check_final, RollBack, SetFinished};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use std::collections::HashMap;

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
        let out = starts_in_tx(&mut tx, reqs, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(out)
    })
    .await
}

/// The step boundary of every request on the open transaction, set-based: the jobs' rows
/// locked in id order and read in one statement, their parents' in share mode in another (an
/// operator's stop locks the parent for update, so each child either started before the stop
/// committed or sees it, as [`super::jobs::start_in_tx`] does for one), the gates decided in
/// memory, and the starting jobs moved to processing in one UPDATE. A request repeated in the
/// group gets the same answer as the first (the job is read once).
async fn starts_in_tx(
    tx: &mut MySqlConnection,
    reqs: &[(i64, i32)],
    now: DateTime<Utc>,
) -> Result<Vec<StepStart>> {
    let op = "start_steps";
    let mut ids: Vec<i64> = reqs.iter().map(|r| r.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "SELECT {JOB_COLUMNS}, CAST(batch_state IS NOT NULL AS SIGNED) AS fanned_out
         FROM dockhand_jobs WHERE id IN ("
    ));
    push_list(&mut qb, &ids);
    qb.push(") ORDER BY id FOR UPDATE");
    let rows = qb
        .build()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let mut jobs: HashMap<i64, (Job, bool)> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let job = job_from_row(row)?;
        let fanned_out: i64 = row.try_get("fanned_out").map_err(Error::db(op))?;
        jobs.insert(job.id, (job, fanned_out != 0));
    }
    let mut parent_ids: Vec<i64> = jobs.values().filter_map(|(j, _)| j.parent_id).collect();
    parent_ids.sort_unstable();
    parent_ids.dedup();
    let mut parents: HashMap<i64, (JobStatus, Option<String>)> = HashMap::new();
    if !parent_ids.is_empty() {
        let mut qb = QueryBuilder::<MySql>::new(
            "SELECT id, status, batch_outcome FROM dockhand_jobs WHERE id IN (",
        );
        push_list(&mut qb, &parent_ids);
        qb.push(") ORDER BY id LOCK IN SHARE MODE");
        for row in qb
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(op))?
        {
            let id: i64 = row.try_get("id").map_err(Error::db(op))?;
            let status =
                text(&row, "status")?
                    .parse::<JobStatus>()
                    .map_err(|e| Error::Corrupt {
                        what: "job",
                        id,
                        message: e.to_string(),
                    })?;
            parents.insert(id, (status, opt_text(&row, "batch_outcome")?));
        }
    }
    let mut decided: HashMap<i64, StepStart> = HashMap::with_capacity(jobs.len());
    let mut starting: Vec<i64> = Vec::new();
    let mut out = Vec::with_capacity(reqs.len());
    for &(job_id, step) in reqs {
        if let Some(done) = decided.get(&job_id) {
            out.push(done.clone());
            continue;
        }
        let result = match jobs.get(&job_id) {
            None => StepStart::Stale,
            Some((job, fanned_out)) => {
                let view = job
                    .parent_id
                    .and_then(|p| parents.get(&p))
                    .map(|(status, outcome)| ParentView {
                        status: *status,
                        outcome: outcome.as_deref(),
                    });
                let (start, moves) = StepStart::decide(job, step, *fanned_out, view, now);
                if moves {
                    starting.push(job_id);
                }
                start
            }
        };
        decided.insert(job_id, result.clone());
        out.push(result);
    }
    start_pending(&mut *tx, &starting, now, op).await?;
    Ok(out)
}

/// Starts the pending jobs `ids` (`pending` → `processing`), whose rows the transaction
/// locked or inserted: all of them, or the error (see [`all_moved`]). Grouped step starts
/// and `create_children`'s leased children both start this way.
pub(super) async fn start_pending(
    conn: &mut MySqlConnection,
    ids: &[i64],
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut qb =
        QueryBuilder::<MySql>::new("UPDATE dockhand_jobs SET status = 'processing', updated_at = ");
    qb.push_bind(ms(now));
    qb.push(" WHERE status = 'pending' AND id");
    push_in(&mut qb, ids);
    let done = qb
        .build()
        .execute(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    all_moved(op, done.rows_affected(), ids.len())
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
    let group = match finish_set(&mut tx, reqs, completions, now).await? {
        SetFinished::Written(group) => group,
        SetFinished::RollBack(RollBack { job_id, error }) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok((GroupFinished::RolledBack { job_id, error }, false));
        }
    };
    let mut due = false;
    for (parent, deltas) in group.parents() {
        due |= child_finished(&mut tx, parent, deltas, now).await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    Ok((GroupFinished::Committed(group.into_results()?), due))
}
