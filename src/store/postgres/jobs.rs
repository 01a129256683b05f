//! PostgreSQL: jobs (J1–J7) and their engine data (E1); the lifecycle outbox is `events`,
//! content-addressed packets (E3) are `packets`. The final-status write lives in `bridge`.
//!
//! Every step transition is a compare-and-swap on (`id`, `step_index`, `status`); the ones that
//! hand work to a step enqueue its action (unique per job and step) in the same transaction, so
//! a job never moves without its next step being queued, nor gets a step queued twice.

use super::lease_fence::output_fence;
use super::{enqueue::enqueue_one, ts, PgStore};
use crate::batch::rerun::mark_rerun_by;
use crate::error::{Error, Result};
use crate::jobs::{Job, JobCreated, JobFilter, NewJob, ScheduleGuard, StepAction, StepStart};
use crate::state::{step_gate, JobStatus, ParentView, StepGate};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder, Row};

/// Page size when a filter's (or an event batch's) limit is 0.
pub(super) const DEFAULT_LIMIT: i64 = 100;

pub(super) const COLUMNS: &str =
    "id, pipeline, status, reason, step_index, input_refs, engine_version, \
    parent_id, created_at, updated_at, finished_at";

pub(super) fn job_from_row(row: &PgRow) -> Result<Job> {
    let d = || Error::db("decode job");
    let id: i64 = row.try_get("id").map_err(d())?;
    let corrupt = |message: String| Error::Corrupt {
        what: "job",
        id,
        message,
    };
    let status: String = row.try_get("status").map_err(d())?;
    let Json(refs): Json<Value> = row.try_get("input_refs").map_err(d())?;
    Ok(Job {
        id,
        pipeline: row.try_get("pipeline").map_err(d())?,
        status: status
            .parse::<JobStatus>()
            .map_err(|e| corrupt(e.to_string()))?,
        reason: row.try_get("reason").map_err(d())?,
        step_index: row.try_get("step_index").map_err(d())?,
        input_refs: serde_json::from_value(refs)
            .map_err(|e| corrupt(format!("input_refs: {e}")))?,
        engine_version: row.try_get("engine_version").map_err(d())?,
        parent_id: row.try_get("parent_id").map_err(d())?,
        created_at: row.try_get("created_at").map_err(d())?,
        updated_at: row.try_get("updated_at").map_err(d())?,
        finished_at: row.try_get("finished_at").map_err(d())?,
    })
}

pub(super) async fn create_job(store: &PgStore, job: &NewJob, now: DateTime<Utc>) -> Result<i64> {
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
    store: &PgStore,
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
    store: &PgStore,
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

/// The one job-start transaction: with `schedule`, the schedule's row (locked, so the starts
/// of one schedule run one after the other) decides first (gone: nothing; no overlap and a
/// live job of it: nothing), then the idempotency key, then the insert, the parent's re-run
/// mark and the first step action.
async fn create_job_guarded(
    store: &PgStore,
    job: &NewJob,
    mark: Option<(i64, i64, &Value)>,
    schedule: Option<ScheduleGuard<'_>>,
    now: DateTime<Utc>,
) -> Result<JobCreated> {
    let idempotency = job.idempotency_hash();
    let mut tx = store.begin("create_job").await?;
    let mut schedule_id = None;
    if let Some(guard) = schedule {
        let id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM dockhand_schedules WHERE name = $1 FOR UPDATE")
                .bind(guard.schedule)
                .fetch_optional(&mut *tx)
                .await
                .map_err(Error::db("start_scheduled_job (schedule)"))?;
        let Some(id) = id else {
            tx.rollback().await.map_err(Error::db("create_job"))?;
            return Ok(JobCreated::ScheduleGone);
        };
        if guard.no_overlap {
            let live: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM dockhand_jobs
                 WHERE schedule_id = $1 AND status IN ('pending', 'processing', 'waiting')
                 ORDER BY id LIMIT 1",
            )
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("start_scheduled_job (overlap)"))?;
            if let Some(live) = live {
                // The occurrence's own job (a re-run of its start) is not an overlap.
                let own: Option<i64> = match &idempotency {
                    Some(hash) => sqlx::query_scalar(
                        "SELECT id FROM dockhand_jobs WHERE idempotency_hash = $1",
                    )
                    .bind(hash)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(Error::db("create_job (idempotency key)"))?,
                    None => None,
                };
                tx.rollback().await.map_err(Error::db("create_job"))?;
                return Ok(match own {
                    Some(own) => JobCreated::Existing(own),
                    None => JobCreated::Overlapping(live),
                });
            }
        }
        schedule_id = Some(id);
    }
    // A key held by a committed job: nothing inserted (ON CONFLICT waits for a concurrent
    // insert of the same key to commit or roll back), and the holder is read below.
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version, created_at,
             updated_at, idempotency_key, idempotency_hash, schedule_id)
         VALUES ($1, 'pending', 0, $2, $3, 0, $4, $4, $5, $6, $7)
         ON CONFLICT (idempotency_hash) WHERE idempotency_hash IS NOT NULL DO NOTHING
         RETURNING id",
    )
    .bind(&job.pipeline)
    .bind(Json(&job.input_refs))
    .bind(Json(&job.engine_data))
    .bind(ts(now))
    .bind(&job.idempotency_key)
    .bind(&idempotency)
    .bind(schedule_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("create_job"))?;
    let Some(id) = inserted else {
        let held: Option<i64> =
            sqlx::query_scalar("SELECT id FROM dockhand_jobs WHERE idempotency_hash = $1")
                .bind(&idempotency)
                .fetch_optional(&mut *tx)
                .await
                .map_err(Error::db("create_job (idempotency key)"))?;
        tx.rollback().await.map_err(Error::db("create_job"))?;
        return held.map(JobCreated::Existing).ok_or_else(|| {
            Error::invalid(
                "idempotency_key",
                format!(
                    "pipeline `{}`: the key's job was deleted while this start ran; start again",
                    job.pipeline
                ),
            )
        });
    };
    if let Some((parent, version, data)) = mark {
        let swapped = sqlx::query(
            "UPDATE dockhand_jobs SET engine_data = $1, engine_version = engine_version + 1
             WHERE id = $2 AND engine_version = $3",
        )
        .bind(Json(mark_rerun_by(data, id)))
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
    enqueue_one(
        &mut tx,
        &job.step.action(id, 0, now),
        now,
        Some(&store.channel),
    )
    .await?;
    tx.commit().await.map_err(Error::db("create_job"))?;
    Ok(JobCreated::New(id))
}

pub(super) async fn get_job(store: &PgStore, id: i64) -> Result<Option<Job>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM dockhand_jobs WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("get_job"))?;
    row.as_ref().map(job_from_row).transpose()
}

pub(super) async fn list_jobs(store: &PgStore, f: &JobFilter) -> Result<Vec<Job>> {
    let mut qb: QueryBuilder<Postgres> =
        QueryBuilder::new(format!("SELECT {COLUMNS} FROM dockhand_jobs WHERE TRUE"));
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
    let limit = if f.limit <= 0 { DEFAULT_LIMIT } else { f.limit };
    qb.push(" ORDER BY id DESC LIMIT ")
        .push_bind(limit)
        .push(" OFFSET ")
        .push_bind(f.offset.max(0));
    let rows = qb
        .build()
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("list_jobs"))?;
    rows.iter().map(job_from_row).collect()
}

pub(super) async fn start_step(
    store: &PgStore,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<StepStart> {
    let op = "start_step";
    let mut tx = store.begin(op).await?;
    let started = start_in_tx(&mut tx, job_id, step, now).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(started)
}

/// [`start_step`]'s decision and write on an open transaction (also run per request by
/// [`super::grouped::start_steps`]).
pub(super) async fn start_in_tx(
    tx: &mut PgConnection,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<StepStart> {
    let op = "start_step";
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS}, batch_state IS NOT NULL AS fanned_out
         FROM dockhand_jobs WHERE id = $1 FOR UPDATE"
    ))
    .bind(job_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let Some(row) = row else {
        return Ok(StepStart::Stale);
    };
    let job = job_from_row(&row)?;
    let fanned_out: bool = row.try_get("fanned_out").map_err(Error::db(op))?;
    // The parent in key share mode: an operator's stop (which locks it for update) and this
    // start are ordered, so a child either started before the stop committed or sees it; the
    // counter updates of its finishing children do not wait for it.
    let parent = match job.parent_id {
        Some(p) => sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT status, batch_outcome FROM dockhand_jobs WHERE id = $1 FOR KEY SHARE",
        )
        .bind(p)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db(op))?
        .map(|(s, o)| Ok::<_, Error>((super::batch::parse_status(p, &s)?, o)))
        .transpose()?,
        None => None,
    };
    let view = parent.as_ref().map(|(status, outcome)| ParentView {
        status: *status,
        outcome: outcome.as_deref(),
    });
    let started = match step_gate(job.status, job.step_index == step, fanned_out, view) {
        StepGate::Stale => StepStart::Stale,
        StepGate::ParentStopped => StepStart::ParentStopped(job),
        StepGate::FannedOut => StepStart::FannedOut(job),
        StepGate::Run => StepStart::Run(job),
        StepGate::Start => {
            let row = sqlx::query(&format!(
                "UPDATE dockhand_jobs SET status = 'processing', updated_at = $2
                 WHERE id = $1 RETURNING {COLUMNS}"
            ))
            .bind(job_id)
            .bind(ts(now))
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db(op))?;
            StepStart::Run(job_from_row(&row)?)
        }
    };
    Ok(started)
}

pub(super) async fn advance_job(
    store: &PgStore,
    job_id: i64,
    fence: Option<Lease>,
    (from_step, to_step): (i32, i32),
    input_refs: &[String],
    step: &StepAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "advance_job";
    let mut tx = store.begin(op).await?;
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET step_index = $3, input_refs = $4, updated_at = $5
         WHERE id = $1 AND step_index = $2 AND status = 'processing'",
    )
    .bind(job_id)
    .bind(from_step)
    .bind(to_step)
    .bind(Json(input_refs))
    .bind(ts(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("advance_job"))?;
    if done.rows_affected() != 1 {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(false);
    }
    // The job row first, then the run's action (the bridge's order).
    output_fence(&mut tx, fence, op).await?;
    let action = step.action(job_id, to_step, now);
    enqueue_one(&mut tx, &action, now, Some(&store.channel)).await?;
    tx.commit().await.map_err(Error::db("advance_job"))?;
    Ok(true)
}

pub(super) async fn park_job(
    store: &PgStore,
    job_id: i64,
    fence: Option<Lease>,
    (from_step, to_step): (i32, i32),
    input_refs: &[String],
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "park_job";
    let mut tx = store.begin(op).await?;
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET status = 'waiting', step_index = $3, input_refs = $4,
            updated_at = $5
         WHERE id = $1 AND step_index = $2 AND status = 'processing'",
    )
    .bind(job_id)
    .bind(from_step)
    .bind(to_step)
    .bind(Json(input_refs))
    .bind(ts(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if done.rows_affected() != 1 {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(false);
    }
    // The job row first, then the run's action (the bridge's order).
    output_fence(&mut tx, fence, op).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(true)
}

pub(super) async fn resume_job(
    store: &PgStore,
    job_id: i64,
    step: &StepAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut tx = store.begin("resume_job").await?;
    let step_index: Option<i32> = sqlx::query_scalar(
        "UPDATE dockhand_jobs SET status = 'processing', updated_at = $2
         WHERE id = $1 AND status = 'waiting'
         RETURNING step_index",
    )
    .bind(job_id)
    .bind(ts(now))
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("resume_job"))?;
    let Some(step_index) = step_index else {
        tx.rollback().await.map_err(Error::db("resume_job"))?;
        return Ok(false);
    };
    let action = step.action(job_id, step_index, now);
    enqueue_one(&mut tx, &action, now, Some(&store.channel)).await?;
    tx.commit().await.map_err(Error::db("resume_job"))?;
    Ok(true)
}

pub(super) async fn engine_data(store: &PgStore, job_id: i64) -> Result<Option<(Value, i64)>> {
    let row = sqlx::query("SELECT engine_data, engine_version FROM dockhand_jobs WHERE id = $1")
        .bind(job_id)
        .fetch_optional(&store.pool)
        .await
        .map_err(Error::db("engine_data"))?;
    let Some(row) = row else { return Ok(None) };
    let Json(data): Json<Value> = row
        .try_get("engine_data")
        .map_err(Error::db("engine_data"))?;
    let version: i64 = row
        .try_get("engine_version")
        .map_err(Error::db("engine_data"))?;
    Ok(Some((data, version)))
}

/// `updated_at` is left alone: this call has no caller time, and every stored time comes from
/// the caller's clock.
pub(super) async fn cas_engine_data(
    store: &PgStore,
    job_id: i64,
    expected_version: i64,
    data: &Value,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET engine_data = $3, engine_version = engine_version + 1
         WHERE id = $1 AND engine_version = $2",
    )
    .bind(job_id)
    .bind(expected_version)
    .bind(Json(data))
    .execute(&store.pool)
    .await
    .map_err(Error::db("cas_engine_data"))?;
    Ok(done.rows_affected() == 1)
}
