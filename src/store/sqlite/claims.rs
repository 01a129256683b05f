//! SQLite: item claims (C2–C6) — claim/takeover/reprocess in one upsert, token-guarded
//! completion with the handler on the same transaction, release, listing — and reading the
//! tracked-items ledger (C8).
//!
//! The unique index is the identity hash; every statement also compares the identity's parts in
//! full, so a (theoretical) hash collision is reported, never merged. A claim reads its job
//! (and a step run's action) under the same `BEGIN IMMEDIATE` as the upsert and writes nothing
//! when the job is final or the run lost its lease; completing re-runs the transaction on a
//! handler's transient failure.

use super::lease_fence::run_fence;
use super::{from_ms, ms, SqliteStore};
use crate::claims::completion::run_in_tx;
use crate::claims::ledger::TrackedItem;
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimStatus, CompleteOutcome, CompletionConfig,
    CompletionContext, CompletionHandler, CompletionTx, Descriptor, Identity, ItemClaim,
};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::claim_rules::{claim_expiry, refusal};
use crate::store::rerun::rerun_transaction;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};
use std::sync::Arc;

pub(super) const CLAIM_COLUMNS: &str =
    "id, scope, source_type, item_id, status, token, job_id, completion,
    claimed_at, expires_at, processed_at";

/// The parts guard, binding scope, source type and item id after the hash.
const MATCHES: &str = "identity_hash = ? AND scope = ? AND source_type = ? AND item_id = ?";

/// The take-over rule of an item claim (C2) as the `ON CONFLICT` clause of an insert into
/// `dockhand_item_claims`, for `CLAIM` and `claim_many`'s set form: a row is taken when it is
/// deferred, expired at `$now`, already this job's (its token kept), or processed and
/// `$reprocess` holds; the parts must match the hash. `$now` and `$reprocess` are the
/// placeholders each statement binds them to.
macro_rules! claim_take_over {
    ($now:literal, $reprocess:literal) => {
        concat!(
            " ON CONFLICT (identity_hash) DO UPDATE SET
    status = 'claimed',
    token = CASE WHEN status = 'claimed' AND job_id = excluded.job_id THEN token
                 ELSE excluded.token END,
    job_id = excluded.job_id,
    completion = excluded.completion, claimed_at = excluded.claimed_at,
    expires_at = excluded.expires_at, processed_at = NULL, ttl_ms = excluded.ttl_ms,
    run_step = excluded.run_step, run_action = excluded.run_action,
    run_token = excluded.run_token
 WHERE scope = excluded.scope AND source_type = excluded.source_type
   AND item_id = excluded.item_id
   AND (status = 'deferred'
        OR (status = 'claimed' AND expires_at <= ",
            $now,
            ")
        OR (status = 'claimed' AND job_id = excluded.job_id)
        OR (status = 'processed' AND ",
            $reprocess,
            "))"
        )
    };
}
pub(super) use claim_take_over;

const CLAIM: &str = concat!(
    "INSERT INTO dockhand_item_claims
    (identity_hash, scope, source_type, item_id, status, token, job_id, completion,
     claimed_at, expires_at, ttl_ms, run_step, run_action, run_token)
 VALUES (?1, ?2, ?3, ?4, 'claimed', ?5, ?6, ?7, ?8, ?9, ?11, ?12, ?13, ?14)
",
    claim_take_over!("?8", "?10"),
    " RETURNING token"
);

/// Encodes a completion config for the `completion` column.
pub(super) fn config_json(config: &CompletionConfig) -> Result<String> {
    serde_json::to_string(config).map_err(|e| Error::invalid("completion", e.to_string()))
}

/// Decodes a `completion` column (NULL: the default config).
pub(super) fn config_from(id: i64, text: Option<&str>) -> Result<CompletionConfig> {
    match text {
        None => Ok(CompletionConfig::default()),
        Some(t) => serde_json::from_str(t).map_err(|e| Error::Corrupt {
            what: "item claim",
            id,
            message: format!("completion: {e}"),
        }),
    }
}

pub(super) fn claim_from_row(row: &SqliteRow) -> Result<ItemClaim> {
    let d = || Error::db("decode item claim");
    let id: i64 = row.try_get("id").map_err(d())?;
    let status: String = row.try_get("status").map_err(d())?;
    let completion: Option<String> = row.try_get("completion").map_err(d())?;
    let time = |c: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row.try_get::<Option<i64>, _>(c).map_err(d())?.map(from_ms))
    };
    Ok(ItemClaim {
        identity: Identity {
            scope: row.try_get("scope").map_err(d())?,
            source_type: row.try_get("source_type").map_err(d())?,
            item_id: row.try_get("item_id").map_err(d())?,
        },
        status: status.parse::<ClaimStatus>().map_err(|e| Error::Corrupt {
            what: "item claim",
            id,
            message: e.to_string(),
        })?,
        token: row.try_get("token").map_err(d())?,
        job_id: row.try_get("job_id").map_err(d())?,
        completion: completion
            .as_deref()
            .map(|t| config_from(id, Some(t)))
            .transpose()?,
        claimed_at: time("claimed_at")?,
        expires_at: time("expires_at")?,
        processed_at: time("processed_at")?,
    })
}

/// Completes (`retain`: marks processed, keeping `job_id`) or deletes claim row `id` on the
/// open transaction.
pub(super) async fn settle(
    conn: &mut SqliteConnection,
    id: i64,
    retain: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let q = if retain {
        sqlx::query(
            "UPDATE dockhand_item_claims SET status = 'processed', processed_at = ?, token = NULL
             WHERE id = ?",
        )
        .bind(ms(now))
    } else {
        sqlx::query("DELETE FROM dockhand_item_claims WHERE id = ?")
    };
    q.bind(id)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("complete claim"))?;
    Ok(())
}

pub(super) async fn claim_item(
    store: &SqliteStore,
    req: &ClaimItemRequest,
    now: DateTime<Utc>,
) -> Result<ClaimOutcome> {
    let op = "claim_item";
    req.identity.validate()?;
    let expires = claim_expiry(req, now)?;
    // `BEGIN IMMEDIATE`: the bridge and the reaper are writers too, so the job and the run
    // read here cannot change before this commits.
    let mut tx = store.begin_write(op).await?;
    if let Some(run) = req.run {
        if let Err(lost) = run_fence(&mut tx, run.lease, op).await {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(lost);
        }
    }
    if let Some(job_id) = req.job_id {
        if let Some(refused) = job_refusal(&mut tx, req, job_id).await? {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(refused);
        }
    }
    let outcome = claim_on(&mut tx, req, expires, now, op).await;
    if let Ok(ClaimOutcome::Claimed(_)) = outcome {
        tx.commit().await.map_err(Error::db(op))?;
    } else {
        tx.rollback().await.map_err(Error::db(op))?;
    }
    outcome
}

/// The upsert of one claim on the open write transaction (the job and run already checked),
/// and, when the row refused it, the reason read back; nothing is written then.
pub(super) async fn claim_on(
    conn: &mut SqliteConnection,
    req: &ClaimItemRequest,
    expires: DateTime<Utc>,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<ClaimOutcome> {
    let identity = &req.identity;
    let hash = identity.hash();
    let token = uuid::Uuid::new_v4().to_string();
    let claimed: Option<String> = sqlx::query_scalar(CLAIM)
        .bind(&hash)
        .bind(&identity.scope)
        .bind(&identity.source_type)
        .bind(&identity.item_id)
        .bind(&token)
        .bind(req.job_id)
        .bind(config_json(&req.completion)?)
        .bind(ms(now))
        .bind(ms(expires))
        .bind(req.reprocess)
        .bind(req.ttl.num_milliseconds())
        .bind(req.run.map(|r| r.step))
        .bind(req.run.map(|r| r.lease.id))
        .bind(req.run.map(|r| r.lease.token))
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    if let Some(token) = claimed {
        return Ok(ClaimOutcome::Claimed(Descriptor {
            identity: identity.clone(),
            token,
            job_id: req.job_id,
            completion: req.completion.clone(),
        }));
    }
    // Not taken: the row exists and is held, processed, or another identity's (collision).
    let row = sqlx::query(&format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE identity_hash = ?"
    ))
    .bind(&hash)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let id = match &row {
        Some(r) => r.try_get("id").map_err(Error::db(op))?,
        None => 0,
    };
    let corrupt = |message: String| Error::Corrupt {
        what: "item claim",
        id,
        message,
    };
    let Some(row) = row else {
        return Err(corrupt(format!(
            "identity {hash}: upsert took no row and none exists"
        )));
    };
    let existing = claim_from_row(&row)?;
    if existing.identity != *identity {
        return Err(corrupt(format!(
            "identity hash {hash} collides: stored parts differ from the requested identity"
        )));
    }
    match existing.status {
        ClaimStatus::Processed => Ok(ClaimOutcome::AlreadyProcessed),
        ClaimStatus::Claimed => Ok(ClaimOutcome::HeldByOther),
        ClaimStatus::Deferred => Err(corrupt(format!(
            "identity {hash}: deferred row was not claimable"
        ))),
    }
}

pub(super) async fn get_claim(
    store: &SqliteStore,
    identity: &Identity,
) -> Result<Option<ItemClaim>> {
    let row = sqlx::query(&format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE {MATCHES}"
    ))
    .bind(identity.hash())
    .bind(&identity.scope)
    .bind(&identity.source_type)
    .bind(&identity.item_id)
    .fetch_optional(&store.reader)
    .await
    .map_err(Error::db("get_claim"))?;
    row.as_ref().map(claim_from_row).transpose()
}

pub(super) async fn complete_claim(
    store: &SqliteStore,
    descriptor: &Descriptor,
    handler: Option<Arc<dyn CompletionHandler>>,
    now: DateTime<Utc>,
) -> Result<CompleteOutcome> {
    let handler = handler.as_deref();
    rerun_transaction("sqlite", "complete_claim", || {
        complete_once(store, descriptor, handler, now)
    })
    .await
}

/// One attempt of [`complete_claim`].
async fn complete_once(
    store: &SqliteStore,
    descriptor: &Descriptor,
    handler: Option<&dyn CompletionHandler>,
    now: DateTime<Utc>,
) -> Result<CompleteOutcome> {
    let identity = &descriptor.identity;
    let mut tx = store.begin_write("complete_claim").await?;
    let held: Option<(i64, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT id, job_id FROM dockhand_item_claims
         WHERE {MATCHES} AND token = ? AND status = 'claimed'"
    ))
    .bind(identity.hash())
    .bind(&identity.scope)
    .bind(&identity.source_type)
    .bind(&identity.item_id)
    .bind(&descriptor.token)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("complete_claim"))?;
    let Some((id, job_id)) = held else {
        tx.rollback().await.map_err(Error::db("complete_claim"))?;
        return Ok(CompleteOutcome::Lost);
    };
    if let Some(handler) = handler {
        let ctx = CompletionContext {
            identity: identity.clone(),
            token: descriptor.token.clone(),
            job_id,
            payload: descriptor.completion.payload.clone(),
            now,
        };
        match run_in_tx(handler, CompletionTx::Sqlite(&mut tx), &ctx).await {
            Ok(Ok(())) => {}
            Ok(Err(failed)) => {
                tx.rollback().await.map_err(Error::db("complete_claim"))?;
                return Err(Error::invalid("completion", failed));
            }
            Err(transient) => {
                // Rolled back whole (dropping the transaction rolls back if this fails too).
                let _ = tx.rollback().await;
                return Err(transient);
            }
        }
    }
    settle(&mut tx, id, descriptor.completion.retain_processed, now).await?;
    tx.commit().await.map_err(Error::db("complete_claim"))?;
    Ok(CompleteOutcome::Completed)
}

pub(super) async fn release_claim(
    store: &SqliteStore,
    descriptor: &Descriptor,
    defer: bool,
) -> Result<bool> {
    let identity = &descriptor.identity;
    let sql = if defer {
        format!(
            "UPDATE dockhand_item_claims
             SET status = 'deferred', token = NULL, job_id = NULL, expires_at = NULL
             WHERE {MATCHES} AND token = ? AND status = 'claimed'"
        )
    } else {
        format!(
            "DELETE FROM dockhand_item_claims
             WHERE {MATCHES} AND token = ? AND status = 'claimed'"
        )
    };
    let mut tx = store.begin_write("release_claim").await?;
    let done = sqlx::query(&sql)
        .bind(identity.hash())
        .bind(&identity.scope)
        .bind(&identity.source_type)
        .bind(&identity.item_id)
        .bind(&descriptor.token)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("release_claim"))?;
    tx.commit().await.map_err(Error::db("release_claim"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn list_claims(store: &SqliteStore, f: &ClaimFilter) -> Result<Vec<ItemClaim>> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE 1 = 1"
    ));
    if let Some(s) = &f.scope {
        qb.push(" AND scope = ").push_bind(s.clone());
    }
    if let Some(j) = f.job_id {
        qb.push(" AND job_id = ").push_bind(j);
    }
    if let Some(s) = f.status {
        qb.push(" AND status = ").push_bind(s.as_str());
    }
    let limit = if f.limit <= 0 { 100 } else { f.limit };
    qb.push(" ORDER BY id LIMIT ").push_bind(limit);
    let rows = qb
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("list_claims"))?;
    rows.iter().map(claim_from_row).collect()
}

pub(super) async fn tracked_item(
    store: &SqliteStore,
    namespace: &str,
    item_id: &str,
) -> Result<Option<TrackedItem>> {
    let row: Option<(String, String, i64, Option<i64>, i64)> = sqlx::query_as(
        "SELECT namespace, item_id, revision, last_job, updated_at
         FROM dockhand_tracked_items WHERE namespace = ? AND item_id = ?",
    )
    .bind(namespace)
    .bind(item_id)
    .fetch_optional(&store.reader)
    .await
    .map_err(Error::db("tracked_item"))?;
    Ok(row.map(
        |(namespace, item_id, revision, last_job, updated_at)| TrackedItem {
            namespace,
            item_id,
            revision,
            last_job,
            updated_at: from_ms(updated_at),
        },
    ))
}

/// The owning job's refusal of a claim ([`refusal`]), read on the claim's transaction; a job
/// id with no row is a free-standing owner and refuses nothing.
async fn job_refusal(
    conn: &mut SqliteConnection,
    req: &ClaimItemRequest,
    job_id: i64,
) -> Result<Option<ClaimOutcome>> {
    Ok(job_state(conn, job_id)
        .await?
        .and_then(|(status, step_index)| refusal(req, job_id, status, step_index)))
}

/// A claim's owning job's status and step, read on the claim's transaction (`None`: no row).
pub(super) async fn job_state(
    conn: &mut SqliteConnection,
    job_id: i64,
) -> Result<Option<(JobStatus, i32)>> {
    let row: Option<(String, i32)> =
        sqlx::query_as("SELECT status, step_index FROM dockhand_jobs WHERE id = ?")
            .bind(job_id)
            .fetch_optional(conn)
            .await
            .map_err(Error::db("claim_item (job)"))?;
    let Some((status, step_index)) = row else {
        return Ok(None);
    };
    let status = status.parse::<JobStatus>().map_err(|e| Error::Corrupt {
        what: "job",
        id: job_id,
        message: e.to_string(),
    })?;
    Ok(Some((status, step_index)))
}
