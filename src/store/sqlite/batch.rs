//! SQLite: batches (B1, B2, B4) — the worklist written by fan-out, the chunk action, rows
//! leased chunk by chunk and turned into child jobs (their sidecar claims handed over), and
//! rows that did not become children settled. The fence, aborts and counters are in `fence`.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction (the single writer is the parent's lock);
//! actions are enqueued with [`enqueue_one`] inside it and runners are woken after the commit.
//! Sidecar claims are released by token, read from the rows' sidecar JSON in SQL; a malformed
//! sidecar (see [`crate::batch::sidecar_text_is_malformed`]) names no token, so discarding its
//! row releases by job id instead ([`super::fence::RELEASE_UNNAMED`]).

use super::enqueue::{batch_group, enqueue_one};
use super::fence::{job_status, release_sql, RELEASE_UNNAMED};
use super::lease_fence::{output_fence, run_fence};
use super::one_row::decode;
use super::{ms, SqliteStore};
use crate::action::PreparedAction;
use crate::batch::{
    chunk_action, chunk_owner, sidecar_text_is_malformed, ChildOutcome, ChildSpec, DiscardCause,
    FanOutOutcome, RowSettle, WorkItem, WorkRow,
};
use crate::claims::Descriptor;
use crate::error::{Error, Result};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

/// Bound parameters per worklist row; chunks stay under SQLite's 32,766-parameter limit.
const PARAMS_PER_ROW: usize = 4;
const MAX_PARAMS: usize = 32_000;

/// The rows a chunk run leases next (binds: 1 parent, 2 owner, 3 now, 4 limit): ready rows
/// and rows whose lease ended or is the owner's, in index order, read as one row (see
/// `one_row`) of `[idx, payload_ref, sidecar, attempts]`; [`LEASE`] then leases them.
const TO_LEASE: &str = "SELECT json_group_array(json_array(idx, payload_ref, sidecar, attempts))
 FROM (SELECT idx, payload_ref, sidecar, attempts FROM dockhand_worklist
       WHERE parent_id = ?1 AND idx IN (
           SELECT idx FROM (SELECT idx FROM dockhand_worklist
                            WHERE parent_id = ?1 AND state = 'ready' ORDER BY idx LIMIT ?4)
           UNION ALL
           SELECT idx FROM (SELECT idx FROM dockhand_worklist
                            WHERE parent_id = ?1 AND state = 'leased'
                              AND (lease_until IS NULL OR lease_until <= ?3 OR lease_owner = ?2)
                            ORDER BY idx LIMIT ?4)
           ORDER BY idx
           LIMIT ?4)
       ORDER BY idx)";

/// Leases the rows [`TO_LEASE`] read (binds: 1 parent, 2 owner, 3 lease end, 4 a JSON array
/// of their indexes).
const LEASE: &str =
    "UPDATE dockhand_worklist SET state = 'leased', lease_owner = ?2, lease_until = ?3
 WHERE parent_id = ?1 AND idx IN (SELECT value FROM json_each(?4))";

fn no_row(parent: i64, idx: i32) -> Error {
    Error::invalid("idx", format!("job {parent} has no worklist row {idx}"))
}

/// Why no child may be created for row `idx`: the parent is missing, or the row is missing or
/// no longer `ready`/`leased` (an error); or the parent is final or its batch has an outcome
/// (`Ok(true)`: the row is discarded instead).
pub(super) fn refusal(
    parent: i64,
    idx: i32,
    status: Option<&str>,
    outcome: Option<&str>,
    row: Option<&str>,
) -> Result<bool> {
    let Some(status) = status else {
        return Err(Error::NotFound {
            what: "job",
            id: parent,
        });
    };
    let status = job_status(parent, status)?;
    match row {
        None => Err(no_row(parent, idx)),
        Some("ready" | "leased") => Ok(status.is_final() || outcome.is_some()),
        Some(state) => Err(Error::invalid(
            "idx",
            format!("worklist row {idx} of job {parent} is {state}"),
        )),
    }
}

/// Discards row `idx` of `parent` on the open transaction with `error`, releasing the parent's
/// claims among its sidecar's tokens (by job id when `malformed`, see
/// [`crate::Store::settle_work`]); `bump` is added to its attempts.
pub(super) async fn discard_row(
    conn: &mut SqliteConnection,
    parent: i64,
    idx: i32,
    error: &str,
    bump: i32,
    malformed: bool,
    op: &'static str,
) -> Result<()> {
    sqlx::query(&release_sql("w.idx = ?2"))
        .bind(parent)
        .bind(idx)
        .execute(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    sqlx::query(
        "UPDATE dockhand_worklist
         SET state = 'discarded', attempts = attempts + ?, error = ?, lease_owner = NULL,
             lease_until = NULL
         WHERE parent_id = ? AND idx = ?",
    )
    .bind(bump)
    .bind(error)
    .bind(parent)
    .bind(idx)
    .execute(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    if malformed {
        sqlx::query(RELEASE_UNNAMED)
            .bind(parent)
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
    }
    Ok(())
}

/// Enqueues `action` on the open transaction; true when it is due now.
pub(super) async fn enqueue_due(
    conn: &mut SqliteConnection,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    enqueue_one(conn, action, now).await?;
    Ok(action.scheduled_at <= now)
}

pub(super) async fn fan_out(
    store: &SqliteStore,
    parent: i64,
    fence: Option<Lease>,
    items: &[WorkItem],
    (chunk_size, child_step): (i32, i32),
    contract: &str,
    now: DateTime<Utc>,
) -> Result<FanOutOutcome> {
    if items.is_empty() {
        return Err(Error::invalid(
            "packets",
            format!("job {parent}: a fan-out needs at least one item"),
        ));
    }
    if chunk_size < 1 {
        return Err(Error::invalid(
            "chunk_size",
            format!("{chunk_size}: must be at least 1"),
        ));
    }
    let total = i32::try_from(items.len())
        .map_err(|_| Error::invalid("packets", format!("{} items is too many", items.len())))?;
    let sidecars = items
        .iter()
        .map(|i| serde_json::to_string(&i.sidecar))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid("sidecar", e.to_string()))?;
    let mut tx = store.begin_write("fan_out").await?;
    if let Err(e) = output_fence(&mut tx, fence, "fan_out").await {
        tx.rollback().await.map_err(Error::db("fan_out"))?;
        return Err(e);
    }
    let existing: Option<Option<String>> =
        sqlx::query_scalar("SELECT batch_contract FROM dockhand_jobs WHERE id = ?")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("fan_out"))?;
    match existing {
        None => {
            tx.rollback().await.map_err(Error::db("fan_out"))?;
            return Err(Error::NotFound {
                what: "job",
                id: parent,
            });
        }
        Some(Some(existing)) => {
            tx.rollback().await.map_err(Error::db("fan_out"))?;
            return Ok(if existing == contract {
                FanOutOutcome::Adopted
            } else {
                FanOutOutcome::Rejected { existing }
            });
        }
        Some(None) => {}
    }
    let idx: Vec<i32> = (0..total).collect();
    for chunk in idx.chunks(MAX_PARAMS / PARAMS_PER_ROW) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO dockhand_worklist (parent_id, idx, payload_ref, sidecar) ",
        );
        qb.push_values(chunk, |mut b, &i| {
            let at = i as usize;
            b.push_bind(parent)
                .push_bind(i)
                .push_bind(&items[at].payload_ref)
                .push_bind(&sidecars[at]);
        });
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("fan_out (worklist)"))?;
    }
    sqlx::query(
        "UPDATE dockhand_jobs SET batch_state = 'scheduling', batch_contract = ?,
            chunk_size = ?, child_step = ?, items_total = ?, updated_at = ?
         WHERE id = ?",
    )
    .bind(contract)
    .bind(chunk_size)
    .bind(child_step)
    .bind(i64::from(total))
    .bind(ms(now))
    .bind(parent)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("fan_out"))?;
    tx.commit().await.map_err(Error::db("fan_out"))?;
    Ok(FanOutOutcome::Created)
}

pub(super) async fn schedule_chunk(
    store: &SqliteStore,
    parent: i64,
    offset: i64,
    priority: i32,
    now: DateTime<Utc>,
) -> Result<()> {
    let mut tx = store.begin_write("schedule_chunk").await?;
    let group = batch_group(&mut tx, parent).await?;
    let action = chunk_action(parent, offset, priority, group, now);
    let due = enqueue_due(&mut tx, &action, now).await?;
    tx.commit().await.map_err(Error::db("schedule_chunk"))?;
    if due {
        store.wake.notify();
    }
    Ok(())
}

pub(super) async fn lease_work(
    store: &SqliteStore,
    parent: i64,
    limit: i64,
    chunk: Lease,
    lease_until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<WorkRow>> {
    let mut tx = store.begin_write("lease_work").await?;
    if let Err(e) = run_fence(&mut tx, chunk, "lease_work").await {
        tx.rollback().await.map_err(Error::db("lease_work"))?;
        return Err(e);
    }
    if limit <= 0 {
        tx.rollback().await.map_err(Error::db("lease_work"))?;
        return Ok(Vec::new());
    }
    // Read, then leased: an `UPDATE … RETURNING` answers a row per message (see `one_row`).
    let rows: String = sqlx::query_scalar(TO_LEASE)
        .bind(parent)
        .bind(chunk_owner(chunk.id))
        .bind(ms(now))
        .bind(limit)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::db("lease_work"))?;
    let rows: Vec<(i32, String, String, i32)> = decode(&rows, "worklist rows")?;
    let idxs: Vec<i32> = rows.iter().map(|r| r.0).collect();
    if !idxs.is_empty() {
        sqlx::query(LEASE)
            .bind(parent)
            .bind(chunk_owner(chunk.id))
            .bind(ms(lease_until))
            .bind(serde_json::to_string(&idxs).map_err(|e| Error::invalid("idx", e.to_string()))?)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("lease_work"))?;
    }
    tx.commit().await.map_err(Error::db("lease_work"))?;
    let mut leased = Vec::with_capacity(rows.len());
    for (idx, payload_ref, text, attempts) in rows {
        let (sidecar, sidecar_error) = match serde_json::from_str::<Vec<Descriptor>>(&text) {
            Ok(s) => (s, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        leased.push(WorkRow {
            parent_id: parent,
            idx,
            payload_ref,
            sidecar,
            sidecar_error,
            attempts,
        });
    }
    leased.sort_by_key(|r| r.idx);
    Ok(leased)
}

pub(super) async fn create_child(
    store: &SqliteStore,
    c: &ChildSpec,
    chunk: Lease,
    now: DateTime<Utc>,
) -> Result<ChildOutcome> {
    let refs = serde_json::to_string(&c.input_refs)
        .map_err(|e| Error::invalid("input_refs", e.to_string()))?;
    let mut tokens: Vec<&String> = c.claim_tokens.iter().collect();
    tokens.sort_unstable();
    tokens.dedup();
    let wanted = i64::try_from(tokens.len())
        .map_err(|_| Error::invalid("claim_tokens", "too many tokens"))?;
    let tokens = serde_json::to_string(&tokens)
        .map_err(|e| Error::invalid("claim_tokens", e.to_string()))?;
    let (parent, idx) = (c.parent_id, c.idx);
    let op = "create_child";
    let mut tx = store.begin_write(op).await?;
    if let Err(e) = run_fence(&mut tx, chunk, op).await {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(e);
    }
    let existing: Option<i64> =
        sqlx::query_scalar("SELECT id FROM dockhand_jobs WHERE parent_id = ? AND child_index = ?")
            .bind(parent)
            .bind(idx)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
    if let Some(child) = existing {
        sqlx::query(
            "UPDATE dockhand_worklist
             SET state = 'completed', child_id = ?1, lease_owner = NULL, lease_until = NULL
             WHERE parent_id = ?2 AND idx = ?3
               AND (state <> 'completed' OR child_id IS NOT ?1)",
        )
        .bind(child)
        .bind(parent)
        .bind(idx)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        tx.commit().await.map_err(Error::db(op))?;
        return Ok(ChildOutcome::Adopted(child));
    }
    // A new child needs a live parent whose batch has no outcome, and a row still to schedule.
    let parent_row: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT status, batch_outcome FROM dockhand_jobs WHERE id = ?")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT state, sidecar FROM dockhand_worklist WHERE parent_id = ? AND idx = ?",
    )
    .bind(parent)
    .bind(idx)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let stopped = match refusal(
        parent,
        idx,
        parent_row.as_ref().map(|p| p.0.as_str()),
        parent_row.as_ref().and_then(|p| p.1.as_deref()),
        row.as_ref().map(|r| r.0.as_str()),
    ) {
        Ok(stopped) => stopped,
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
    };
    let malformed = row
        .as_ref()
        .is_some_and(|r| sidecar_text_is_malformed(&r.1));
    // Every claim the child is to take over must still be the parent's (not taken over after
    // its TTL, not released); the check holds since this is the one writer.
    let held: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM dockhand_item_claims INDEXED BY dockhand_item_claims_token
         WHERE job_id = ? AND status = 'claimed' AND token IN (SELECT value FROM json_each(?))",
    )
    .bind(parent)
    .bind(&tokens)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let discard = if stopped {
        Some((
            DiscardCause::BatchStopped,
            "batch stopped: no new child".to_string(),
        ))
    } else if held < wanted {
        Some((
            DiscardCause::ClaimLost,
            format!(
                "claim lost: {} of {wanted} claims are no longer held by the parent",
                wanted - held
            ),
        ))
    } else {
        None
    };
    if let Some((cause, error)) = discard {
        discard_row(&mut tx, parent, idx, &error, 0, malformed, op).await?;
        tx.commit().await.map_err(Error::db(op))?;
        return Ok(ChildOutcome::Discarded(cause));
    }
    let child: i64 = sqlx::query_scalar(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version, parent_id,
             child_index, created_at, updated_at, item_ref, sidecar)
         SELECT ?1, 'pending', ?2, ?3, '{}', 0, ?4, ?5, ?6, ?6, w.payload_ref, w.sidecar
         FROM dockhand_worklist w WHERE w.parent_id = ?4 AND w.idx = ?5
         RETURNING id",
    )
    .bind(&c.pipeline)
    .bind(c.step_index)
    .bind(refs)
    .bind(parent)
    .bind(idx)
    .bind(ms(now))
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    sqlx::query(
        "UPDATE dockhand_item_claims INDEXED BY dockhand_item_claims_token
         SET job_id = ?1, expires_at = ?4 + COALESCE(ttl_ms, ?5)
         WHERE job_id = ?2 AND status = 'claimed' AND token IN (SELECT value FROM json_each(?3))",
    )
    .bind(child)
    .bind(parent)
    .bind(&tokens)
    .bind(ms(now))
    .bind(c.claim_ttl.num_milliseconds())
    .execute(&mut *tx)
    .await
    .map_err(Error::db("create_child (claims)"))?;
    sqlx::query(
        "UPDATE dockhand_worklist
         SET state = 'completed', child_id = ?, lease_owner = NULL, lease_until = NULL
         WHERE parent_id = ? AND idx = ?",
    )
    .bind(child)
    .bind(parent)
    .bind(idx)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    sqlx::query("UPDATE dockhand_jobs SET children_total = children_total + 1 WHERE id = ?")
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let due = enqueue_due(&mut tx, &c.step.action(child, c.step_index, now), now).await?;
    tx.commit().await.map_err(Error::db(op))?;
    if due {
        store.wake.notify();
    }
    Ok(ChildOutcome::Created(child))
}

pub(super) async fn settle_work(
    store: &SqliteStore,
    parent: i64,
    idx: i32,
    chunk: Lease,
    settle: &RowSettle,
) -> Result<()> {
    let op = "settle_work";
    let mut tx = store.begin_write(op).await?;
    if let Err(e) = run_fence(&mut tx, chunk, op).await {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(e);
    }
    let row: Option<(String, i32, String)> = sqlx::query_as(
        "SELECT state, attempts, sidecar FROM dockhand_worklist WHERE parent_id = ? AND idx = ?",
    )
    .bind(parent)
    .bind(idx)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let Some((state, attempts, sidecar)) = row else {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(no_row(parent, idx));
    };
    if state != "ready" && state != "leased" {
        // Already a child or discarded (another delivery settled it): nothing to do.
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
                 SET state = 'ready', attempts = attempts + 1, error = ?, lease_owner = NULL,
                     lease_until = NULL
                 WHERE parent_id = ? AND idx = ?",
            )
            .bind(error)
            .bind(parent)
            .bind(idx)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?;
            tx.commit().await.map_err(Error::db(op))?;
            return Ok(());
        }
        RowSettle::Retry { error, .. } => (error, 1),
        RowSettle::Discard { reason } => (reason, 0),
    };
    let malformed = sidecar_text_is_malformed(&sidecar);
    discard_row(&mut tx, parent, idx, error, bump, malformed, op).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(())
}
