//! SQLite: job rows and their step transitions (create, start, advance, park, resume) and
//! engine data (the outbox is `events`, packets are `packets`).
//!
//! Every transition is a compare-and-swap on (`id`, `step_index`, `status`); a step action is
//! enqueued with [`enqueue_one`] in the same `BEGIN IMMEDIATE` transaction that moves the job.

use super::lease_fence::output_fence;
use super::{enqueue::enqueue_one, from_ms, ms, SqliteStore};
use crate::batch::rerun::mark_rerun_by;
use crate::error::{Error, Result};
use crate::jobs::{Job, JobCreated, JobFilter, NewJob, ScheduleGuard, StepAction, StepStart};
use crate::state::{step_gate, JobStatus, ParentView, StepGate};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

/// The columns [`job_from_row`] decodes.
pub(super) const JOB_COLUMNS: &str = "id, pipeline, status, reason, step_index, input_refs,
    engine_version, parent_id, created_at, updated_at, finished_at";

/// A job row's [`JOB_COLUMNS`], in order (a read folded into one row selects them as
/// `json_array(JOB_COLUMNS)`, see `one_row`).
pub(super) type JobParts = (
    i64,
    String,
    String,
    Option<String>,
    i32,
    String,
    i64,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
);

/// Decodes a job row selected with [`JOB_COLUMNS`].
pub(super) fn job_from_row(row: &SqliteRow) -> Result<Job> {
    let d = || Error::db("decode job");
    job_from_parts((
        row.try_get("id").map_err(d())?,
        row.try_get("pipeline").map_err(d())?,
        row.try_get("status").map_err(d())?,
        row.try_get("reason").map_err(d())?,
        row.try_get("step_index").map_err(d())?,
        row.try_get("input_refs").map_err(d())?,
        row.try_get("engine_version").map_err(d())?,
        row.try_get("parent_id").map_err(d())?,
        row.try_get("created_at").map_err(d())?,
        row.try_get("updated_at").map_err(d())?,
        row.try_get("finished_at").map_err(d())?,
    ))
}

/// A job from its row's [`JobParts`].
pub(super) fn job_from_parts(p: JobParts) -> Result<Job> {
    let (id, pipeline, status, reason, step_index, refs, engine_version, parent_id) =
        (p.0, p.1, p.2, p.3, p.4, p.5, p.6, p.7);
    let corrupt = |message: String| Error::Corrupt {
        what: "job",
        id,
        message,
    };
    Ok(Job {
        id,
        pipeline,
        status: status
            .parse::<JobStatus>()
            .map_err(|e| corrupt(e.to_string()))?,
        reason,
        step_index,
        input_refs: serde_json::from_str(&refs).map_err(|e| corrupt(format!("input_refs: {e}")))?,
        engine_version,
        parent_id,
        created_at: from_ms(p.8),
        updated_at: from_ms(p.9),
        finished_at: p.10.map(from_ms),
    })
}

/// One job, read on `conn` (a reader, or the open write transaction).
pub(super) async fn read_job(conn: &mut SqliteConnection, id: i64) -> Result<Option<Job>> {
    let row = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db("get_job"))?;
    row.as_ref().map(job_from_row).transpose()
}

fn refs_json(refs: &[String]) -> Result<String> {
    serde_json::to_string(refs).map_err(|e| Error::invalid("input_refs", e.to_string()))
}

/// Enqueues step `step` of `job` on the open transaction; true when the action is due now.
async fn enqueue_step(
    conn: &mut SqliteConnection,
    template: &StepAction,
    job: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<bool> {
    let action = template.action(job, step, now);
    enqueue_one(conn, &action, now).await?;
    Ok(action.scheduled_at <= now)
}

pub(super) async fn create_job(
    store: &SqliteStore,
    job: &NewJob,
    now: DateTime<Utc>,
) -> Result<i64> {
    match create_job_guarded(store, job, None, None, now).await? {
        JobCreated::New(id) | JobCreated::Existing(id) => Ok(id),
        other => Err(Error::invalid(
            "job",
            format!("an unguarded start cannot end {other:?}"),
        )),
    }
}

/// A job started for an occurrence of a schedule (see [`crate::Store::start_scheduled_job`]).
pub(super) async fn start_scheduled_job(
    store: &SqliteStore,
    job: &NewJob,
    guard: ScheduleGuard<'_>,
    now: DateTime<Utc>,
) -> Result<JobCreated> {
    create_job_guarded(store, job, None, Some(guard), now).await
}

/// [`create_job`], and with `mark` (parent, its engine version, its engine data) the parent's
/// engine data marked with the new job as its re-run, compare-and-swap on the version, in the
/// same transaction; `None` (nothing written) when the parent's version moved.
pub(super) async fn create_job_marking(
    store: &SqliteStore,
    job: &NewJob,
    mark: Option<(i64, i64, &Value)>,
    now: DateTime<Utc>,
) -> Result<Option<i64>> {
    Ok(
        match create_job_guarded(store, job, mark, None, now).await? {
            JobCreated::New(id) | JobCreated::Existing(id) => Some(id),
            _ => None,
        },
    )
}

/// The one job-start transaction: with `schedule`, the schedule's row decides first (gone:
/// nothing; no overlap and a live job of it: nothing), then the idempotency key, then the
/// insert, the parent's re-run mark and the first step action.
async fn create_job_guarded(
    store: &SqliteStore,
    job: &NewJob,
    mark: Option<(i64, i64, &Value)>,
    schedule: Option<ScheduleGuard<'_>>,
    now: DateTime<Utc>,
) -> Result<JobCreated> {
    let refs = refs_json(&job.input_refs)?;
    let data = serde_json::to_string(&job.engine_data)
        .map_err(|e| Error::invalid("engine_data", e.to_string()))?;
    let idempotency = job.idempotency_hash();
    let mut tx = store.begin_write("create_job").await?;
    // One writer at a time (BEGIN IMMEDIATE) orders the starts of one schedule.
    let mut schedule_id = None;
    if let Some(guard) = schedule {
        let id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM dockhand_schedules WHERE name = ?")
                .bind(guard.schedule)
                .fetch_optional(&mut *tx)
                .await
                .map_err(Error::db("start_scheduled_job (schedule)"))?;
        let Some(id) = id else {
            tx.rollback().await.map_err(Error::db("create_job"))?;
            return Ok(JobCreated::ScheduleGone);
        };
        schedule_id = Some(id);
    }
    if let Some(hash) = &idempotency {
        // One writer at a time (BEGIN IMMEDIATE): nobody can insert the key between this read
        // and the insert below.
        let held: Option<i64> =
            sqlx::query_scalar("SELECT id FROM dockhand_jobs WHERE idempotency_hash = ?")
                .bind(hash)
                .fetch_optional(&mut *tx)
                .await
                .map_err(Error::db("create_job (idempotency key)"))?;
        if let Some(id) = held {
            tx.rollback().await.map_err(Error::db("create_job"))?;
            return Ok(JobCreated::Existing(id));
        }
    }
    if let (Some(sid), Some(true)) = (schedule_id, schedule.map(|g| g.no_overlap)) {
        let live: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM dockhand_jobs
             WHERE schedule_id = ? AND status IN ('pending', 'processing', 'waiting')
             ORDER BY id LIMIT 1",
        )
        .bind(sid)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("start_scheduled_job (overlap)"))?;
        if let Some(live) = live {
            tx.rollback().await.map_err(Error::db("create_job"))?;
            return Ok(JobCreated::Overlapping(live));
        }
    }
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version,
             created_at, updated_at, idempotency_key, idempotency_hash, schedule_id)
         VALUES (?, 'pending', 0, ?, ?, 0, ?, ?, ?, ?, ?)
         RETURNING id",
    )
    .bind(&job.pipeline)
    .bind(refs)
    .bind(data)
    .bind(ms(now))
    .bind(ms(now))
    .bind(&job.idempotency_key)
    .bind(&idempotency)
    .bind(schedule_id)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db("create_job"))?;
    if let Some((parent, version, data)) = mark {
        let marked = serde_json::to_string(&mark_rerun_by(data, id))
            .map_err(|e| Error::invalid("engine_data", e.to_string()))?;
        let swapped = sqlx::query(
            "UPDATE dockhand_jobs SET engine_data = ?, engine_version = engine_version + 1
             WHERE id = ? AND engine_version = ?",
        )
        .bind(marked)
        .bind(parent)
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("create_job (mark parent)"))?;
        if swapped.rows_affected() != 1 {
            tx.rollback().await.map_err(Error::db("create_job"))?;
            return Ok(JobCreated::ParentMoved);
        }
    }
    let due = enqueue_step(&mut tx, &job.step, id, 0, now).await?;
    tx.commit().await.map_err(Error::db("create_job"))?;
    if due {
        store.wake.notify();
    }
    Ok(JobCreated::New(id))
}

pub(super) async fn get_job(store: &SqliteStore, id: i64) -> Result<Option<Job>> {
    let mut conn = store.reader.acquire().await.map_err(Error::db("get_job"))?;
    read_job(&mut conn, id).await
}

pub(super) async fn list_jobs(store: &SqliteStore, f: &JobFilter) -> Result<Vec<Job>> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE 1 = 1"
    ));
    if let Some(p) = &f.pipeline {
        qb.push(" AND pipeline = ").push_bind(p.clone());
    }
    if !f.statuses.is_empty() {
        qb.push(" AND status IN (");
        let mut sep = qb.separated(", ");
        for s in &f.statuses {
            sep.push_bind(s.as_str());
        }
        qb.push(")");
    }
    let limit = if f.limit <= 0 { 100 } else { f.limit };
    qb.push(" ORDER BY id DESC LIMIT ")
        .push_bind(limit)
        .push(" OFFSET ")
        .push_bind(f.offset.max(0));
    let rows = qb
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("list_jobs"))?;
    rows.iter().map(job_from_row).collect()
}

pub(super) async fn start_step(
    store: &SqliteStore,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<StepStart> {
    let op = "start_step";
    let mut tx = store.begin_write(op).await?;
    let result = start_in_tx(&mut tx, job_id, step, now).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(result)
}

/// [`start_step`]'s decision and write on an open write transaction (also run per request by
/// [`super::grouped::start_steps`]).
pub(super) async fn start_in_tx(
    tx: &mut SqliteConnection,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<StepStart> {
    let op = "start_step";
    let Some(mut job) = read_job(&mut *tx, job_id).await? else {
        return Ok(StepStart::Stale);
    };
    // The job's batch and its parent's stop, under the same write lock as the transition.
    let (fanned_out, parent_status, parent_outcome): (bool, Option<String>, Option<String>) =
        sqlx::query_as(
            "SELECT j.batch_state IS NOT NULL, p.status, p.batch_outcome
             FROM dockhand_jobs j LEFT JOIN dockhand_jobs p ON p.id = j.parent_id
             WHERE j.id = ?",
        )
        .bind(job_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let parent_status = match (job.parent_id, parent_status) {
        (Some(p), Some(s)) => Some(super::fence::job_status(p, &s)?),
        _ => None,
    };
    let parent = parent_status.map(|status| ParentView {
        status,
        outcome: parent_outcome.as_deref(),
    });
    let result = match step_gate(job.status, job.step_index == step, fanned_out, parent) {
        StepGate::Stale => StepStart::Stale,
        StepGate::ParentStopped => StepStart::ParentStopped(job),
        StepGate::FannedOut => StepStart::FannedOut(job),
        StepGate::Run => StepStart::Run(job),
        StepGate::Start => {
            let done = sqlx::query(
                "UPDATE dockhand_jobs SET status = 'processing', updated_at = ?
                 WHERE id = ? AND step_index = ? AND status = 'pending'",
            )
            .bind(ms(now))
            .bind(job_id)
            .bind(step)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?;
            if done.rows_affected() == 1 {
                job.status = JobStatus::Processing;
                job.updated_at = crate::clock::to_millis(now);
                StepStart::Run(job)
            } else {
                StepStart::Stale
            }
        }
    };
    Ok(result)
}

pub(super) async fn advance_job(
    store: &SqliteStore,
    job_id: i64,
    fence: Option<Lease>,
    (from_step, to_step): (i32, i32),
    input_refs: &[String],
    step: &StepAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    let refs = refs_json(input_refs)?;
    let mut tx = store.begin_write("advance_job").await?;
    if let Err(e) = output_fence(&mut tx, fence, "advance_job").await {
        tx.rollback().await.map_err(Error::db("advance_job"))?;
        return Err(e);
    }
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET step_index = ?, input_refs = ?, updated_at = ?
         WHERE id = ? AND step_index = ? AND status = 'processing'",
    )
    .bind(to_step)
    .bind(refs)
    .bind(ms(now))
    .bind(job_id)
    .bind(from_step)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("advance_job"))?;
    if done.rows_affected() != 1 {
        tx.rollback().await.map_err(Error::db("advance_job"))?;
        return Ok(false);
    }
    let due = enqueue_step(&mut tx, step, job_id, to_step, now).await?;
    tx.commit().await.map_err(Error::db("advance_job"))?;
    if due {
        store.wake.notify();
    }
    Ok(true)
}

pub(super) async fn park_job(
    store: &SqliteStore,
    job_id: i64,
    fence: Option<Lease>,
    (from_step, to_step): (i32, i32),
    input_refs: &[String],
    now: DateTime<Utc>,
) -> Result<bool> {
    let refs = refs_json(input_refs)?;
    let mut tx = store.begin_write("park_job").await?;
    if let Err(e) = output_fence(&mut tx, fence, "park_job").await {
        tx.rollback().await.map_err(Error::db("park_job"))?;
        return Err(e);
    }
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET status = 'waiting', step_index = ?, input_refs = ?,
            updated_at = ?
         WHERE id = ? AND step_index = ? AND status = 'processing'",
    )
    .bind(to_step)
    .bind(refs)
    .bind(ms(now))
    .bind(job_id)
    .bind(from_step)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("park_job"))?;
    tx.commit().await.map_err(Error::db("park_job"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn resume_job(
    store: &SqliteStore,
    job_id: i64,
    step: &StepAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut tx = store.begin_write("resume_job").await?;
    let step_index: Option<i32> = sqlx::query_scalar(
        "UPDATE dockhand_jobs SET status = 'processing', updated_at = ?
         WHERE id = ? AND status = 'waiting'
         RETURNING step_index",
    )
    .bind(ms(now))
    .bind(job_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("resume_job"))?;
    let Some(step_index) = step_index else {
        tx.rollback().await.map_err(Error::db("resume_job"))?;
        return Ok(false);
    };
    let due = enqueue_step(&mut tx, step, job_id, step_index, now).await?;
    tx.commit().await.map_err(Error::db("resume_job"))?;
    if due {
        store.wake.notify();
    }
    Ok(true)
}

pub(super) async fn engine_data(store: &SqliteStore, job_id: i64) -> Result<Option<(Value, i64)>> {
    let row: Option<(String, i64)> =
        sqlx::query_as("SELECT engine_data, engine_version FROM dockhand_jobs WHERE id = ?")
            .bind(job_id)
            .fetch_optional(&store.reader)
            .await
            .map_err(Error::db("engine_data"))?;
    let Some((text, version)) = row else {
        return Ok(None);
    };
    let data = serde_json::from_str(&text).map_err(|e| Error::Corrupt {
        what: "job",
        id: job_id,
        message: format!("engine_data: {e}"),
    })?;
    Ok(Some((data, version)))
}

/// The version bump is the only change marker: the trait passes no clock time here, so
/// `updated_at` (which tracks status transitions) is left alone.
pub(super) async fn cas_engine_data(
    store: &SqliteStore,
    job_id: i64,
    expected_version: i64,
    data: &Value,
) -> Result<bool> {
    let text =
        serde_json::to_string(data).map_err(|e| Error::invalid("engine_data", e.to_string()))?;
    let mut tx = store.begin_write("cas_engine_data").await?;
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET engine_data = ?, engine_version = engine_version + 1
         WHERE id = ? AND engine_version = ?",
    )
    .bind(text)
    .bind(job_id)
    .bind(expected_version)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("cas_engine_data"))?;
    tx.commit().await.map_err(Error::db("cas_engine_data"))?;
    Ok(done.rows_affected() == 1)
}
