//! PostgreSQL: batches (B1, B2) — the worklist a parent fans out into, the chunk action and its
//! row leases, and child creation; the end of scheduling (settle, fence, abort, state, cleanup)
//! is in the `end` submodule.
//!
//! Lock order in every batch transaction: the parent job row, then worklist rows, then item
//! claims (the terminal bridge locks a child and its own claims before bumping the parent's
//! counters; it never touches the parent's worklist or claims, so no cycle forms). Leases pick
//! rows with `FOR UPDATE SKIP LOCKED`, so concurrent chunk deliveries get disjoint rows.
//! Discarding rows and releasing their sidecar claims is one statement (a data-modifying CTE),
//! so the two never drift apart; a malformed sidecar (not an array of descriptors) names no
//! token, so its row's claims are released by job id ([`RELEASE_UNNAMED`]).

mod end;

pub(super) use end::{
    abort_batch, batch_head, batch_state, cleanup_worklist, failed_children, fence_batch,
    settle_work, worklist_pending,
};

use super::enqueue::{batch_group, enqueue_one};
use super::lease_fence::{output_fence, run_fence};
use super::{ts, PgStore};
use crate::batch::{
    chunk_action, chunk_owner, sidecar_is_malformed, ChildOutcome, ChildSpec, DiscardCause,
    FanOutOutcome, WorkItem, WorkRow,
};
use crate::claims::Descriptor;
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, Row, Transaction};

/// Deletes the parent's (`$1`) still-`claimed` claims whose tokens appear in the sidecars the
/// CTE `d` returns; appended to a `WITH d AS (UPDATE dockhand_worklist … RETURNING sidecar)`.
/// A sidecar that is not an array releases nothing (elements without a token neither).
const RELEASE_SIDECARS: &str = " DELETE FROM dockhand_item_claims
 WHERE job_id = $1 AND status = 'claimed' AND token IN (
    SELECT e ->> 'token' FROM d, jsonb_array_elements(
        CASE WHEN jsonb_typeof(d.sidecar) = 'array' THEN d.sidecar ELSE '[]'::jsonb END) AS e)";

/// Deletes the claims parent `$1` still holds that the sidecar of no `ready`/`leased` row of
/// its worklist names: how a row with a malformed sidecar is released (by job id; see
/// [`crate::Store::settle_work`]). Run after the row left `ready`/`leased`.
pub(super) const RELEASE_UNNAMED: &str = "DELETE FROM dockhand_item_claims
 WHERE job_id = $1 AND status = 'claimed' AND token NOT IN (
    SELECT e ->> 'token' FROM dockhand_worklist w, jsonb_array_elements(
        CASE WHEN jsonb_typeof(w.sidecar) = 'array' THEN w.sidecar ELSE '[]'::jsonb END) AS e
    WHERE w.parent_id = $1 AND w.state IN ('ready', 'leased') AND e ->> 'token' IS NOT NULL)";

/// Discards row `idx` of `parent` (attempts + `bump`, `error` kept) and releases the parent's
/// claims its sidecar names, or — for a malformed sidecar — by job id.
pub(super) async fn discard_row(
    conn: &mut PgConnection,
    parent: i64,
    idx: i32,
    (error, bump): (&str, i32),
    op: &'static str,
) -> Result<()> {
    let sidecar: Option<Json<Value>> = sqlx::query_scalar(&format!(
        "WITH d AS (
            UPDATE dockhand_worklist
            SET state = 'discarded', attempts = attempts + $3, error = $4,
                lease_owner = NULL, lease_until = NULL
            WHERE parent_id = $1 AND idx = $2
            RETURNING sidecar),
         r AS ({RELEASE_SIDECARS} RETURNING 1)
         SELECT sidecar FROM d"
    ))
    .bind(parent)
    .bind(idx)
    .bind(bump)
    .bind(error)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    if sidecar.is_some_and(|Json(v)| sidecar_is_malformed(&v)) {
        sqlx::query(RELEASE_UNNAMED)
            .bind(parent)
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
    }
    Ok(())
}

pub(super) fn parse_status(id: i64, s: &str) -> Result<JobStatus> {
    s.parse::<JobStatus>().map_err(|e| Error::Corrupt {
        what: "job",
        id,
        message: e.to_string(),
    })
}

fn not_a_batch(parent: i64) -> Error {
    Error::invalid("job", format!("job {parent} is not a batch parent"))
}

/// Locks the parent row; returns its status and `batch_state`, or `NotFound`.
async fn lock_parent(
    conn: &mut PgConnection,
    parent: i64,
    op: &'static str,
) -> Result<(JobStatus, Option<String>)> {
    let row = sqlx::query("SELECT status, batch_state FROM dockhand_jobs WHERE id = $1 FOR UPDATE")
        .bind(parent)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    let Some(row) = row else {
        return Err(Error::NotFound {
            what: "job",
            id: parent,
        });
    };
    let status: String = row.try_get("status").map_err(Error::db(op))?;
    let state: Option<String> = row.try_get("batch_state").map_err(Error::db(op))?;
    Ok((parse_status(parent, &status)?, state))
}

/// Writes the worklist and batch fields; see [`crate::Store::fan_out`].
pub(super) async fn fan_out(
    store: &PgStore,
    parent: i64,
    fence: Option<Lease>,
    items: &[WorkItem],
    (chunk_size, child_step): (i32, i32),
    contract: &str,
    now: DateTime<Utc>,
) -> Result<FanOutOutcome> {
    let op = "fan_out";
    if items.is_empty() {
        return Err(Error::invalid(
            "packets",
            format!("job {parent}: a batch needs at least one packet"),
        ));
    }
    if chunk_size < 1 {
        return Err(Error::invalid(
            "chunk_size",
            format!("{chunk_size}: must be at least 1"),
        ));
    }
    let total = i32::try_from(items.len()).map_err(|_| {
        Error::invalid(
            "packets",
            format!(
                "job {parent}: {} packets are too many for one batch",
                items.len()
            ),
        )
    })?;
    let sidecars = items
        .iter()
        .map(|i| serde_json::to_string(&i.sidecar))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid("packets", format!("job {parent}: sidecar: {e}")))?;
    let mut tx = store.begin(op).await?;
    let stored: Option<Option<String>> =
        sqlx::query_scalar("SELECT batch_contract FROM dockhand_jobs WHERE id = $1 FOR UPDATE")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
    let Some(stored) = stored else {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(Error::NotFound {
            what: "job",
            id: parent,
        });
    };
    // The job row first, then the run's action (the bridge's order).
    output_fence(&mut tx, fence, op).await?;
    if let Some(existing) = stored {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(if existing == contract {
            FanOutOutcome::Adopted
        } else {
            FanOutOutcome::Rejected { existing }
        });
    }
    let idx: Vec<i32> = (0..total).collect();
    let refs: Vec<&str> = items.iter().map(|i| i.payload_ref.as_str()).collect();
    sqlx::query(
        "INSERT INTO dockhand_worklist (parent_id, idx, payload_ref, sidecar)
         SELECT $1, t.idx, t.payload_ref, t.sidecar::jsonb
         FROM UNNEST($2::int4[], $3::text[], $4::text[]) AS t(idx, payload_ref, sidecar)",
    )
    .bind(parent)
    .bind(idx)
    .bind(refs)
    .bind(sidecars)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("fan_out (worklist)"))?;
    sqlx::query(
        "UPDATE dockhand_jobs SET batch_state = 'scheduling', batch_contract = $2,
            chunk_size = $3, child_step = $4, items_total = $5, updated_at = $6
         WHERE id = $1",
    )
    .bind(parent)
    .bind(contract)
    .bind(chunk_size)
    .bind(child_step)
    .bind(total)
    .bind(ts(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(FanOutOutcome::Created)
}

/// Enqueues a chunk action; see [`crate::Store::schedule_chunk`].
pub(super) async fn schedule_chunk(
    store: &PgStore,
    parent: i64,
    offset: i64,
    priority: i32,
    now: DateTime<Utc>,
) -> Result<()> {
    let mut tx = store.begin("schedule_chunk").await?;
    let group = batch_group(&mut tx, parent).await?;
    let action = chunk_action(parent, offset, priority, group, now);
    enqueue_one(&mut tx, &action, now, Some(&store.channel)).await?;
    tx.commit().await.map_err(Error::db("schedule_chunk"))?;
    store.wake.notify();
    Ok(())
}

/// Leases ready (or lease-expired) rows in idx order; see [`crate::Store::lease_work`].
pub(super) async fn lease_work(
    store: &PgStore,
    parent: i64,
    limit: i64,
    chunk: Lease,
    lease_until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<WorkRow>> {
    let op = "lease_work";
    let mut tx = store.begin(op).await?;
    run_fence(&mut tx, chunk, op).await?;
    if limit <= 0 {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(
        "UPDATE dockhand_worklist w SET state = 'leased', lease_owner = $3, lease_until = $4
         WHERE w.parent_id = $1
           AND w.idx = ANY(ARRAY(
               SELECT idx FROM dockhand_worklist
               WHERE parent_id = $1
                 AND (state = 'ready'
                      OR (state = 'leased'
                          AND (lease_until IS NULL OR lease_until <= $5 OR lease_owner = $3)))
               ORDER BY idx LIMIT $2
               FOR UPDATE SKIP LOCKED))
         RETURNING w.parent_id, w.idx, w.payload_ref, w.sidecar, w.attempts",
    )
    .bind(parent)
    .bind(limit)
    .bind(chunk_owner(chunk.id))
    .bind(ts(lease_until))
    .bind(ts(now))
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    tx.commit().await.map_err(Error::db(op))?;
    let mut rows = rows.iter().map(work_row).collect::<Result<Vec<_>>>()?;
    rows.sort_by_key(|r| r.idx);
    Ok(rows)
}

fn work_row(row: &PgRow) -> Result<WorkRow> {
    let d = || Error::db("decode worklist row");
    let Json(sidecar): Json<Value> = row.try_get("sidecar").map_err(d())?;
    // An undecodable sidecar is the chunk's to discard (B4), not a store error.
    let (sidecar, sidecar_error) = match serde_json::from_value::<Vec<Descriptor>>(sidecar) {
        Ok(s) => (s, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(WorkRow {
        parent_id: row.try_get("parent_id").map_err(d())?,
        idx: row.try_get("idx").map_err(d())?,
        payload_ref: row.try_get("payload_ref").map_err(d())?,
        sidecar,
        sidecar_error,
        attempts: row.try_get("attempts").map_err(d())?,
    })
}

/// Creates (or adopts) the child of one row; see [`crate::Store::create_child`].
pub(super) async fn create_child(
    store: &PgStore,
    c: &ChildSpec,
    chunk: Lease,
    now: DateTime<Utc>,
) -> Result<ChildOutcome> {
    let op = "create_child";
    let (parent, idx) = (c.parent_id, c.idx);
    let mut tokens = c.claim_tokens.clone();
    tokens.sort_unstable();
    tokens.dedup();
    let mut tx = store.begin(op).await?;
    run_fence(&mut tx, chunk, op).await?;
    // The parent's lock first (see the lock order above); its status decides below.
    let parent_row: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT status, batch_outcome FROM dockhand_jobs WHERE id = $1 FOR UPDATE")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
    let existing: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM dockhand_jobs WHERE parent_id = $1 AND child_index = $2",
    )
    .bind(parent)
    .bind(idx)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if let Some(child) = existing {
        return adopt(tx, c, child).await;
    }
    // A new child needs a live parent whose batch has no outcome, and a row still to schedule.
    let state: Option<String> = sqlx::query_scalar(
        "SELECT state FROM dockhand_worklist WHERE parent_id = $1 AND idx = $2 FOR UPDATE",
    )
    .bind(parent)
    .bind(idx)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let stopped = match refusal(parent, idx, parent_row.as_ref(), state.as_deref()) {
        Ok(stopped) => stopped,
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
    };
    // Every claim the child is to take over must still be the parent's; locked, so no
    // takeover can slip in before the handover commits.
    let held: Vec<String> = sqlx::query_scalar(
        "SELECT token FROM dockhand_item_claims
         WHERE job_id = $1 AND status = 'claimed' AND token = ANY($2)
         FOR UPDATE",
    )
    .bind(parent)
    .bind(&tokens)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let discard = if stopped {
        Some((
            DiscardCause::BatchStopped,
            "batch stopped: no new child".to_string(),
        ))
    } else if held.len() < tokens.len() {
        Some((
            DiscardCause::ClaimLost,
            format!(
                "claim lost: {} of {} claims are no longer held by the parent",
                tokens.len() - held.len(),
                tokens.len()
            ),
        ))
    } else {
        None
    };
    if let Some((cause, error)) = discard {
        discard_row(&mut tx, parent, idx, (&error, 0), op).await?;
        tx.commit().await.map_err(Error::db(op))?;
        return Ok(ChildOutcome::Discarded(cause));
    }
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version,
             parent_id, child_index, created_at, updated_at, item_ref, sidecar)
         SELECT $1, 'pending', $2, $3, '{}', 0, $4, $5, $6, $6, w.payload_ref, w.sidecar
         FROM dockhand_worklist w WHERE w.parent_id = $4 AND w.idx = $5
         ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
         RETURNING id",
    )
    .bind(&c.pipeline)
    .bind(c.step_index)
    .bind(Json(&c.input_refs))
    .bind(parent)
    .bind(idx)
    .bind(ts(now))
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let Some(child) = inserted else {
        // A racing inserter committed first (the conflict waited for it): adopt its child.
        let child: i64 = sqlx::query_scalar(
            "SELECT id FROM dockhand_jobs WHERE parent_id = $1 AND child_index = $2",
        )
        .bind(parent)
        .bind(idx)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::db("create_child (adopt)"))?;
        return adopt(tx, c, child).await;
    };
    complete_row(&mut tx, c, child).await?;
    sqlx::query(
        "UPDATE dockhand_item_claims
         SET job_id = $2, expires_at = $4 + COALESCE(ttl_ms, $5) * INTERVAL '1 millisecond'
         WHERE job_id = $1 AND status = 'claimed' AND token = ANY($3)",
    )
    .bind(parent)
    .bind(child)
    .bind(&tokens)
    .bind(ts(now))
    .bind(c.claim_ttl.num_milliseconds())
    .execute(&mut *tx)
    .await
    .map_err(Error::db("create_child (claims)"))?;
    sqlx::query("UPDATE dockhand_jobs SET children_total = children_total + 1 WHERE id = $1")
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("create_child (parent)"))?;
    let action = c.step.action(child, c.step_index, now);
    enqueue_one(&mut tx, &action, now, Some(&store.channel)).await?;
    tx.commit().await.map_err(Error::db(op))?;
    store.wake.notify();
    Ok(ChildOutcome::Created(child))
}

/// A duplicate delivery: the child exists; only its row is marked completed.
async fn adopt(
    mut tx: Transaction<'static, Postgres>,
    c: &ChildSpec,
    child: i64,
) -> Result<ChildOutcome> {
    complete_row(&mut tx, c, child).await?;
    tx.commit().await.map_err(Error::db("create_child"))?;
    Ok(ChildOutcome::Adopted(child))
}

/// Why no child may be created for row `idx`: the parent is missing, or the row is missing or
/// no longer `ready`/`leased` (an error); or the parent is final or its batch has an outcome
/// (`Ok(true)`: the row is discarded instead).
pub(super) fn refusal(
    parent: i64,
    idx: i32,
    parent_row: Option<&(String, Option<String>)>,
    row: Option<&str>,
) -> Result<bool> {
    let Some((status, outcome)) = parent_row else {
        return Err(Error::NotFound {
            what: "job",
            id: parent,
        });
    };
    let status = parse_status(parent, status)?;
    match row {
        None => Err(no_row(parent, idx)),
        Some("ready" | "leased") => Ok(status.is_final() || outcome.is_some()),
        Some(state) => Err(Error::invalid(
            "idx",
            format!("worklist row {idx} of job {parent} is {state}"),
        )),
    }
}

fn no_row(parent: i64, idx: i32) -> Error {
    Error::invalid("idx", format!("job {parent} has no worklist row {idx}"))
}

/// Marks the child's worklist row `completed` with its child id, lease cleared.
async fn complete_row(conn: &mut PgConnection, c: &ChildSpec, child: i64) -> Result<()> {
    sqlx::query(
        "UPDATE dockhand_worklist
         SET state = 'completed', child_id = $3, lease_owner = NULL, lease_until = NULL
         WHERE parent_id = $1 AND idx = $2",
    )
    .bind(c.parent_id)
    .bind(c.idx)
    .bind(child)
    .execute(&mut *conn)
    .await
    .map_err(Error::db("create_child (worklist)"))?;
    Ok(())
}
