//! MySQL: job rows and their step transitions (create, start, advance, park, resume) and
//! engine data (the outbox is `events`, packets are `packets`). Also the text-column helpers
//! the other job, claim and batch files share.
//!
//! Every transition is a compare-and-swap on (`id`, `step_index`, `status`) or runs on the job
//! row locked with `SELECT … FOR UPDATE`; a step action is enqueued with [`enqueue_one`] in the
//! same transaction that moves the job. Every write transaction runs inside
//! [`retry_deadlocks`], so a deadlock or lock-wait timeout re-runs the whole transaction.
//!
//! Text columns use a binary collation, which MySQL reports with the `BINARY` column flag, so
//! they are decoded with [`text`] and [`opt_text`] (unchecked UTF-8, see `connect`). Binary
//! collations are `PAD SPACE` for `=`: where a filter must match exactly, it compares
//! `CAST(… AS BINARY)`.

use super::connect::retry_deadlocks;
use super::lease_fence::output_fence;
use super::{enqueue::enqueue_one, from_ms, ms, MySqlStore};
use crate::batch::rerun::mark_rerun_by;
use crate::error::{Error, Result};
use crate::jobs::{Job, JobCreated, JobFilter, NewJob, ScheduleGuard, StepAction, StepStart};
use crate::state::{step_gate, JobStatus, ParentView, StepGate};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// The columns [`job_from_row`] decodes.
pub(super) const JOB_COLUMNS: &str = "id, pipeline, status, reason, step_index, input_refs,
    engine_version, parent_id, created_at, updated_at, finished_at";

/// A non-null text column of a binary-collated table (see [`super::connect::text`]).
pub(super) fn text(row: &MySqlRow, col: &str) -> Result<String> {
    super::connect::text(row, col).map_err(Error::db("decode text column"))
}

/// A nullable text column of a binary-collated table (see [`super::connect::opt_text`]).
pub(super) fn opt_text(row: &MySqlRow, col: &str) -> Result<Option<String>> {
    super::connect::opt_text(row, col).map_err(Error::db("decode text column"))
}

/// Decodes a job row selected with [`JOB_COLUMNS`].
pub(super) fn job_from_row(row: &MySqlRow) -> Result<Job> {
    let d = || Error::db("decode job");
    let id: i64 = row.try_get("id").map_err(d())?;
    let corrupt = |message: String| Error::Corrupt {
        what: "job",
        id,
        message,
    };
    let status = text(row, "status")?;
    let refs = text(row, "input_refs")?;
    Ok(Job {
        id,
        pipeline: text(row, "pipeline")?,
        status: status
            .parse::<JobStatus>()
            .map_err(|e| corrupt(e.to_string()))?,
        reason: opt_text(row, "reason")?,
        step_index: row.try_get("step_index").map_err(d())?,
        input_refs: serde_json::from_str(&refs).map_err(|e| corrupt(format!("input_refs: {e}")))?,
        engine_version: row.try_get("engine_version").map_err(d())?,
        parent_id: row.try_get("parent_id").map_err(d())?,
        created_at: from_ms(row.try_get("created_at").map_err(d())?),
        updated_at: from_ms(row.try_get("updated_at").map_err(d())?),
        finished_at: row
            .try_get::<Option<i64>, _>("finished_at")
            .map_err(d())?
            .map(from_ms),
    })
}

/// One job, read on `conn`; `lock` adds `FOR UPDATE` (inside a write transaction).
pub(super) async fn read_job(
    conn: &mut MySqlConnection,
    id: i64,
    lock: bool,
) -> Result<Option<Job>> {
    let row = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE id = ?{}",
        if lock { " FOR UPDATE" } else { "" }
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
    conn: &mut MySqlConnection,
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
    store: &MySqlStore,
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
    store: &MySqlStore,
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
    store: &MySqlStore,
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
/// of one schedule run one after the other) decides first (gone: nothing), then the
/// idempotency key, then no overlap (a live job of the schedule: nothing), then the insert,
/// the parent's re-run mark and the first step action.
async fn create_job_guarded(
    store: &MySqlStore,
    job: &NewJob,
    mark: Option<(i64, i64, &Value)>,
    schedule: Option<ScheduleGuard<'_>>,
    now: DateTime<Utc>,
) -> Result<JobCreated> {
    let op = "create_job";
    let refs = refs_json(&job.input_refs)?;
    let data = serde_json::to_string(&job.engine_data)
        .map_err(|e| Error::invalid("engine_data", e.to_string()))?;
    let (refs, data) = (refs.as_str(), data.as_str());
    let idempotency = job.idempotency_hash();
    let idempotency = idempotency.as_deref();
    let (id, due) = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let mut schedule_id = None;
        if let Some(guard) = schedule {
            let id: Option<i64> =
                sqlx::query_scalar("SELECT id FROM dockhand_schedules WHERE name = ? FOR UPDATE")
                    .bind(guard.schedule)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(Error::db("start_scheduled_job (schedule)"))?;
            let Some(id) = id else {
                tx.rollback().await.map_err(Error::db(op))?;
                return Ok((JobCreated::ScheduleGone, false));
            };
            schedule_id = Some(id);
        }
        if let Some(hash) = idempotency {
            if let Some(id) = job_holding(&mut tx, hash).await? {
                tx.rollback().await.map_err(Error::db(op))?;
                return Ok((JobCreated::Existing(id), false));
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
                tx.rollback().await.map_err(Error::db(op))?;
                return Ok((JobCreated::Overlapping(live), false));
            }
        }
        let inserted = sqlx::query(
            "INSERT INTO dockhand_jobs
                (pipeline, status, step_index, input_refs, engine_data, engine_version,
                 created_at, updated_at, idempotency_key, idempotency_hash, schedule_id)
             VALUES (?, 'pending', 0, ?, ?, 0, ?, ?, ?, ?, ?)",
        )
        .bind(&job.pipeline)
        .bind(refs)
        .bind(data)
        .bind(ms(now))
        .bind(ms(now))
        .bind(&job.idempotency_key)
        .bind(idempotency)
        .bind(schedule_id)
        .execute(&mut *tx)
        .await;
        let done = match (inserted, idempotency) {
            // A concurrent start of the same key committed between the read and the insert
            // (READ COMMITTED takes no gap lock): return its job.
            (Err(sqlx::Error::Database(db)), Some(hash)) if db.is_unique_violation() => {
                let held = job_holding(&mut tx, hash).await?;
                tx.rollback().await.map_err(Error::db(op))?;
                return held
                    .map(|id| (JobCreated::Existing(id), false))
                    .ok_or_else(|| {
                        Error::invalid(
                            "idempotency_key",
                            format!(
                                "pipeline `{}`: the key's job was deleted while this start ran; \
                             start again",
                                job.pipeline
                            ),
                        )
                    });
            }
            (r, _) => r.map_err(Error::db(op))?,
        };
        let id = inserted_id(done.last_insert_id(), op)?;
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
                tx.rollback().await.map_err(Error::db(op))?;
                return Ok((JobCreated::ParentMoved, false));
            }
        }
        let due = enqueue_step(&mut tx, &job.step, id, 0, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok((JobCreated::New(id), due))
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(id)
}

/// The job holding idempotency hash `hash`, if one is stored.
async fn job_holding(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    hash: &str,
) -> Result<Option<i64>> {
    sqlx::query_scalar("SELECT id FROM dockhand_jobs WHERE idempotency_hash = ?")
        .bind(hash)
        .fetch_optional(&mut **tx)
        .await
        .map_err(Error::db("create_job (idempotency key)"))
}

/// The id `LAST_INSERT_ID()` reported for a single-row insert.
pub(super) fn inserted_id(id: u64, op: &'static str) -> Result<i64> {
    match i64::try_from(id) {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(Error::Config(format!(
            "{op}: the server reported insert id {id}"
        ))),
    }
}

pub(super) async fn get_job(store: &MySqlStore, id: i64) -> Result<Option<Job>> {
    let mut conn = store.pool().acquire().await.map_err(Error::db("get_job"))?;
    read_job(&mut conn, id, false).await
}

pub(super) async fn list_jobs(store: &MySqlStore, f: &JobFilter) -> Result<Vec<Job>> {
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE 1 = 1"
    ));
    if let Some(p) = &f.pipeline {
        qb.push(" AND CAST(pipeline AS BINARY) = CAST(")
            .push_bind(p.clone())
            .push(" AS BINARY)");
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
        .fetch_all(store.pool())
        .await
        .map_err(Error::db("list_jobs"))?;
    rows.iter().map(job_from_row).collect()
}

pub(super) async fn start_step(
    store: &MySqlStore,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<StepStart> {
    let op = "start_step";
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let result = start_in_tx(&mut tx, job_id, step, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(result)
    })
    .await
}

/// [`start_step`]'s decision and write on an open transaction (also run per request by
/// [`super::grouped::start_steps`]).
pub(super) async fn start_in_tx(
    tx: &mut MySqlConnection,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<StepStart> {
    let op = "start_step";
    let Some(mut job) = read_job(&mut *tx, job_id, true).await? else {
        return Ok(StepStart::Stale);
    };
    // The job's batch and its parent's stop, the parent in share mode: an operator's stop
    // (which locks it for update) and this start are ordered, so a child either started
    // before the stop committed or sees it.
    let row = sqlx::query(
        "SELECT CAST(j.batch_state IS NOT NULL AS SIGNED) AS fanned_out,
                p.status AS parent_status, p.batch_outcome AS parent_outcome
         FROM dockhand_jobs j LEFT JOIN dockhand_jobs p ON p.id = j.parent_id
         WHERE j.id = ? LOCK IN SHARE MODE",
    )
    .bind(job_id)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let fanned_out: i64 = row.try_get("fanned_out").map_err(Error::db(op))?;
    let parent = match (job.parent_id, opt_text(&row, "parent_status")?) {
        (Some(p), Some(status)) => {
            let status = status.parse::<JobStatus>().map_err(|e| Error::Corrupt {
                what: "job",
                id: p,
                message: e.to_string(),
            })?;
            Some((status, opt_text(&row, "parent_outcome")?))
        }
        _ => None,
    };
    let view = parent.as_ref().map(|(status, outcome)| ParentView {
        status: *status,
        outcome: outcome.as_deref(),
    });
    let result = match step_gate(job.status, job.step_index == step, fanned_out != 0, view) {
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
    store: &MySqlStore,
    job_id: i64,
    fence: Option<Lease>,
    (from_step, to_step): (i32, i32),
    input_refs: &[String],
    step: &StepAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "advance_job";
    let refs = refs_json(input_refs)?;
    let refs = refs.as_str();
    let due = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
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
        .map_err(Error::db(op))?;
        if done.rows_affected() != 1 {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(None);
        }
        // The job row first, then the run's action (the bridge's order).
        if let Err(e) = output_fence(&mut tx, fence, op).await {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
        let due = enqueue_step(&mut tx, step, job_id, to_step, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(Some(due))
    })
    .await?;
    if due == Some(true) {
        store.wake.notify();
    }
    Ok(due.is_some())
}

pub(super) async fn park_job(
    store: &MySqlStore,
    job_id: i64,
    fence: Option<Lease>,
    (from_step, to_step): (i32, i32),
    input_refs: &[String],
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "park_job";
    let refs = refs_json(input_refs)?;
    let refs = refs.as_str();
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
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
        .map_err(Error::db(op))?;
        if done.rows_affected() != 1 {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(false);
        }
        // The job row first, then the run's action (the bridge's order).
        if let Err(e) = output_fence(&mut tx, fence, op).await {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
        tx.commit().await.map_err(Error::db(op))?;
        Ok(true)
    })
    .await
}

pub(super) async fn resume_job(
    store: &MySqlStore,
    job_id: i64,
    step: &StepAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "resume_job";
    let due = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let step_index: Option<i32> = sqlx::query_scalar(
            "SELECT step_index FROM dockhand_jobs WHERE id = ? AND status = 'waiting' FOR UPDATE",
        )
        .bind(job_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        let Some(step_index) = step_index else {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(None);
        };
        sqlx::query(
            "UPDATE dockhand_jobs SET status = 'processing', updated_at = ?
             WHERE id = ? AND status = 'waiting'",
        )
        .bind(ms(now))
        .bind(job_id)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        let due = enqueue_step(&mut tx, step, job_id, step_index, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(Some(due))
    })
    .await?;
    if due == Some(true) {
        store.wake.notify();
    }
    Ok(due.is_some())
}

pub(super) async fn engine_data(store: &MySqlStore, job_id: i64) -> Result<Option<(Value, i64)>> {
    let row = sqlx::query("SELECT engine_data, engine_version FROM dockhand_jobs WHERE id = ?")
        .bind(job_id)
        .fetch_optional(store.pool())
        .await
        .map_err(Error::db("engine_data"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let text = text(&row, "engine_data")?;
    let version: i64 = row
        .try_get("engine_version")
        .map_err(Error::db("engine_data"))?;
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
    store: &MySqlStore,
    job_id: i64,
    expected_version: i64,
    data: &Value,
) -> Result<bool> {
    let op = "cas_engine_data";
    let text =
        serde_json::to_string(data).map_err(|e| Error::invalid("engine_data", e.to_string()))?;
    let text = text.as_str();
    retry_deadlocks(op, move || async move {
        let done = sqlx::query(
            "UPDATE dockhand_jobs SET engine_data = ?, engine_version = engine_version + 1
             WHERE id = ? AND engine_version = ?",
        )
        .bind(text)
        .bind(job_id)
        .bind(expected_version)
        .execute(store.pool())
        .await
        .map_err(Error::db(op))?;
        Ok(done.rows_affected() == 1)
    })
    .await
}
