//! PostgreSQL: the end of a batch's scheduling (B3–B6, B8) — settling leased rows that did not
//! become children, the fence (with the finalize enqueue when every child is already terminal),
//! aborts on a schedule failure or cancel, reading a parent's batch state, deleting the
//! worklist of a final parent, and reading its failed children (for a re-run).
//!
//! The lock order is the parent module's: the parent job row, then worklist rows, then item
//! claims.

use super::{
    discard_row, lock_parent, no_row, not_a_batch, parse_status, RELEASE_SIDECARS, RELEASE_UNNAMED,
};
use crate::batch::{
    decode_sidecar, finalize_action, outcome, sidecar_is_malformed, BatchAbort, BatchState,
    FailedChild, FenceOutcome, RowSettle, WorklistPending,
};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::postgres::enqueue::{batch_group, enqueue_one};
use crate::store::postgres::jobs::{job_from_row, COLUMNS};
use crate::store::postgres::PgStore;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgExecutor, Row};

/// Settles a row that did not become a child; see [`crate::Store::settle_work`].
pub(in crate::store::postgres) async fn settle_work(
    store: &PgStore,
    parent: i64,
    idx: i32,
    chunk: Lease,
    settle: &RowSettle,
    _now: DateTime<Utc>,
) -> Result<()> {
    let op = "settle_work";
    let mut tx = store.begin(op).await?;
    super::super::lease_fence::run_fence(&mut tx, chunk, op).await?;
    let row = sqlx::query(
        "SELECT state, attempts FROM dockhand_worklist WHERE parent_id = $1 AND idx = $2
         FOR UPDATE",
    )
    .bind(parent)
    .bind(idx)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let Some(row) = row else {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(no_row(parent, idx));
    };
    let state: String = row.try_get("state").map_err(Error::db(op))?;
    let attempts: i32 = row.try_get("attempts").map_err(Error::db(op))?;
    if state == "completed" || state == "discarded" {
        // Settled already (a child exists, or another delivery discarded it): nothing to do.
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(());
    }
    let (error, bump) = match settle {
        RowSettle::Retry {
            error,
            max_attempts,
        } if attempts.saturating_add(1) < *max_attempts => {
            sqlx::query(
                "UPDATE dockhand_worklist
                 SET state = 'ready', attempts = attempts + 1, error = $3,
                     lease_owner = NULL, lease_until = NULL
                 WHERE parent_id = $1 AND idx = $2",
            )
            .bind(parent)
            .bind(idx)
            .bind(error)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?;
            tx.commit().await.map_err(Error::db(op))?;
            return Ok(());
        }
        RowSettle::Retry { error, .. } => (error, 1),
        RowSettle::Discard { reason } => (reason, 0),
    };
    discard_row(&mut tx, parent, idx, (error, bump), "settle_work (discard)").await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(())
}

/// Sets the fence when nothing is outstanding; see [`crate::Store::fence_batch`].
pub(in crate::store::postgres) async fn fence_batch(
    store: &PgStore,
    parent: i64,
    now: DateTime<Utc>,
) -> Result<FenceOutcome> {
    let op = "fence_batch";
    let mut tx = store.begin(op).await?;
    let (status, _) = lock_parent(&mut tx, parent, op).await?;
    let Some(st) = read_state(&mut *tx, parent).await? else {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(not_a_batch(parent));
    };
    if st.ready > 0 || st.leased > 0 {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(FenceOutcome::Outstanding {
            ready: st.ready,
            leased: st.leased,
        });
    }
    sqlx::query(
        "UPDATE dockhand_jobs SET batch_state = 'fenced' WHERE id = $1 AND batch_state <> 'fenced'",
    )
    .bind(parent)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let due = st.children_terminal == st.children_total && !status.is_final();
    if due {
        let group = batch_group(&mut tx, parent).await?;
        enqueue_one(
            &mut tx,
            &finalize_action(parent, group, now),
            now,
            Some(&store.channel),
        )
        .await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    Ok(FenceOutcome::Fenced {
        finalize_enqueued: due,
    })
}

/// Stops scheduling; see [`crate::Store::abort_batch`].
pub(in crate::store::postgres) async fn abort_batch(
    store: &PgStore,
    parent: i64,
    why: &BatchAbort,
    now: DateTime<Utc>,
) -> Result<BatchState> {
    let op = "abort_batch";
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
    let mut tx = store.begin(op).await?;
    let (status, state) = lock_parent(&mut tx, parent, op).await?;
    if state.is_none() {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(not_a_batch(parent));
    }
    let sidecars: Vec<Json<serde_json::Value>> = sqlx::query_scalar(
        "SELECT sidecar FROM dockhand_worklist WHERE parent_id = $1 AND state = 'ready'
         FOR UPDATE",
    )
    .bind(parent)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let malformed = sidecars.iter().any(|Json(v)| sidecar_is_malformed(v));
    sqlx::query(&format!(
        "WITH d AS (
            UPDATE dockhand_worklist
            SET state = 'discarded', error = $2, lease_owner = NULL, lease_until = NULL
            WHERE parent_id = $1 AND state = 'ready'
            RETURNING sidecar){RELEASE_SIDECARS}"
    ))
    .bind(parent)
    .bind(row_error)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("abort_batch (discard)"))?;
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
         SET batch_outcome = $2, batch_stop_status = $3, batch_stop_reason = $4
         WHERE id = $1 AND batch_outcome IS NULL",
    )
    .bind(parent)
    .bind(outcome)
    .bind(stop_status)
    .bind(stop_reason)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    sqlx::query("UPDATE dockhand_jobs SET batch_state = 'fenced' WHERE id = $1")
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let st = read_state(&mut *tx, parent)
        .await?
        .ok_or_else(|| not_a_batch(parent))?;
    // Due now (no active child, no leased row): the finalize action is the durable path to
    // final, committed with the mark (B7); the caller may finish the parent at once too.
    let due = !status.is_final() && st.decision().is_some();
    if due {
        let group = batch_group(&mut tx, parent).await?;
        enqueue_one(
            &mut tx,
            &finalize_action(parent, group, now),
            now,
            Some(&store.channel),
        )
        .await?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    Ok(st)
}

/// A parent's batch state; see [`crate::Store::batch_state`].
pub(in crate::store::postgres) async fn batch_state(
    store: &PgStore,
    parent: i64,
) -> Result<Option<BatchState>> {
    read_state(&store.pool, parent).await
}

/// Whether the parent's worklist has a ready and a leased row; see
/// [`crate::Store::worklist_pending`].
pub(in crate::store::postgres) async fn worklist_pending(
    store: &PgStore,
    parent: i64,
) -> Result<Option<WorklistPending>> {
    let row: Option<(bool, bool)> = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM dockhand_worklist
                        WHERE parent_id = j.id AND state = 'ready'),
                EXISTS (SELECT 1 FROM dockhand_worklist
                        WHERE parent_id = j.id AND state = 'leased')
         FROM dockhand_jobs j WHERE j.id = $1 AND j.batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("worklist_pending"))?;
    Ok(row.map(|(ready, leased)| WorklistPending { ready, leased }))
}

/// See [`crate::Store::batch_head`].
pub(in crate::store::postgres) async fn batch_head(
    store: &PgStore,
    parent: i64,
) -> Result<Option<crate::batch::BatchHead>> {
    let row: Option<(Option<String>, Option<i32>, Option<i32>)> = sqlx::query_as(
        "SELECT batch_outcome, chunk_size, child_step
         FROM dockhand_jobs WHERE id = $1 AND batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(&store.pool)
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

/// The parent's batch fields and worklist counts; `None` when missing or not a batch parent.
async fn read_state<'e, E: PgExecutor<'e>>(ex: E, parent: i64) -> Result<Option<BatchState>> {
    let row = sqlx::query(
        "SELECT j.status, j.batch_state, j.batch_outcome, j.batch_stop_status,
                j.batch_stop_reason, j.chunk_size, j.child_step,
                j.items_total, j.children_total, j.children_terminal, j.children_completed,
                j.children_failed, j.children_skipped, w.ready, w.leased, w.completed, w.discarded
         FROM dockhand_jobs j CROSS JOIN LATERAL (
            SELECT count(*) FILTER (WHERE state = 'ready') AS ready,
                   count(*) FILTER (WHERE state = 'leased') AS leased,
                   count(*) FILTER (WHERE state = 'completed') AS completed,
                   count(*) FILTER (WHERE state = 'discarded') AS discarded
            FROM dockhand_worklist WHERE parent_id = j.id) w
         WHERE j.id = $1",
    )
    .bind(parent)
    .fetch_optional(ex)
    .await
    .map_err(Error::db("batch_state"))?;
    let Some(r) = row else { return Ok(None) };
    let d = || Error::db("decode batch state");
    let state: Option<String> = r.try_get("batch_state").map_err(d())?;
    let Some(state) = state else { return Ok(None) };
    let status: String = r.try_get("status").map_err(d())?;
    let int = |col: &str| -> Result<i64> { r.try_get::<i32, _>(col).map(i64::from).map_err(d()) };
    Ok(Some(BatchState {
        status: Some(parse_status(parent, &status)?),
        fenced: state == "fenced",
        outcome: r.try_get("batch_outcome").map_err(d())?,
        stop_status: r
            .try_get::<Option<String>, _>("batch_stop_status")
            .map_err(d())?
            .map(|s| parse_status(parent, &s))
            .transpose()?,
        stop_reason: r.try_get("batch_stop_reason").map_err(d())?,
        chunk_size: r
            .try_get::<Option<i32>, _>("chunk_size")
            .map_err(d())?
            .unwrap_or(0),
        child_step: r
            .try_get::<Option<i32>, _>("child_step")
            .map_err(d())?
            .unwrap_or(0),
        items_total: int("items_total")?,
        children_total: int("children_total")?,
        children_terminal: int("children_terminal")?,
        children_completed: int("children_completed")?,
        children_failed: int("children_failed")?,
        children_skipped: int("children_skipped")?,
        ready: r.try_get("ready").map_err(d())?,
        leased: r.try_get("leased").map_err(d())?,
        completed_rows: r.try_get("completed").map_err(d())?,
        discarded_rows: r.try_get("discarded").map_err(d())?,
    }))
}

/// Deletes a final parent's worklist; see [`crate::Store::cleanup_worklist`].
pub(in crate::store::postgres) async fn cleanup_worklist(
    store: &PgStore,
    parent: i64,
) -> Result<u64> {
    let op = "cleanup_worklist";
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM dockhand_jobs WHERE id = $1")
            .bind(parent)
            .fetch_optional(&store.pool)
            .await
            .map_err(Error::db(op))?;
    // A missing parent leaves orphan rows nothing protects: they go too.
    if let Some(status) = status {
        let status = parse_status(parent, &status)?;
        if !status.is_final() {
            return Err(Error::invalid(
                "job",
                format!("job {parent} is {status}, not final: its worklist is still in use"),
            ));
        }
    }
    // A final status never changes again (nor does a job reappear): the read cannot go stale.
    let done = sqlx::query("DELETE FROM dockhand_worklist WHERE parent_id = $1")
        .bind(parent)
        .execute(&store.pool)
        .await
        .map_err(Error::db(op))?;
    Ok(done.rows_affected())
}

/// The failed children of `parent` after `after_id`; see [`crate::Store::failed_children`].
pub(in crate::store::postgres) async fn failed_children(
    store: &PgStore,
    parent: i64,
    after_id: i64,
    limit: i64,
) -> Result<Vec<FailedChild>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS}, item_ref, sidecar FROM dockhand_jobs
         WHERE parent_id = $1 AND status = 'failed' AND id > $2
         ORDER BY id LIMIT $3"
    ))
    .bind(parent)
    .bind(after_id)
    .bind(limit.max(0))
    .fetch_all(&store.pool)
    .await
    .map_err(Error::db("failed_children"))?;
    rows.iter()
        .map(|row| {
            let job = job_from_row(row)?;
            let item_ref: Option<String> = row
                .try_get("item_ref")
                .map_err(Error::db("decode failed child"))?;
            let json: Option<Json<serde_json::Value>> = row
                .try_get("sidecar")
                .map_err(Error::db("decode failed child"))?;
            let (sidecar, sidecar_error) = decode_sidecar(json.map(|Json(v)| v));
            Ok(FailedChild {
                job,
                item_ref,
                sidecar,
                sidecar_error,
            })
        })
        .collect()
}
