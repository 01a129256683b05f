//! SQLite: the terminal bridge's transaction (J4) — the one place a job gets its final status,
//! together with completing (success) or deleting (failure) the item claims it owns and writing
//! its lifecycle event, all in one `BEGIN IMMEDIATE` transaction (re-run whole when a
//! completion handler fails transiently). A batch child's transaction
//! also bumps its parent's counters and, when that makes a fenced parent due, enqueues the
//! parent's finalize action.

use super::claims::{config_from, settle};
use super::fence::child_finished;
use super::finish::log;
use super::jobs::read_job;
use super::{ms, SqliteStore};
use crate::claims::completion::run_in_tx;
use crate::claims::{CompletionContext, CompletionRegistry, CompletionTx, Identity};
use crate::error::{Error, Result};
use crate::jobs::{step_action_key, BridgeOutcome, STEP_HOOK};
use crate::state::JobStatus;
use crate::store::finish_group::{ChildDeltas, InTx};
use crate::store::rerun::rerun_transaction;
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};

pub(super) async fn finish_job(
    store: &SqliteStore,
    job_id: i64,
    status: JobStatus,
    reason: Option<&str>,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<BridgeOutcome> {
    if !status.is_final() {
        return Err(Error::invalid(
            "job status",
            format!("cannot finish job {job_id} as {status}: not a final status"),
        ));
    }
    rerun_transaction("sqlite", "finish_job", || {
        finish_once(store, job_id, status, reason, completions, now)
    })
    .await
}

/// One attempt of [`finish_job`] (re-run whole when a completion handler failed transiently).
async fn finish_once(
    store: &SqliteStore,
    job_id: i64,
    status: JobStatus,
    reason: Option<&str>,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<BridgeOutcome> {
    let mut tx = store.begin_write("finish_job").await?;
    let parent = match finish_in_tx(&mut tx, job_id, status, reason, completions, now).await? {
        InTx::Finished { parent, step } => {
            cancel_queued_step(&mut tx, job_id, step, now).await?;
            parent
        }
        InTx::AlreadyFinal { status, reason } => {
            tx.rollback().await.map_err(Error::db("finish_job"))?;
            return Ok(BridgeOutcome::AlreadyFinal { status, reason });
        }
        InTx::ClaimCompletionFailed { error } => {
            tx.rollback().await.map_err(Error::db("finish_job"))?;
            return Ok(BridgeOutcome::ClaimCompletionFailed { error });
        }
    };
    let finalize = match (parent, ChildDeltas::of(status)) {
        (Some(parent), Some(deltas)) => child_finished(&mut tx, parent, deltas, now).await?,
        _ => false,
    };
    tx.commit().await.map_err(Error::db("finish_job"))?;
    if finalize {
        store.wake.notify();
    }
    Ok(BridgeOutcome::Finished)
}

/// The step action of `?2` (its unique key) and hook `?3`, canceled at `?1` if pending. The
/// `status IN ('pending', 'running')` term repeats the partial unique index's condition, which
/// SQLite's planner does not derive from `status = 'pending'`: without it the update walks
/// every pending step action by the hook index (`plan_tests`).
pub(super) const CANCEL_QUEUED_STEP: &str = "
UPDATE dockhand_actions SET status = 'canceled', finished_at = ?1,
    lease_owner = NULL, lease_until = NULL
 WHERE unique_key = ?2 AND status IN ('pending', 'running') AND status = 'pending'
   AND hook = ?3
 RETURNING id";

/// Cancels the job's step action still queued for its current step (an operator's stop, or a
/// finish that found a retry scheduled), with a `canceled` log entry: left pending, it would
/// run later only to find its job final. A running one is its step run's; it finishes and
/// finds the job final at the step boundary.
async fn cancel_queued_step(
    tx: &mut SqliteConnection,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<()> {
    let op = "finish_job (queued step action)";
    let canceled: Option<i64> = sqlx::query_scalar(CANCEL_QUEUED_STEP)
        .bind(ms(now))
        .bind(step_action_key(job_id, step))
        .bind(STEP_HOOK)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    if let Some(id) = canceled {
        let detail = format!("job {job_id} finished");
        log(&mut *tx, id, now, "canceled", Some(detail)).await?;
    }
    Ok(())
}

/// One job's bridge transition on the open write transaction: claims completed (success) or
/// released (failure), the status compare-and-swap, the outbox event. The parent's counters
/// are left to the caller (once per parent in a group). A transient completion failure is the
/// error [`Error::TransientCompletion`]; the caller rolls back.
pub(super) async fn finish_in_tx(
    tx: &mut SqliteConnection,
    job_id: i64,
    status: JobStatus,
    reason: Option<&str>,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<InTx> {
    let Some(job) = read_job(&mut *tx, job_id).await? else {
        return Err(Error::NotFound {
            what: "job",
            id: job_id,
        });
    };
    if job.status.is_final() {
        return Ok(InTx::AlreadyFinal {
            status: job.status,
            reason: job.reason,
        });
    }
    if status.is_success() {
        if let Err(error) = complete_owned_claims(&mut *tx, job_id, completions, now).await? {
            return Ok(InTx::ClaimCompletionFailed { error });
        }
    } else {
        sqlx::query("DELETE FROM dockhand_item_claims WHERE job_id = ? AND status = 'claimed'")
            .bind(job_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_job (release claims)"))?;
    }
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET status = ?, reason = ?, finished_at = ?, updated_at = ?
         WHERE id = ? AND status = ?",
    )
    .bind(status.as_str())
    .bind(reason)
    .bind(ms(now))
    .bind(ms(now))
    .bind(job_id)
    .bind(job.status.as_str())
    .execute(&mut *tx)
    .await
    .map_err(Error::db("finish_job"))?;
    if done.rows_affected() != 1 {
        // Unreachable under the write lock; never report a write that did not happen.
        return Err(Error::Config(format!(
            "finish_job: job {job_id} changed under the write lock"
        )));
    }
    // One event per job (unique job_id). The bridge writes it only when it moved the job to
    // its final status, so a row already there (left by an edited row) describes no finish
    // that happened: it is replaced, undelivered, rather than failing the finish.
    sqlx::query(
        "INSERT INTO dockhand_job_events (job_id, status, reason, created_at)
         VALUES (?, ?, ?, ?)
         ON CONFLICT (job_id) DO UPDATE SET status = excluded.status,
             reason = excluded.reason, created_at = excluded.created_at, delivered_at = NULL",
    )
    .bind(job_id)
    .bind(status.as_str())
    .bind(reason)
    .bind(ms(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("finish_job (event)"))?;
    Ok(InTx::Finished {
        parent: job.parent_id,
        step: job.step_index,
    })
}

/// Completes every claim `job_id` still holds, oldest first, running each one's handler on the
/// open transaction. The inner `Err` is a completion failure (the caller rolls back); the outer
/// one a database error.
async fn complete_owned_claims(
    conn: &mut SqliteConnection,
    job_id: i64,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<std::result::Result<(), String>> {
    let rows = sqlx::query(
        "SELECT id, scope, source_type, item_id, token, completion FROM dockhand_item_claims
         WHERE job_id = ? AND status = 'claimed'
         ORDER BY id",
    )
    .bind(job_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("finish_job (claims)"))?;
    let d = || Error::db("decode item claim");
    for row in rows {
        let id: i64 = row.try_get("id").map_err(d())?;
        let identity = Identity {
            scope: row.try_get("scope").map_err(d())?,
            source_type: row.try_get("source_type").map_err(d())?,
            item_id: row.try_get("item_id").map_err(d())?,
        };
        let item = &identity.item_id;
        let token: Option<String> = row.try_get("token").map_err(d())?;
        let text: Option<String> = row.try_get("completion").map_err(d())?;
        let config = match config_from(id, text.as_deref()) {
            Ok(c) => c,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        let handler = match completions.resolve(&config) {
            Ok(h) => h,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        if let Some(handler) = handler {
            let ctx = CompletionContext {
                token: token.unwrap_or_default(),
                job_id: Some(job_id),
                payload: config.payload.clone(),
                now,
                identity: identity.clone(),
            };
            // A transient failure is returned as the error: the caller's transaction is
            // dropped (rolled back) and re-run whole.
            if let Err(failed) =
                run_in_tx(handler.as_ref(), CompletionTx::Sqlite(&mut *conn), &ctx).await?
            {
                return Ok(Err(failed));
            }
        }
        settle(conn, id, config.retain_processed, now).await?;
    }
    Ok(Ok(()))
}
