//! SQLite: grouped step starts and bridge finishes ([`crate::Store::start_steps`],
//! [`crate::Store::finish_jobs`]): several jobs' transitions in one `BEGIN IMMEDIATE`
//! transaction on the held writer, so c concurrently running children cost one write
//! transaction where they cost c. A start group reads its jobs and writes its starts in one
//! statement each, deciding per job as the single path does ([`crate::state::step_gate`]); a
//! finish is written set-based
//! ([`super::finish_set::finish_set`]: one statement per kind of write for the whole group,
//! the step runs' acknowledgements included); a group's parents get their counters bumped once
//! each, with the summed deltas ([`super::fence::child_finished`]).

use super::fence::child_finished;
use super::finish_set::finish_set;
use super::jobs::{job_from_row, JOB_COLUMNS};
use super::{ms, SqliteStore};
use crate::claims::CompletionRegistry;
use crate::error::{Error, Result};
use crate::jobs::{FinishRequest, GroupFinished, StepStart};
use crate::state::ParentView;
use crate::store::finish_group::{check_final, in_request_order, job_order, RollBack, SetFinished};
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};

/// A job of a start group as read for the step gate: the row, whether it fanned out, its
/// parent's status and batch outcome.
struct GateRow {
    job: crate::jobs::Job,
    fanned_out: bool,
    parent_status: Option<String>,
    parent_outcome: Option<String>,
}

/// The group's jobs with what the step gate reads, in one statement.
async fn read_gate_rows(
    tx: &mut SqliteConnection,
    ids: &[i64],
) -> Result<std::collections::HashMap<i64, GateRow>> {
    let op = "start_steps";
    let ids_json =
        serde_json::to_string(ids).map_err(|e| Error::invalid("job ids", e.to_string()))?;
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS}, fanned_out, parent_status, parent_outcome FROM (
             SELECT j.*, j.batch_state IS NOT NULL AS fanned_out, p.status AS parent_status,
                    p.batch_outcome AS parent_outcome
             FROM dockhand_jobs j LEFT JOIN dockhand_jobs p ON p.id = j.parent_id
             WHERE j.id IN (SELECT value FROM json_each(?)))"
    ))
    .bind(ids_json)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let d = || Error::db("decode job");
    let mut out = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let job = job_from_row(row)?;
        out.insert(
            job.id,
            GateRow {
                fanned_out: row.try_get("fanned_out").map_err(d())?,
                parent_status: row.try_get("parent_status").map_err(d())?,
                parent_outcome: row.try_get("parent_outcome").map_err(d())?,
                job,
            },
        );
    }
    Ok(out)
}

/// See [`crate::Store::start_steps`]: the single path's decision ([`step_gate`]) per request
/// in job order, on rows read in one statement, and the starts written in one statement (a
/// job that appears twice is seen started by its second request, as the single path would
/// see it).
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
    let mut ids: Vec<i64> = reqs.iter().map(|r| r.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut rows = read_gate_rows(&mut tx, &ids).await?;
    let mut out: Vec<Option<StepStart>> = vec![None; reqs.len()];
    let mut starts: Vec<(usize, i64, i32)> = Vec::new();
    for i in job_order(reqs.iter().map(|r| r.0)) {
        let (job_id, step) = reqs[i];
        let Some(row) = rows.get_mut(&job_id) else {
            out[i] = Some(StepStart::Stale);
            continue;
        };
        let parent = match (row.job.parent_id, row.parent_status.as_deref()) {
            (Some(p), Some(s)) => Some(ParentView {
                status: super::fence::job_status(p, s)?,
                outcome: row.parent_outcome.as_deref(),
            }),
            _ => None,
        };
        let (start, moves) = StepStart::decide(&row.job, step, row.fanned_out, parent, now);
        if moves {
            // A second request for the job sees it started, as the single path would.
            if let StepStart::Run(job) = &start {
                row.job = job.clone();
            }
            starts.push((i, job_id, step));
        }
        out[i] = Some(start);
    }
    if !starts.is_empty() {
        let pairs: Vec<[i64; 2]> = starts
            .iter()
            .map(|(_, job, step)| [*job, i64::from(*step)])
            .collect();
        let pairs_json =
            serde_json::to_string(&pairs).map_err(|e| Error::invalid("jobs", e.to_string()))?;
        let started: Vec<i64> = sqlx::query_scalar(START_STEPS)
            .bind(ms(now))
            .bind(pairs_json)
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(op))?;
        if started.len() != starts.len() {
            // Unreachable under the write lock; never report a start that did not happen.
            return Err(Error::Config(format!(
                "start_steps: {} of {} jobs changed under the write lock",
                starts.len() - started.len(),
                starts.len()
            )));
        }
    }
    tx.commit().await.map_err(Error::db(op))?;
    in_request_order(out)
}

/// Moves the jobs of `?2` (`[[job, step], ...]`) from pending to processing. The unary `+`
/// keeps the status index out of the plan: with it, SQLite walked every pending job and
/// scanned the list for each (O(pending) per group: a batch's not yet started children made
/// each start group cost ~50 µs per started job); without it, one rowid lookup per listed job.
pub(super) const START_STEPS: &str =
    "UPDATE dockhand_jobs SET status = 'processing', updated_at = ?1
     FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS step
           FROM json_each(?2)) AS s
     WHERE dockhand_jobs.id = s.id AND dockhand_jobs.step_index = s.step
       AND +dockhand_jobs.status = 'pending'
     RETURNING dockhand_jobs.id";

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
    let group = match finish_set(&mut tx, reqs, completions, now).await? {
        SetFinished::Written(group) => group,
        SetFinished::RollBack(RollBack { job_id, error }) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(GroupFinished::RolledBack { job_id, error });
        }
    };
    let mut due = false;
    for (parent, deltas) in group.parents() {
        due |= child_finished(&mut tx, parent, deltas, now).await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    group.into_results().map(GroupFinished::Committed)
}
