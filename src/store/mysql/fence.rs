//! MySQL: the end of a batch (B2, B3, B5, B6, B8) — the fence, aborts, the batch state read,
//! worklist cleanup, a finished batch's failed children (for a re-run), and the parent counters each child's terminal transaction bumps
//! ([`child_finished`], called by the bridge in its transaction). Also the helpers `batch`
//! shares: locking the parent row, releasing sidecar claims by token ([`release_sidecars`]) and
//! decoding a job status.
//!
//! Lock order in every batch transaction: the parent job row (`FOR UPDATE`), then worklist rows,
//! then item claims. Sidecar tokens are read from the locked rows' sidecar JSON in Rust: a
//! malformed sidecar (not a JSON array of descriptors) names no token, so discarding its row
//! releases by job id instead ([`release_unnamed`]).

use super::batch::enqueue_due;
use super::connect::retry_deadlocks;
use super::enqueue::batch_group;
use super::jobs::{job_from_row, opt_text, text, JOB_COLUMNS};
use super::MySqlStore;
use crate::batch::{
    decode_sidecar_text, finalize_action, outcome, sidecar_text_is_malformed, BatchAbort,
    BatchState, FailedChild, FenceOutcome, WorklistPending,
};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::finish_group::ChildDeltas;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// Tokens per `DELETE`/`UPDATE … IN (…)` statement.
pub(super) const TOKENS_PER_STATEMENT: usize = 1_000;

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

/// The parent row as [`lock_parent`] reads it.
pub(super) struct ParentRow {
    /// The stored status text.
    pub status: String,
    /// `scheduling`, `fenced`, or `None` when the job is not a batch parent.
    pub batch_state: Option<String>,
    /// Why it stopped scheduling, if it did.
    pub batch_outcome: Option<String>,
    /// Children created.
    pub children_total: i64,
    /// Children final.
    pub children_terminal: i64,
}

/// Locks job `parent` (`FOR UPDATE`) on the open transaction and reads it; `None` when missing.
pub(super) async fn lock_parent(
    conn: &mut MySqlConnection,
    parent: i64,
    op: &'static str,
) -> Result<Option<ParentRow>> {
    read_parent(conn, parent, true, op).await
}

/// Reads job `parent` on the open transaction, locked (`FOR UPDATE`) or not (the last committed
/// row); `None` when missing.
pub(super) async fn read_parent(
    conn: &mut MySqlConnection,
    parent: i64,
    lock: bool,
    op: &'static str,
) -> Result<Option<ParentRow>> {
    let row = sqlx::query(if lock {
        "SELECT status, batch_state, batch_outcome, children_total, children_terminal
         FROM dockhand_jobs WHERE id = ? FOR UPDATE"
    } else {
        "SELECT status, batch_state, batch_outcome, children_total, children_terminal
         FROM dockhand_jobs WHERE id = ?"
    })
    .bind(parent)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let Some(row) = row else { return Ok(None) };
    let d = || Error::db(op);
    Ok(Some(ParentRow {
        status: text(&row, "status")?,
        batch_state: opt_text(&row, "batch_state")?,
        batch_outcome: opt_text(&row, "batch_outcome")?,
        children_total: row.try_get::<i64, _>("children_total").map_err(d())?,
        children_terminal: row.try_get::<i64, _>("children_terminal").map_err(d())?,
    }))
}

/// Locks batch parent `parent`: its row, or the error for a missing job or a job that is not a
/// batch parent (the inner error).
async fn batch_parent(
    conn: &mut MySqlConnection,
    parent: i64,
    op: &'static str,
) -> Result<Result<ParentRow>> {
    Ok(match lock_parent(conn, parent, op).await? {
        None => Err(Error::NotFound {
            what: "job",
            id: parent,
        }),
        Some(p) if p.batch_state.is_none() => Err(not_a_batch(parent)),
        Some(p) => Ok(p),
    })
}

/// The `token` strings of the descriptors in a sidecar; nothing when it is not a JSON array.
fn sidecar_tokens(sidecar: &str, into: &mut Vec<String>) {
    if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(sidecar) {
        into.extend(
            items
                .iter()
                .filter_map(|d| d.get("token").and_then(Value::as_str))
                .map(str::to_string),
        );
    }
}

/// Which worklist rows' sidecars to release.
pub(super) enum Rows {
    /// One row by index.
    Idx(i32),
    /// Every `ready` row.
    Ready,
}

/// Deletes the claims parent `parent` still holds whose tokens are in the sidecars of the
/// chosen worklist rows (locking those rows first). Returns whether one of those sidecars is
/// malformed (its claims are then to be released by [`release_unnamed`]).
pub(super) async fn release_sidecars(
    conn: &mut MySqlConnection,
    parent: i64,
    rows: Rows,
    op: &'static str,
) -> Result<bool> {
    let found: Vec<MySqlRow> = match rows {
        Rows::Idx(idx) => sqlx::query(
            "SELECT sidecar FROM dockhand_worklist WHERE parent_id = ? AND idx = ? FOR UPDATE",
        )
        .bind(parent)
        .bind(idx),
        Rows::Ready => sqlx::query(
            "SELECT sidecar FROM dockhand_worklist WHERE parent_id = ? AND state = 'ready'
             ORDER BY idx FOR UPDATE",
        )
        .bind(parent),
    }
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut tokens = Vec::new();
    let mut malformed = false;
    for row in &found {
        let sidecar = text(row, "sidecar")?;
        malformed |= sidecar_text_is_malformed(&sidecar);
        sidecar_tokens(&sidecar, &mut tokens);
    }
    delete_claims(conn, parent, tokens, op).await?;
    Ok(malformed)
}

/// Deletes the claims `parent` still holds (`claimed`) among `tokens`.
async fn delete_claims(
    conn: &mut MySqlConnection,
    parent: i64,
    mut tokens: Vec<String>,
    op: &'static str,
) -> Result<()> {
    tokens.sort_unstable();
    tokens.dedup();
    for chunk in tokens.chunks(TOKENS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("DELETE FROM dockhand_item_claims WHERE job_id = ");
        qb.push_bind(parent).push(" AND status = 'claimed' AND ");
        super::batch::push_token_in(&mut qb, chunk);
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
    }
    Ok(())
}

/// Deletes the claims `parent` still holds that the sidecar of no `ready`/`leased` row of its
/// worklist names: how a row with a malformed sidecar is released (by job id; see
/// [`crate::Store::settle_work`]). Run after the row left `ready`/`leased`.
pub(super) async fn release_unnamed(
    conn: &mut MySqlConnection,
    parent: i64,
    op: &'static str,
) -> Result<()> {
    let live: Vec<MySqlRow> = sqlx::query(
        "SELECT sidecar FROM dockhand_worklist
         WHERE parent_id = ? AND state IN ('ready', 'leased') FOR UPDATE",
    )
    .bind(parent)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut named = Vec::new();
    for row in &live {
        sidecar_tokens(&text(row, "sidecar")?, &mut named);
    }
    let named: std::collections::HashSet<String> = named.into_iter().collect();
    let held: Vec<MySqlRow> = sqlx::query(
        "SELECT token FROM dockhand_item_claims
         WHERE job_id = ? AND status = 'claimed' AND token IS NOT NULL FOR UPDATE",
    )
    .bind(parent)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut unnamed = Vec::new();
    for row in &held {
        let token = text(row, "token")?;
        if !named.contains(&token) {
            unnamed.push(token);
        }
    }
    delete_claims(conn, parent, unnamed, op).await
}

pub(super) async fn fence_batch(
    store: &MySqlStore,
    parent: i64,
    now: DateTime<Utc>,
) -> Result<FenceOutcome> {
    let op = "fence_batch";
    let (outcome, due) = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let p = match batch_parent(&mut tx, parent, op).await? {
            Ok(p) => p,
            Err(e) => {
                tx.rollback().await.map_err(Error::db(op))?;
                return Err(e);
            }
        };
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(state = 'ready'), 0) AS SIGNED) AS ready,
                    CAST(COALESCE(SUM(state = 'leased'), 0) AS SIGNED) AS leased
             FROM dockhand_worklist WHERE parent_id = ?",
        )
        .bind(parent)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        let ready: i64 = row.try_get("ready").map_err(Error::db(op))?;
        let leased: i64 = row.try_get("leased").map_err(Error::db(op))?;
        if ready + leased > 0 {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok((FenceOutcome::Outstanding { ready, leased }, false));
        }
        sqlx::query(
            "UPDATE dockhand_jobs SET batch_state = 'fenced'
             WHERE id = ? AND batch_state <> 'fenced'",
        )
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        let finalize =
            p.children_terminal == p.children_total && !job_status(parent, &p.status)?.is_final();
        let due = finalize && enqueue_finalize(&mut tx, parent, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        let outcome = FenceOutcome::Fenced {
            finalize_enqueued: finalize,
        };
        Ok((outcome, due))
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(outcome)
}

pub(super) async fn abort_batch(
    store: &MySqlStore,
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
    let (state, due) = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let p = match batch_parent(&mut tx, parent, op).await? {
            Ok(p) => p,
            Err(e) => {
                tx.rollback().await.map_err(Error::db(op))?;
                return Err(e);
            }
        };
        let malformed =
            release_sidecars(&mut tx, parent, Rows::Ready, "abort_batch (release claims)").await?;
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
            release_unnamed(&mut tx, parent, "abort_batch (release claims)").await?;
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
        // Due now (no active child, no leased row): the finalize action is the durable path
        // to final, committed with the mark (B7); the caller may finish the parent at once.
        let due = !job_status(parent, &p.status)?.is_final()
            && state.decision().is_some()
            && enqueue_finalize(&mut tx, parent, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok((state, due))
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(state)
}

/// The parent's batch fields and worklist counts in one statement (one snapshot); `None` when
/// the job is missing or not a batch parent.
async fn read_state(conn: &mut MySqlConnection, parent: i64) -> Result<Option<BatchState>> {
    let row = sqlx::query(
        "SELECT j.status, j.batch_state, j.batch_outcome, j.batch_stop_status,
            j.batch_stop_reason, j.chunk_size, j.child_step,
            j.items_total, j.children_total, j.children_terminal, j.children_completed,
            j.children_failed, j.children_skipped,
            CAST(COALESCE(w.ready, 0) AS SIGNED) AS ready,
            CAST(COALESCE(w.leased, 0) AS SIGNED) AS leased,
            CAST(COALESCE(w.completed, 0) AS SIGNED) AS completed_rows,
            CAST(COALESCE(w.discarded, 0) AS SIGNED) AS discarded_rows
         FROM dockhand_jobs j LEFT JOIN (
            SELECT parent_id, SUM(state = 'ready') AS ready, SUM(state = 'leased') AS leased,
                SUM(state = 'completed') AS completed, SUM(state = 'discarded') AS discarded
            FROM dockhand_worklist WHERE parent_id = ? GROUP BY parent_id
         ) w ON w.parent_id = j.id
         WHERE j.id = ? AND j.batch_state IS NOT NULL",
    )
    .bind(parent)
    .bind(parent)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db("batch_state"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let d = || Error::db("decode batch state");
    let int = |c: &str| -> Result<i64> { row.try_get::<i64, _>(c).map_err(d()) };
    let opt_int = |c: &str| -> Result<i32> {
        Ok(row.try_get::<Option<i32>, _>(c).map_err(d())?.unwrap_or(0))
    };
    let status = text(&row, "status")?;
    let batch = text(&row, "batch_state")?;
    Ok(Some(BatchState {
        status: Some(job_status(parent, &status)?),
        fenced: batch == "fenced",
        outcome: opt_text(&row, "batch_outcome")?,
        stop_status: opt_text(&row, "batch_stop_status")?
            .map(|s| job_status(parent, &s))
            .transpose()?,
        stop_reason: opt_text(&row, "batch_stop_reason")?,
        chunk_size: opt_int("chunk_size")?,
        child_step: opt_int("child_step")?,
        items_total: int("items_total")?,
        children_total: int("children_total")?,
        children_terminal: int("children_terminal")?,
        children_completed: int("children_completed")?,
        children_failed: int("children_failed")?,
        children_skipped: int("children_skipped")?,
        ready: int("ready")?,
        leased: int("leased")?,
        completed_rows: int("completed_rows")?,
        discarded_rows: int("discarded_rows")?,
    }))
}

pub(super) async fn batch_state(store: &MySqlStore, parent: i64) -> Result<Option<BatchState>> {
    let mut conn = store
        .pool()
        .acquire()
        .await
        .map_err(Error::db("batch_state"))?;
    read_state(&mut conn, parent).await
}

/// See [`crate::Store::worklist_pending`].
pub(super) async fn worklist_pending(
    store: &MySqlStore,
    parent: i64,
) -> Result<Option<WorklistPending>> {
    // EXISTS is an integer here (sqlx's `bool` wants a TINYINT(1) column).
    let row: Option<(i64, i64)> = sqlx::query_as(
        "SELECT CAST(EXISTS (SELECT 1 FROM dockhand_worklist
                             WHERE parent_id = j.id AND state = 'ready') AS SIGNED),
                CAST(EXISTS (SELECT 1 FROM dockhand_worklist
                             WHERE parent_id = j.id AND state = 'leased') AS SIGNED)
         FROM dockhand_jobs j WHERE j.id = ? AND j.batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(store.pool())
    .await
    .map_err(Error::db("worklist_pending"))?;
    Ok(row.map(|(ready, leased)| WorklistPending {
        ready: ready != 0,
        leased: leased != 0,
    }))
}

/// See [`crate::Store::batch_head`].
pub(super) async fn batch_head(
    store: &MySqlStore,
    parent: i64,
) -> Result<Option<crate::batch::BatchHead>> {
    let row = sqlx::query(
        "SELECT batch_outcome, chunk_size, child_step
         FROM dockhand_jobs WHERE id = ? AND batch_state IS NOT NULL",
    )
    .bind(parent)
    .fetch_optional(store.pool())
    .await
    .map_err(Error::db("batch_head"))?;
    let Some(row) = row else { return Ok(None) };
    let d = || Error::db("decode batch head");
    Ok(Some(crate::batch::BatchHead {
        outcome: opt_text(&row, "batch_outcome")?,
        chunk_size: row
            .try_get::<Option<i32>, _>("chunk_size")
            .map_err(d())?
            .unwrap_or(0),
        child_step: row
            .try_get::<Option<i32>, _>("child_step")
            .map_err(d())?
            .unwrap_or(0),
    }))
}

pub(super) async fn cleanup_worklist(store: &MySqlStore, parent: i64) -> Result<u64> {
    let op = "cleanup_worklist";
    let status: Option<String> = {
        let row = sqlx::query("SELECT status FROM dockhand_jobs WHERE id = ?")
            .bind(parent)
            .fetch_optional(store.pool())
            .await
            .map_err(Error::db(op))?;
        row.as_ref().map(|r| text(r, "status")).transpose()?
    };
    // A missing parent leaves orphan rows nothing protects: they go too.
    if let Some(s) = status {
        let status = job_status(parent, &s)?;
        if !status.is_final() {
            return Err(Error::invalid(
                "job",
                format!("job {parent} is {status}, not final: its worklist is still in use"),
            ));
        }
    }
    // A final status never changes again (nor does a job reappear): the read cannot go stale.
    retry_deadlocks(op, move || async move {
        let done = sqlx::query("DELETE FROM dockhand_worklist WHERE parent_id = ?")
            .bind(parent)
            .execute(store.pool())
            .await
            .map_err(Error::db(op))?;
        Ok(done.rows_affected())
    })
    .await
}

/// In the bridge's transaction, after children of `parent` became final (one, or a group's,
/// summed in `deltas`): bumps the parent's terminal counter and the ones per status, once
/// (locking the parent row), and enqueues the parent's finalize action when its fence is set,
/// every child is terminal and it is not final. Returns whether a due finalize action was
/// enqueued (the caller wakes runners after its commit).
pub(super) async fn child_finished(
    conn: &mut MySqlConnection,
    parent: i64,
    deltas: ChildDeltas,
    now: DateTime<Utc>,
) -> Result<bool> {
    if deltas.terminal() == 0 {
        return Ok(false);
    }
    let op = "finish_job (parent counters)";
    let done = sqlx::query(
        "UPDATE dockhand_jobs
         SET children_terminal = children_terminal + ?, children_completed = children_completed + ?,
             children_failed = children_failed + ?, children_skipped = children_skipped + ?
         WHERE id = ?",
    )
    .bind(deltas.terminal())
    .bind(deltas.completed)
    .bind(deltas.failed)
    .bind(deltas.skipped)
    .bind(parent)
    .execute(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    // The row is locked by the update above: this read sees the counters just written.
    let Some(p) = lock_parent(conn, parent, op).await? else {
        return Ok(false);
    };
    if p.batch_state.as_deref() != Some("fenced")
        || p.children_terminal != p.children_total
        || job_status(parent, &p.status)?.is_final()
    {
        return Ok(false);
    }
    enqueue_finalize(conn, parent, now).await
}

/// Enqueues `parent`'s finalize action in its pipeline's group; true when it is due now.
async fn enqueue_finalize(
    conn: &mut MySqlConnection,
    parent: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    let group = batch_group(conn, parent).await?;
    enqueue_due(conn, &finalize_action(parent, group, now), now).await
}

/// The failed children of `parent` after `after_id`; see [`crate::Store::failed_children`].
pub(super) async fn failed_children(
    store: &MySqlStore,
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
    .fetch_all(&store.pool)
    .await
    .map_err(Error::db("failed_children"))?;
    rows.iter()
        .map(|row| {
            let job = job_from_row(row)?;
            let item_ref = opt_text(row, "item_ref")?;
            let text = opt_text(row, "sidecar")?;
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
