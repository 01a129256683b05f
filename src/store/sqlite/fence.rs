//! SQLite: the end of a batch (B2, B3, B5, B6, B8) — the fence, aborts, the batch state read,
//! worklist cleanup, a finished batch's failed children (for a re-run), and the parent counters each child's terminal transaction bumps
//! ([`child_finished`], called by the bridge in its transaction). Also the helpers `batch`
//! shares: releasing sidecar claims by token ([`release_sql`]) and decoding a job status.

use super::batch::enqueue_due;
use super::enqueue::batch_group;
use super::jobs::{job_from_row, JOB_COLUMNS};
use super::SqliteStore;
use crate::batch::{
    decode_sidecar_text, finalize_action, outcome, sidecar_text_is_malformed, BatchAbort,
    BatchState, FailedChild, FenceOutcome, WorklistPending,
};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::finish_group::ChildDeltas;
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};

/// Deletes the claims parent `?1` still holds whose tokens are in the sidecars of its worklist
/// rows matching `rows` (a condition on `w`).
pub(super) fn release_sql(rows: &str) -> String {
    format!(
        "DELETE FROM dockhand_item_claims
         WHERE job_id = ?1 AND status = 'claimed' AND token IN (
             SELECT CASE WHEN s.type = 'object' THEN json_extract(s.value, '$.token') END
             FROM dockhand_worklist w,
                  json_each(CASE WHEN json_valid(w.sidecar) THEN w.sidecar ELSE '[]' END) s
             WHERE w.parent_id = ?1 AND {rows})"
    )
}

/// Deletes the claims parent `?1` still holds that the sidecar of no `ready`/`leased` row of
/// its worklist names: how a row with a malformed sidecar is released (by job id; see
/// [`crate::Store::settle_work`]). Run after the row left `ready`/`leased`.
pub(super) const RELEASE_UNNAMED: &str = "DELETE FROM dockhand_item_claims
 WHERE job_id = ?1 AND status = 'claimed' AND token NOT IN (
     SELECT json_extract(s.value, '$.token')
     FROM dockhand_worklist w,
          json_each(CASE WHEN json_valid(w.sidecar) AND json_type(w.sidecar) = 'array'
                         THEN w.sidecar ELSE '[]' END) s
     WHERE w.parent_id = ?1 AND w.state IN ('ready', 'leased') AND s.type = 'object'
       AND json_extract(s.value, '$.token') IS NOT NULL)";

/// A stored job status, or a corrupt-row error naming the job.
pub(super) fn job_status(id: i64, text: &str) -> Result<JobStatus> {
    text.parse().map_err(|e: Error| Error::Corrupt {
        what: "job",
        id,
        message: e.to_string(),
    })
}

fn not_a_batch(parent: i64) -> Error {
    Error::invalid("job", format!("job {parent} is not a batch parent"))
}

/// Reads batch parent `parent` on the open transaction: (status, children_total,
/// children_terminal). The inner error: the job is missing or not a batch parent.
async fn parent_row(
    conn: &mut SqliteConnection,
    parent: i64,
    op: &'static str,
) -> Result<Result<(String, i64, i64)>> {
    let row: Option<(String, Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT status, batch_state, children_total, children_terminal
         FROM dockhand_jobs WHERE id = ?",
    )
    .bind(parent)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    Ok(match row {
        None => Err(Error::NotFound {
            what: "job",
            id: parent,
        }),
        Some((_, None, _, _)) => Err(not_a_batch(parent)),
        Some((status, Some(_), total, terminal)) => Ok((status, total, terminal)),
    })
}

pub(super) async fn fence_batch(
    store: &SqliteStore,
    parent: i64,
    now: DateTime<Utc>,
) -> Result<FenceOutcome> {
    let op = "fence_batch";
    let mut tx = store.begin_write(op).await?;
    let (status, total, terminal) = match parent_row(&mut tx, parent, op).await? {
        Ok(row) => row,
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
    };
    let (ready, leased): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(SUM(state = 'ready'), 0), COALESCE(SUM(state = 'leased'), 0)
         FROM dockhand_worklist WHERE parent_id = ?",
    )
    .bind(parent)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if ready + leased > 0 {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(FenceOutcome::Outstanding { ready, leased });
    }
    sqlx::query(
        "UPDATE dockhand_jobs SET batch_state = 'fenced' WHERE id = ? AND batch_state <> 'fenced'",
    )
    .bind(parent)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let finalize = terminal == total && !job_status(parent, &status)?.is_final();
    let due = finalize && enqueue_finalize(&mut tx, parent, now).await?;
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    Ok(FenceOutcome::Fenced {
        finalize_enqueued: finalize,
    })
}

pub(super) async fn abort_batch(
    store: &SqliteStore,
    parent: i64,
    why: &BatchAbort,
    now: DateTime<Utc>,
) -> Result<BatchState> {
    let (row_error, outcome, stop_status, stop_reason) = match why {
        BatchAbort::ScheduleFailed => (
            "batch_schedule_failed",
            outcome::SCHEDULE_FAILED,
            None,
            None,
        ),
        BatchAbort::Stop { status, reason } => (
            if *status == JobStatus::Failed {
                "failed"
            } else {
                "cancelled"
            },
            outcome::STOPPED,
            Some(status.as_str()),
            Some(reason.as_str()),
        ),
    };
    let op = "abort_batch";
    let mut tx = store.begin_write(op).await?;
    let status = match parent_row(&mut tx, parent, op).await? {
        Ok((status, _, _)) => job_status(parent, &status)?,
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
    };
    let sidecars: Vec<String> = sqlx::query_scalar(
        "SELECT sidecar FROM dockhand_worklist WHERE parent_id = ? AND state = 'ready'",
    )
    .bind(parent)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let malformed = sidecars.iter().any(|s| sidecar_text_is_malformed(s));
    sqlx::query(&release_sql("w.state = 'ready'"))
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("abort_batch (release claims)"))?;
    sqlx::query(
        "UPDATE dockhand_worklist
         SET state = 'discarded', error = ?, lease_owner = NULL, lease_until = NULL
         WHERE parent_id = ? AND state = 'ready'",
    )
    .bind(row_error)
    .bind(parent)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if malformed {
        sqlx::query(RELEASE_UNNAMED)
            .bind(parent)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("abort_batch (release claims)"))?;
    }
    // The first stop wins: its outcome, status and reason are kept.
    sqlx::query(
        "UPDATE dockhand_jobs
         SET batch_outcome = ?, batch_stop_status = ?, batch_stop_reason = ?
         WHERE id = ? AND batch_outcome IS NULL",
    )
    .bind(outcome)
    .bind(stop_status)
    .bind(stop_reason)
    .bind(parent)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    sqlx::query("UPDATE dockhand_jobs SET batch_state = 'fenced' WHERE id = ?")
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let state = read_state(&mut tx, parent).await?.unwrap_or_default();
    // Due now (no active child, no leased row): the finalize action is the durable path to
    // final, committed with the mark (B7); the caller may finish the parent at once too.
    let due = !status.is_final()
        && state.decision().is_some()
        && enqueue_finalize(&mut tx, parent, now).await?;
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    Ok(state)
}

/// The parent's batch fields and worklist counts, read on `conn`; `None` when the job is
/// missing or not a batch parent.
async fn read_state(conn: &mut SqliteConnection, parent: i64) -> Result<Option<BatchState>> {
    let op = "batch_state";
    let row = sqlx::query(
        "SELECT status, batch_state, batch_outcome, batch_stop_status, batch_stop_reason,
            chunk_size, child_step, items_total, children_total, children_terminal,
            children_completed, children_failed, children_skipped
         FROM dockhand_jobs WHERE id = ? AND batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let d = || Error::db("decode batch state");
    let status: String = row.try_get("status").map_err(d())?;
    let batch: String = row.try_get("batch_state").map_err(d())?;
    let mut st = BatchState {
        status: Some(job_status(parent, &status)?),
        fenced: batch == "fenced",
        outcome: row.try_get("batch_outcome").map_err(d())?,
        stop_status: row
            .try_get::<Option<String>, _>("batch_stop_status")
            .map_err(d())?
            .map(|s| job_status(parent, &s))
            .transpose()?,
        stop_reason: row.try_get("batch_stop_reason").map_err(d())?,
        chunk_size: row
            .try_get::<Option<i32>, _>("chunk_size")
            .map_err(d())?
            .unwrap_or(0),
        child_step: row
            .try_get::<Option<i32>, _>("child_step")
            .map_err(d())?
            .unwrap_or(0),
        items_total: row.try_get("items_total").map_err(d())?,
        children_total: row.try_get("children_total").map_err(d())?,
        children_terminal: row.try_get("children_terminal").map_err(d())?,
        children_completed: row.try_get("children_completed").map_err(d())?,
        children_failed: row.try_get("children_failed").map_err(d())?,
        children_skipped: row.try_get("children_skipped").map_err(d())?,
        ..BatchState::default()
    };
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, COUNT(*) FROM dockhand_worklist WHERE parent_id = ? GROUP BY state",
    )
    .bind(parent)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    for (state, n) in counts {
        match state.as_str() {
            "ready" => st.ready = n,
            "leased" => st.leased = n,
            "completed" => st.completed_rows = n,
            "discarded" => st.discarded_rows = n,
            _ => {}
        }
    }
    Ok(Some(st))
}

pub(super) async fn batch_state(store: &SqliteStore, parent: i64) -> Result<Option<BatchState>> {
    let mut tx = store
        .reader
        .begin()
        .await
        .map_err(Error::db("batch_state"))?;
    let st = read_state(&mut tx, parent).await?;
    tx.commit().await.map_err(Error::db("batch_state"))?;
    Ok(st)
}

/// See [`crate::Store::worklist_pending`].
pub(super) async fn worklist_pending(
    store: &SqliteStore,
    parent: i64,
) -> Result<Option<WorklistPending>> {
    let row: Option<(bool, bool)> = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM dockhand_worklist
                        WHERE parent_id = j.id AND state = 'ready'),
                EXISTS (SELECT 1 FROM dockhand_worklist
                        WHERE parent_id = j.id AND state = 'leased')
         FROM dockhand_jobs j WHERE j.id = ?1 AND j.batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(&store.reader)
    .await
    .map_err(Error::db("worklist_pending"))?;
    Ok(row.map(|(ready, leased)| WorklistPending { ready, leased }))
}

/// See [`crate::Store::batch_head`].
pub(super) async fn batch_head(
    store: &SqliteStore,
    parent: i64,
) -> Result<Option<crate::batch::BatchHead>> {
    let row: Option<(Option<String>, Option<i32>, Option<i32>)> = sqlx::query_as(
        "SELECT batch_outcome, chunk_size, child_step
         FROM dockhand_jobs WHERE id = ? AND batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(&store.reader)
    .await
    .map_err(Error::db("batch_head"))?;
    Ok(row.map(
        |(outcome, chunk_size, child_step)| crate::batch::BatchHead {
            outcome,
            chunk_size: chunk_size.unwrap_or(0),
            child_step: child_step.unwrap_or(0),
        },
    ))
}

pub(super) async fn cleanup_worklist(store: &SqliteStore, parent: i64) -> Result<u64> {
    let op = "cleanup_worklist";
    let mut tx = store.begin_write(op).await?;
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM dockhand_jobs WHERE id = ?")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
    // A missing parent leaves orphan rows nothing protects: they go too.
    if let Some(s) = status {
        let final_ = job_status(parent, &s).map(JobStatus::is_final);
        if !matches!(final_, Ok(true)) {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(final_.err().unwrap_or_else(|| {
                Error::invalid(
                    "job",
                    format!("job {parent} is {s}, not final: its worklist is still in use"),
                )
            }));
        }
    }
    let done = sqlx::query("DELETE FROM dockhand_worklist WHERE parent_id = ?")
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(done.rows_affected())
}

/// In the bridge's transaction, after children of `parent` became final (one, or a group's,
/// summed in `deltas`): bumps the parent's terminal counter and the ones per status, once,
/// and enqueues the parent's finalize
/// action when its fence is set, every child is terminal and it is not final. Returns whether
/// a due finalize action was enqueued (the caller wakes runners after its commit).
pub(super) async fn child_finished(
    conn: &mut SqliteConnection,
    parent: i64,
    deltas: ChildDeltas,
    now: DateTime<Utc>,
) -> Result<bool> {
    if deltas.terminal() == 0 {
        return Ok(false);
    }
    let op = "finish_job (parent counters)";
    let row: Option<(String, Option<String>, i64, i64)> = sqlx::query_as(
        "UPDATE dockhand_jobs
         SET children_terminal = children_terminal + ?, children_completed = children_completed + ?,
             children_failed = children_failed + ?, children_skipped = children_skipped + ?
         WHERE id = ?
         RETURNING status, batch_state, children_total, children_terminal",
    )
    .bind(deltas.terminal())
    .bind(deltas.completed)
    .bind(deltas.failed)
    .bind(deltas.skipped)
    .bind(parent)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let Some((parent_status, batch, total, terminal)) = row else {
        return Ok(false);
    };
    if batch.as_deref() != Some("fenced")
        || terminal != total
        || job_status(parent, &parent_status)?.is_final()
    {
        return Ok(false);
    }
    enqueue_finalize(conn, parent, now).await
}

/// Enqueues `parent`'s finalize action in its pipeline's group; true when it is due now.
async fn enqueue_finalize(
    conn: &mut SqliteConnection,
    parent: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    let group = batch_group(conn, parent).await?;
    enqueue_due(conn, &finalize_action(parent, group, now), now).await
}

/// The failed children of `parent` after `after_id`; see [`crate::Store::failed_children`].
pub(super) async fn failed_children(
    store: &SqliteStore,
    parent: i64,
    after_id: i64,
    limit: i64,
) -> Result<Vec<FailedChild>> {
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS}, item_ref, sidecar FROM dockhand_jobs
         WHERE parent_id = ? AND status = 'failed' AND id > ?
         ORDER BY id LIMIT ?"
    ))
    .bind(parent)
    .bind(after_id)
    .bind(limit.max(0))
    .fetch_all(store.pool())
    .await
    .map_err(Error::db("failed_children"))?;
    rows.iter()
        .map(|row| {
            let job = job_from_row(row)?;
            let item_ref: Option<String> = row
                .try_get("item_ref")
                .map_err(Error::db("decode failed child"))?;
            let text: Option<String> = row
                .try_get("sidecar")
                .map_err(Error::db("decode failed child"))?;
            let (sidecar, sidecar_error) = decode_sidecar_text(text.as_deref());
            Ok(FailedChild {
                job,
                item_ref,
                sidecar,
                sidecar_error,
            })
        })
        .collect()
}
