//! MySQL: batches (B1, B2, B4) — the worklist written by fan-out, the chunk action, rows
//! leased chunk by chunk and turned into child jobs (their sidecar claims handed over), and
//! rows that did not become children settled. The fence, aborts and counters are in `fence`.
//!
//! Lock order (as in `fence`): the parent job row, then worklist rows, then item claims; a
//! child row is only ever created here, never locked. Leases pick rows with `FOR UPDATE SKIP
//! LOCKED` and update them by index, so concurrent chunk deliveries get disjoint rows. Every
//! write is one transaction run inside [`retry_deadlocks`]; actions are enqueued with
//! [`enqueue_one`] inside it and runners are woken after the commit. Claim tokens are matched
//! exactly (`CAST(… AS BINARY)`), never with the trailing-space padding of `=`.

use super::claim::push_in;
use super::connect::retry_deadlocks;
use super::enqueue::{batch_group, enqueue_one};
use super::fence::{
    job_status, lock_parent, release_sidecars, release_unnamed, Rows, TOKENS_PER_STATEMENT,
};
use super::jobs::{inserted_id, text};
use super::lease_fence::{output_fence, run_fence};
use super::{ms, MySqlStore};
use crate::action::PreparedAction;
use crate::batch::{
    chunk_action, chunk_owner, ChildOutcome, ChildSpec, DiscardCause, FanOutOutcome, RowSettle,
    WorkItem, WorkRow,
};
use crate::claims::Descriptor;
use crate::error::{Error, Result};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// Bound parameters per worklist row; statements stay under MySQL's 65,535-parameter limit.
const PARAMS_PER_ROW: usize = 4;
const MAX_PARAMS: usize = 60_000;
/// Payload and sidecar bytes per worklist insert, well under the default `max_allowed_packet`.
const MAX_BYTES: usize = 4 << 20;

fn no_row(parent: i64, idx: i32) -> Error {
    Error::invalid("idx", format!("job {parent} has no worklist row {idx}"))
}

/// Why no child may be created for row `idx`: the parent is missing, or the row is missing or
/// no longer `ready`/`leased` (an error); or the parent is final or its batch has an outcome
/// (`Ok(true)`: the row is discarded instead).
pub(super) fn refusal(
    parent: i64,
    idx: i32,
    parent_row: Option<&super::fence::ParentRow>,
    row: Option<&str>,
) -> Result<bool> {
    let Some(p) = parent_row else {
        return Err(Error::NotFound {
            what: "job",
            id: parent,
        });
    };
    let status = job_status(parent, &p.status)?;
    match row {
        None => Err(no_row(parent, idx)),
        Some("ready" | "leased") => Ok(status.is_final() || p.batch_outcome.is_some()),
        Some(state) => Err(Error::invalid(
            "idx",
            format!("worklist row {idx} of job {parent} is {state}"),
        )),
    }
}

/// Discards row `idx` of `parent` on the open transaction (attempts + `bump`, `error` kept),
/// releasing the parent's claims its sidecar names, or — for a malformed sidecar — by job id.
pub(super) async fn discard_row(
    conn: &mut MySqlConnection,
    parent: i64,
    idx: i32,
    (error, bump): (&str, i32),
    op: &'static str,
) -> Result<()> {
    let malformed = release_sidecars(conn, parent, Rows::Idx(idx), op).await?;
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
        release_unnamed(conn, parent, op).await?;
    }
    Ok(())
}

/// Pushes `token IN (?, …) AND CAST(token AS BINARY) IN (CAST(? AS BINARY), …)` for
/// `tokens`: the first list lets the planner walk the token index (a parent may hold every
/// claim of its batch, and `FOR UPDATE` locks what it walks: walking the parent's claims made
/// each chunk's hand-over wait for the previous chunk's children finishing theirs); the second
/// keeps the match exact (`=` on a binary collation ignores trailing spaces).
pub(super) fn push_token_in<T: AsRef<str>>(qb: &mut QueryBuilder<'_, MySql>, tokens: &[T]) {
    qb.push("token IN (");
    let mut sep = qb.separated(", ");
    for t in tokens {
        sep.push_bind(t.as_ref().to_string());
    }
    qb.push(") AND CAST(token AS BINARY) IN (");
    let mut sep = qb.separated(", ");
    for t in tokens {
        sep.push("CAST(")
            .push_bind_unseparated(t.as_ref().to_string())
            .push_unseparated(" AS BINARY)");
    }
    qb.push(")");
}

/// Enqueues `action` on the open transaction; true when it is due now.
pub(super) async fn enqueue_due(
    conn: &mut MySqlConnection,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<bool> {
    enqueue_one(conn, action, now).await?;
    Ok(action.scheduled_at <= now)
}

/// Splits row indexes into insert statements under the parameter and byte budgets.
fn insert_chunks(items: &[WorkItem], sidecars: &[String]) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for i in 0..items.len() {
        let size = items[i].payload_ref.len() + sidecars[i].len();
        let rows = i - start;
        if rows > 0 && (rows * PARAMS_PER_ROW >= MAX_PARAMS || bytes + size > MAX_BYTES) {
            chunks.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < items.len() {
        chunks.push(start..items.len());
    }
    chunks
}

pub(super) async fn fan_out(
    store: &MySqlStore,
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
    let chunks = insert_chunks(items, &sidecars);
    let (sidecars, chunks) = (&sidecars, &chunks);
    let op = "fan_out";
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let row = sqlx::query("SELECT batch_contract FROM dockhand_jobs WHERE id = ? FOR UPDATE")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
        let Some(row) = row else {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(Error::NotFound {
                what: "job",
                id: parent,
            });
        };
        // The job row first, then the run's action (the bridge's order).
        if let Err(e) = output_fence(&mut tx, fence, op).await {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
        if let Some(existing) = super::jobs::opt_text(&row, "batch_contract")? {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(if existing == contract {
                FanOutOutcome::Adopted
            } else {
                FanOutOutcome::Rejected { existing }
            });
        }
        for range in chunks {
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
                "INSERT INTO dockhand_worklist (parent_id, idx, payload_ref, sidecar) ",
            );
            qb.push_values(range.clone(), |mut b, at| {
                b.push_bind(parent)
                    .push_bind(at as i32)
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
        .bind(total)
        .bind(ms(now))
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(FanOutOutcome::Created)
    })
    .await
}

pub(super) async fn schedule_chunk(
    store: &MySqlStore,
    parent: i64,
    offset: i64,
    priority: i32,
    now: DateTime<Utc>,
) -> Result<()> {
    let op = "schedule_chunk";
    let due = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        let group = batch_group(&mut tx, parent).await?;
        let action = chunk_action(parent, offset, priority, group, now);
        let due = enqueue_due(&mut tx, &action, now).await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(due)
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(())
}

pub(super) async fn lease_work(
    store: &MySqlStore,
    parent: i64,
    limit: i64,
    chunk: Lease,
    lease_until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<WorkRow>> {
    let op = "lease_work";
    let owner = &chunk_owner(chunk.id);
    let rows = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        run_fence(&mut tx, chunk, op).await?;
        if limit <= 0 {
            return Ok(Vec::new());
        }
        let picked: Vec<i32> = sqlx::query_scalar(
            "SELECT idx FROM dockhand_worklist
             WHERE parent_id = ?
               AND (state = 'ready'
                    OR (state = 'leased'
                        AND (lease_until IS NULL OR lease_until <= ? OR lease_owner = ?)))
             ORDER BY idx
             LIMIT ?
             FOR UPDATE SKIP LOCKED",
        )
        .bind(parent)
        .bind(ms(now))
        .bind(owner)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        if picked.is_empty() {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(Vec::new());
        }
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("UPDATE dockhand_worklist SET state = 'leased', lease_owner = ");
        qb.push_bind(owner)
            .push(", lease_until = ")
            .push_bind(ms(lease_until))
            .push(" WHERE parent_id = ")
            .push_bind(parent)
            .push(" AND idx");
        push_in(&mut qb, &picked);
        qb.build().execute(&mut *tx).await.map_err(Error::db(op))?;
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "SELECT parent_id, idx, payload_ref, sidecar, attempts FROM dockhand_worklist
             WHERE parent_id = ",
        );
        qb.push_bind(parent).push(" AND idx");
        push_in(&mut qb, &picked);
        qb.push(" ORDER BY idx");
        let rows = qb
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(op))?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(rows)
    })
    .await?;
    let d = || Error::db("decode worklist row");
    let mut leased = Vec::with_capacity(rows.len());
    for row in rows {
        let sidecar_text = text(&row, "sidecar")?;
        let (sidecar, sidecar_error) = match serde_json::from_str::<Vec<Descriptor>>(&sidecar_text)
        {
            Ok(s) => (s, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        leased.push(WorkRow {
            parent_id: row.try_get("parent_id").map_err(d())?,
            idx: row.try_get("idx").map_err(d())?,
            payload_ref: text(&row, "payload_ref")?,
            sidecar,
            sidecar_error,
            attempts: row.try_get("attempts").map_err(d())?,
        });
    }
    leased.sort_by_key(|r| r.idx);
    Ok(leased)
}

pub(super) async fn create_child(
    store: &MySqlStore,
    c: &ChildSpec,
    chunk: Lease,
    now: DateTime<Utc>,
) -> Result<ChildOutcome> {
    let refs = serde_json::to_string(&c.input_refs)
        .map_err(|e| Error::invalid("input_refs", e.to_string()))?;
    let refs = refs.as_str();
    let op = "create_child";
    let (outcome, due) = retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        match create_child_in(&mut tx, c, chunk, refs, now).await? {
            Ok(done) => {
                tx.commit().await.map_err(Error::db(op))?;
                Ok(done)
            }
            Err(refused) => {
                tx.rollback().await.map_err(Error::db(op))?;
                Err(refused)
            }
        }
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(outcome)
}

/// The body of [`create_child`] on the open transaction; the inner error is a refusal (the
/// caller rolls back), the flag says a due step action was enqueued.
async fn create_child_in(
    conn: &mut MySqlConnection,
    c: &ChildSpec,
    chunk: Lease,
    refs: &str,
    now: DateTime<Utc>,
) -> Result<Result<(ChildOutcome, bool)>> {
    let op = "create_child";
    let (parent, idx) = (c.parent_id, c.idx);
    if let Err(e) = run_fence(conn, chunk, op).await {
        return Ok(Err(e));
    }
    // The parent's lock first (see the lock order above); its status decides below.
    let parent_row = lock_parent(conn, parent, op).await?;
    let existing: Option<i64> =
        sqlx::query_scalar("SELECT id FROM dockhand_jobs WHERE parent_id = ? AND child_index = ?")
            .bind(parent)
            .bind(idx)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db(op))?;
    if let Some(child) = existing {
        sqlx::query(
            "UPDATE dockhand_worklist
             SET state = 'completed', child_id = ?, lease_owner = NULL, lease_until = NULL
             WHERE parent_id = ? AND idx = ? AND NOT (state = 'completed' AND child_id <=> ?)",
        )
        .bind(child)
        .bind(parent)
        .bind(idx)
        .bind(child)
        .execute(&mut *conn)
        .await
        .map_err(Error::db(op))?;
        return Ok(Ok((ChildOutcome::Adopted(child), false)));
    }
    // A new child needs a live parent whose batch has no outcome, and a row still to schedule.
    let row = sqlx::query(
        "SELECT state FROM dockhand_worklist WHERE parent_id = ? AND idx = ? FOR UPDATE",
    )
    .bind(parent)
    .bind(idx)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let state = row.as_ref().map(|r| text(r, "state")).transpose()?;
    let stopped = match refusal(parent, idx, parent_row.as_ref(), state.as_deref()) {
        Ok(stopped) => stopped,
        Err(e) => return Ok(Err(e)),
    };
    // Every claim the child is to take over must still be the parent's; locked, so no
    // takeover can slip in before the handover commits.
    let mut tokens: Vec<&String> = c.claim_tokens.iter().collect();
    tokens.sort_unstable();
    tokens.dedup();
    let mut held = 0usize;
    for chunk in tokens.chunks(TOKENS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("SELECT token FROM dockhand_item_claims WHERE job_id = ");
        qb.push_bind(parent).push(" AND status = 'claimed' AND ");
        push_token_in(&mut qb, chunk);
        qb.push(" FOR UPDATE");
        held += qb
            .build()
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(op))?
            .len();
    }
    let discard = if stopped {
        Some((
            DiscardCause::BatchStopped,
            "batch stopped: no new child".to_string(),
        ))
    } else if held < tokens.len() {
        Some((
            DiscardCause::ClaimLost,
            format!(
                "claim lost: {} of {} claims are no longer held by the parent",
                tokens.len() - held,
                tokens.len()
            ),
        ))
    } else {
        None
    };
    if let Some((cause, error)) = discard {
        discard_row(conn, parent, idx, (&error, 0), op).await?;
        return Ok(Ok((ChildOutcome::Discarded(cause), false)));
    }
    let done = sqlx::query(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version, parent_id,
             child_index, created_at, updated_at, item_ref, sidecar)
         SELECT ?, 'pending', ?, ?, '{}', 0, ?, ?, ?, ?, w.payload_ref, w.sidecar
         FROM dockhand_worklist w WHERE w.parent_id = ? AND w.idx = ?",
    )
    .bind(&c.pipeline)
    .bind(c.step_index)
    .bind(refs)
    .bind(parent)
    .bind(idx)
    .bind(ms(now))
    .bind(ms(now))
    .bind(parent)
    .bind(idx)
    .execute(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let child = inserted_id(done.last_insert_id(), op)?;
    for chunk in tokens.chunks(TOKENS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("UPDATE dockhand_item_claims SET job_id = ");
        qb.push_bind(child)
            .push(", expires_at = ")
            .push_bind(ms(now))
            .push(" + COALESCE(ttl_ms, ")
            .push_bind(c.claim_ttl.num_milliseconds())
            .push(")")
            .push(" WHERE job_id = ")
            .push_bind(parent)
            .push(" AND status = 'claimed' AND ");
        push_token_in(&mut qb, chunk);
        qb.push("");
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db("create_child (claims)"))?;
    }
    sqlx::query(
        "UPDATE dockhand_worklist
         SET state = 'completed', child_id = ?, lease_owner = NULL, lease_until = NULL
         WHERE parent_id = ? AND idx = ?",
    )
    .bind(child)
    .bind(parent)
    .bind(idx)
    .execute(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    sqlx::query("UPDATE dockhand_jobs SET children_total = children_total + 1 WHERE id = ?")
        .bind(parent)
        .execute(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    let due = enqueue_due(conn, &c.step.action(child, c.step_index, now), now).await?;
    Ok(Ok((ChildOutcome::Created(child), due)))
}

pub(super) async fn settle_work(
    store: &MySqlStore,
    parent: i64,
    idx: i32,
    chunk: Lease,
    settle: &RowSettle,
) -> Result<()> {
    let op = "settle_work";
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        run_fence(&mut tx, chunk, op).await?;
        let row = sqlx::query(
            "SELECT state, attempts FROM dockhand_worklist WHERE parent_id = ? AND idx = ?
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
        let state = text(&row, "state")?;
        let attempts: i32 = row.try_get("attempts").map_err(Error::db(op))?;
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
        discard_row(&mut tx, parent, idx, (error, bump), "settle_work (discard)").await?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(())
    })
    .await
}
