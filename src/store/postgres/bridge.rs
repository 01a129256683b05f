//! PostgreSQL: the terminal bridge's transaction (J4), the one place a job's final status is
//! written.
//!
//! The job row is locked first (`FOR UPDATE`), then the job's active claims (in id order). On a
//! success status every claim's completion handler runs on this transaction and the claim is
//! marked processed or deleted; any failure rolls the whole transaction back (a handler's
//! transient failure, or a deadlock, re-runs it whole). On failure or
//! cancellation the job's active claims are deleted so the items can be claimed again. The
//! status write is a compare-and-swap on the status read, and the lifecycle event goes into the
//! outbox in the same commit.
//!
//! A batch child also bumps its parent's counters in that commit (`children_terminal` and the
//! group of its status) and, when that makes a fenced parent complete, enqueues the parent's
//! finalize action there too, so the last child to finish always leaves the parent a wake-up.

use super::claims::{decode_completion, settle};
use super::enqueue::{batch_group, enqueue_one};
use super::finish::log;
use super::{ts, PgStore};
use crate::batch::finalize_action;
use crate::claims::completion::run_in_tx;
use crate::claims::{
    CompletionConfig, CompletionContext, CompletionRegistry, CompletionTx, Identity,
};
use crate::error::{Error, Result};
use crate::jobs::{step_action_key, BridgeOutcome, STEP_HOOK};
use crate::state::JobStatus;
use crate::store::finish_group::{ChildDeltas, InTx};
use crate::store::rerun::rerun_transaction;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Row};

/// Finishes `job_id` with the final `status`; see [`crate::Store::finish_job`].
pub(super) async fn finish_job(
    store: &PgStore,
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
    rerun_transaction("postgres", "finish_job", || {
        finish_once(store, job_id, status, reason, completions, now)
    })
    .await
}

/// One attempt of [`finish_job`] (re-run whole when a completion handler failed transiently
/// or the transaction deadlocked).
async fn finish_once(
    store: &PgStore,
    job_id: i64,
    status: JobStatus,
    reason: Option<&str>,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<BridgeOutcome> {
    let op = "finish_job";
    let mut tx = store.begin(op).await?;
    let parent = match finish_in_tx(&mut tx, job_id, status, reason, completions, now).await? {
        InTx::Finished { parent, step } => {
            cancel_queued_step(&mut tx, job_id, step, now).await?;
            parent
        }
        InTx::AlreadyFinal { status, reason } => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(BridgeOutcome::AlreadyFinal { status, reason });
        }
        InTx::ClaimCompletionFailed { error } => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(BridgeOutcome::ClaimCompletionFailed { error });
        }
    };
    let finalize = match parent {
        Some(parent) => {
            let deltas = ChildDeltas::of(status).ok_or_else(|| {
                Error::invalid(
                    "job status",
                    format!("cannot count child {job_id} as {status}: not a final status"),
                )
            })?;
            count_children(&mut tx, store, parent, deltas, now).await?
        }
        None => false,
    };
    tx.commit().await.map_err(Error::db(op))?;
    if finalize {
        store.wake.notify();
    }
    Ok(BridgeOutcome::Finished)
}

/// Cancels the job's step action still queued for its current step (an operator's stop, or a
/// finish that found a retry scheduled), with a `canceled` log entry: left pending, it would
/// run later only to find its job final. A running one is its step run's; it finishes and
/// finds the job final at the step boundary. Runs after the job row's lock (lock order: job,
/// then action). The `status IN ('pending', 'running')` term is the partial unique index's
/// condition, written out so the key lookup uses it.
async fn cancel_queued_step(
    tx: &mut PgConnection,
    job_id: i64,
    step: i32,
    now: DateTime<Utc>,
) -> Result<()> {
    let op = "finish_job (queued step action)";
    let canceled: Option<i64> = sqlx::query_scalar(
        "UPDATE dockhand_actions SET status = 'canceled', finished_at = $1,
             lease_owner = NULL, lease_until = NULL
         WHERE unique_key = $2 AND status IN ('pending', 'running') AND status = 'pending'
           AND hook = $3
         RETURNING id",
    )
    .bind(ts(now))
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

/// One job's bridge transition on the open transaction: the job row locked, claims completed
/// (success) or released (failure), the status compare-and-swap, the outbox event. The
/// parent's counters are left to the caller (once per parent in a group). A transient
/// completion failure is the error [`Error::TransientCompletion`]; the caller rolls back.
pub(super) async fn finish_in_tx(
    tx: &mut PgConnection,
    job_id: i64,
    status: JobStatus,
    reason: Option<&str>,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<InTx> {
    let op = "finish_job";
    let row = sqlx::query(
        "SELECT status, reason, parent_id, step_index FROM dockhand_jobs WHERE id = $1 FOR UPDATE",
    )
    .bind(job_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let Some(row) = row else {
        return Err(Error::NotFound {
            what: "job",
            id: job_id,
        });
    };
    let current: String = row.try_get("status").map_err(Error::db(op))?;
    let current = current.parse::<JobStatus>().map_err(|e| Error::Corrupt {
        what: "job",
        id: job_id,
        message: e.to_string(),
    })?;
    if current.is_final() {
        let standing: Option<String> = row.try_get("reason").map_err(Error::db(op))?;
        return Ok(InTx::AlreadyFinal {
            status: current,
            reason: standing,
        });
    }
    if status.is_success() {
        if let Err(error) = complete_claims(&mut *tx, job_id, completions, now).await? {
            return Ok(InTx::ClaimCompletionFailed { error });
        }
    } else {
        sqlx::query("DELETE FROM dockhand_item_claims WHERE job_id = $1 AND status = 'claimed'")
            .bind(job_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_job (release claims)"))?;
    }
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET status = $3, reason = $4, finished_at = $5, updated_at = $5
         WHERE id = $1 AND status = $2",
    )
    .bind(job_id)
    .bind(current.as_str())
    .bind(status.as_str())
    .bind(reason)
    .bind(ts(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if done.rows_affected() != 1 {
        // Unreachable while the row lock holds; never report a write that did not happen.
        return Err(Error::Config(format!(
            "job {job_id} changed under its row lock while finishing it"
        )));
    }
    // One event per job (unique job_id). The bridge writes it only when it moved the job to
    // its final status, so a row already there (left by an edited row) describes no finish
    // that happened: it is replaced, undelivered, rather than failing the finish.
    sqlx::query(
        "INSERT INTO dockhand_job_events (job_id, status, reason, created_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (job_id) DO UPDATE SET status = EXCLUDED.status,
             reason = EXCLUDED.reason, created_at = EXCLUDED.created_at, delivered_at = NULL",
    )
    .bind(job_id)
    .bind(status.as_str())
    .bind(reason)
    .bind(ts(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("finish_job (event)"))?;
    let parent: Option<i64> = row.try_get("parent_id").map_err(Error::db(op))?;
    let step: i32 = row.try_get("step_index").map_err(Error::db(op))?;
    Ok(InTx::Finished { parent, step })
}

/// Counts finished children of `parent` (one, or a group's, summed in `deltas`) on the
/// bridge's transaction, in one update; enqueues the parent's finalize action when the parent
/// is fenced, every child is now terminal and the parent is not final. Returns whether it
/// enqueued.
pub(super) async fn count_children(
    conn: &mut PgConnection,
    store: &PgStore,
    parent: i64,
    deltas: ChildDeltas,
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "finish_job (parent counters)";
    if deltas.terminal() == 0 {
        return Ok(false);
    }
    let row = sqlx::query(
        "UPDATE dockhand_jobs
         SET children_terminal = children_terminal + $2,
             children_completed = children_completed + $3,
             children_failed = children_failed + $4,
             children_skipped = children_skipped + $5
         WHERE id = $1
         RETURNING batch_state, children_terminal, children_total, status",
    )
    .bind(parent)
    .bind(i32::try_from(deltas.terminal()).unwrap_or(i32::MAX))
    .bind(i32::try_from(deltas.completed).unwrap_or(i32::MAX))
    .bind(i32::try_from(deltas.failed).unwrap_or(i32::MAX))
    .bind(i32::try_from(deltas.skipped).unwrap_or(i32::MAX))
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    // The parent row is gone: nothing to count on, nothing to finalize.
    let Some(row) = row else { return Ok(false) };
    let state: Option<String> = row.try_get("batch_state").map_err(Error::db(op))?;
    let terminal: i32 = row.try_get("children_terminal").map_err(Error::db(op))?;
    let total: i32 = row.try_get("children_total").map_err(Error::db(op))?;
    let parent_status: String = row.try_get("status").map_err(Error::db(op))?;
    let parent_status = parent_status
        .parse::<JobStatus>()
        .map_err(|e| Error::Corrupt {
            what: "job",
            id: parent,
            message: e.to_string(),
        })?;
    let due = state.as_deref() == Some("fenced") && terminal == total && !parent_status.is_final();
    if due {
        let group = batch_group(conn, parent).await?;
        enqueue_one(
            conn,
            &finalize_action(parent, group, now),
            now,
            Some(&store.channel),
        )
        .await?;
    }
    Ok(due)
}

/// Completes every claim the job holds, on `conn`. The inner `Err` is a completion failure (the
/// caller rolls back); the outer one a database error.
async fn complete_claims(
    conn: &mut PgConnection,
    job_id: i64,
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<std::result::Result<(), String>> {
    let rows = sqlx::query(
        "SELECT id, scope, source_type, item_id, token, completion FROM dockhand_item_claims
         WHERE job_id = $1 AND status = 'claimed' ORDER BY id FOR UPDATE",
    )
    .bind(job_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("finish_job (claims)"))?;
    for row in &rows {
        let (id, ctx, config) = match claim_context(row, job_id, now) {
            Ok(c) => c,
            // A corrupt claim cannot be completed: fail the job, which releases its claims.
            Err(e) => return Ok(Err(e.to_string())),
        };
        let item = &ctx.identity.item_id;
        let handler = match completions.resolve(&config) {
            Ok(h) => h,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        if let Some(handler) = handler {
            // A transient failure is returned as the error: the caller's transaction is
            // dropped (rolled back) and re-run whole.
            if let Err(failed) =
                run_in_tx(handler.as_ref(), CompletionTx::Postgres(&mut *conn), &ctx).await?
            {
                return Ok(Err(failed));
            }
        }
        settle(conn, id, config.retain_processed, now).await?;
    }
    Ok(Ok(()))
}

/// A locked claim row's id, its handler context and its completion config (the default config
/// when none was stored).
pub(super) fn claim_context(
    row: &PgRow,
    job_id: i64,
    now: DateTime<Utc>,
) -> Result<(i64, CompletionContext, CompletionConfig)> {
    let d = || Error::db("decode item claim");
    let id: i64 = row.try_get("id").map_err(d())?;
    let token: Option<String> = row.try_get("token").map_err(d())?;
    let token = token.ok_or_else(|| Error::Corrupt {
        what: "item claim",
        id,
        message: "claimed without a token".into(),
    })?;
    let completion: Option<Json<Value>> = row.try_get("completion").map_err(d())?;
    let config = match completion {
        Some(Json(v)) => decode_completion(id, v)?,
        None => CompletionConfig::default(),
    };
    let ctx = CompletionContext {
        identity: Identity {
            scope: row.try_get("scope").map_err(d())?,
            source_type: row.try_get("source_type").map_err(d())?,
            item_id: row.try_get("item_id").map_err(d())?,
        },
        token,
        job_id: Some(job_id),
        payload: config.payload.clone(),
        now,
    };
    Ok((id, ctx, config))
}
