//! PostgreSQL: item claims (C1–C8) and reading the tracked-items ledger.
//!
//! A claim is taken by one `INSERT … ON CONFLICT (identity_hash) DO UPDATE … WHERE` statement:
//! a concurrent inserter of the same identity waits for the first to commit and then evaluates
//! the `WHERE` on the committed row, so contention yields no row (never a unique-violation
//! error) and is reported as [`ClaimOutcome::HeldByOther`]. A job claiming an item it already
//! holds (a retried step) gets the claim again with the same token and a fresh expiry, as on
//! SQLite. The same statement first locks the owning job's row (and a step run's action row)
//! `FOR SHARE` and writes nothing when the job is final or the run lost its lease, so a claim
//! never commits after the terminal bridge settled its job's claims. Completing and releasing
//! are fenced by identity (hash and parts) + token + status `claimed`; completing runs the
//! handler through `claims::completion::run_in_tx` and re-runs the transaction on a transient
//! handler failure.

use super::{ts, PgStore};
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
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder, Row};
use std::sync::Arc;

/// How often a claim is retried when the conflicting row changed before it could be read back.
const CLAIM_ATTEMPTS: usize = 5;

/// Page size when a filter's limit is 0.
const DEFAULT_LIMIT: i64 = 100;

/// The columns [`claim_from_row`] reads.
pub(super) const COLUMNS: &str = "id, scope, source_type, item_id, status, token, job_id, \
    completion, claimed_at, expires_at, processed_at";

/// Takes a claim in one statement. `run` and `job` lock the step action's and the owning job's
/// rows for share (a bridge finishing the job holds its row `FOR UPDATE` until it commits, so a
/// claim waits for it and then reads the final status); `allowed` says whether the claim may be
/// written; `claimed` is the upsert (C2), which writes nothing when not allowed. The result row
/// reports all three.
const CLAIM: &str = "WITH run AS (
    SELECT 1 FROM dockhand_actions
    WHERE id = $12 AND status = 'running' AND lease_token = $13
    FOR SHARE
), job AS (
    SELECT status, step_index FROM dockhand_jobs WHERE id = $6 FOR SHARE
), allowed AS (
    SELECT ($12::BIGINT IS NULL OR EXISTS (SELECT 1 FROM run))
       AND NOT EXISTS (
           SELECT 1 FROM job
           WHERE status NOT IN ('pending', 'processing', 'waiting')
              OR ($11::INTEGER IS NOT NULL
                  AND (status <> 'processing' OR step_index <> $11::INTEGER))) AS ok
), claimed AS (
    INSERT INTO dockhand_item_claims AS c
        (identity_hash, scope, source_type, item_id, status, token, job_id, completion,
         claimed_at, expires_at, processed_at, ttl_ms, run_step, run_action, run_token)
    SELECT $1, $2, $3, $4, 'claimed', $5, $6, $7, $8, $9, NULL, $14, $11, $12, $13
    FROM allowed WHERE allowed.ok
    ON CONFLICT (identity_hash) DO UPDATE SET
        status = 'claimed',
        token = CASE WHEN c.status = 'claimed' AND c.job_id = excluded.job_id THEN c.token
                     ELSE excluded.token END,
        job_id = excluded.job_id,
        completion = excluded.completion, claimed_at = excluded.claimed_at,
        expires_at = excluded.expires_at, processed_at = NULL, ttl_ms = excluded.ttl_ms,
        run_step = excluded.run_step, run_action = excluded.run_action,
        run_token = excluded.run_token
    WHERE c.scope = excluded.scope AND c.source_type = excluded.source_type
      AND c.item_id = excluded.item_id
      AND (c.status = 'deferred'
           OR (c.status = 'claimed' AND c.expires_at <= $8)
           OR (c.status = 'claimed' AND c.job_id = excluded.job_id)
           OR (c.status = 'processed' AND $10))
    RETURNING token
)
SELECT EXISTS (SELECT 1 FROM run) AS run_live,
       (SELECT status FROM job) AS job_status,
       (SELECT step_index FROM job) AS job_step,
       (SELECT token FROM claimed) AS token";

/// The `WHERE` that names one identity by hash and parts (`$1`–`$4`).
const SAME_IDENTITY: &str =
    "identity_hash = $1 AND scope = $2 AND source_type = $3 AND item_id = $4";

/// Decodes a row selected with [`COLUMNS`].
pub(super) fn claim_from_row(row: &PgRow) -> Result<ItemClaim> {
    let d = || Error::db("decode item claim");
    let id: i64 = row.try_get("id").map_err(d())?;
    let status: String = row.try_get("status").map_err(d())?;
    let completion: Option<Json<Value>> = row.try_get("completion").map_err(d())?;
    Ok(ItemClaim {
        identity: Identity {
            scope: row.try_get("scope").map_err(d())?,
            source_type: row.try_get("source_type").map_err(d())?,
            item_id: row.try_get("item_id").map_err(d())?,
        },
        status: status.parse::<ClaimStatus>().map_err(|e| corrupt(id, e))?,
        token: row.try_get("token").map_err(d())?,
        job_id: row.try_get("job_id").map_err(d())?,
        completion: completion
            .map(|Json(v)| decode_completion(id, v))
            .transpose()?,
        claimed_at: row.try_get("claimed_at").map_err(d())?,
        expires_at: row.try_get("expires_at").map_err(d())?,
        processed_at: row.try_get("processed_at").map_err(d())?,
    })
}

/// A stored completion config, or [`Error::Corrupt`] naming the claim row.
pub(super) fn decode_completion(id: i64, v: Value) -> Result<CompletionConfig> {
    serde_json::from_value(v).map_err(|e| corrupt(id, format!("completion config: {e}")))
}

fn corrupt(id: i64, message: impl ToString) -> Error {
    Error::Corrupt {
        what: "item claim",
        id,
        message: message.to_string(),
    }
}

/// Marks a locked claim row processed (dropping its token, keeping its job) or deletes it.
pub(super) async fn settle(
    conn: &mut PgConnection,
    id: i64,
    retain_processed: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let q = if retain_processed {
        sqlx::query(
            "UPDATE dockhand_item_claims SET status = 'processed', processed_at = $2, token = NULL
             WHERE id = $1",
        )
        .bind(id)
        .bind(ts(now))
    } else {
        sqlx::query("DELETE FROM dockhand_item_claims WHERE id = $1").bind(id)
    };
    q.execute(&mut *conn)
        .await
        .map_err(Error::db("complete claim"))?;
    Ok(())
}

pub(super) async fn claim_item(
    store: &PgStore,
    req: &ClaimItemRequest,
    now: DateTime<Utc>,
) -> Result<ClaimOutcome> {
    req.identity.validate()?;
    let expires = claim_expiry(req, now)?;
    rerun_transaction("postgres", "claim_item", || {
        claim_once(store, req, now, expires)
    })
    .await
}

/// One run of [`claim_item`]: the statement, then (when the row refused it) a read of the row
/// to tell contention from a processed item, again when the row changed in between.
async fn claim_once(
    store: &PgStore,
    req: &ClaimItemRequest,
    now: DateTime<Utc>,
    expires: DateTime<Utc>,
) -> Result<ClaimOutcome> {
    let identity = &req.identity;
    let hash = identity.hash();
    let d = || Error::db("claim_item");
    for _ in 0..CLAIM_ATTEMPTS {
        let token = uuid::Uuid::new_v4().to_string();
        let row = sqlx::query(CLAIM)
            .bind(&hash)
            .bind(&identity.scope)
            .bind(&identity.source_type)
            .bind(&identity.item_id)
            .bind(&token)
            .bind(req.job_id)
            .bind(Json(&req.completion))
            .bind(ts(now))
            .bind(ts(expires))
            .bind(req.reprocess)
            .bind(req.run.map(|r| r.step))
            .bind(req.run.map(|r| r.lease.id))
            .bind(req.run.map(|r| r.lease.token))
            .bind(req.ttl.num_milliseconds())
            .fetch_one(&store.pool)
            .await
            .map_err(d())?;
        if let Some(run) = req.run {
            if !row.try_get::<bool, _>("run_live").map_err(d())? {
                return Err(run.lease.lost());
            }
        }
        let job: Option<String> = row.try_get("job_status").map_err(d())?;
        if let (Some(job_id), Some(status)) = (req.job_id, job) {
            let status = status.parse::<JobStatus>().map_err(|e| Error::Corrupt {
                what: "job",
                id: job_id,
                message: e.to_string(),
            })?;
            let step_index: i32 = row.try_get("job_step").map_err(d())?;
            if let Some(refused) = refusal(req, job_id, status, step_index) {
                return Ok(refused);
            }
        }
        if let Some(token) = row.try_get::<Option<String>, _>("token").map_err(d())? {
            return Ok(ClaimOutcome::Claimed(Descriptor {
                identity: identity.clone(),
                token,
                job_id: req.job_id,
                completion: req.completion.clone(),
            }));
        }
        // The row exists and refused us; READ COMMITTED shows its committed state.
        let row = sqlx::query(
            "SELECT id, scope, source_type, item_id, status FROM dockhand_item_claims
             WHERE identity_hash = $1",
        )
        .bind(&hash)
        .fetch_optional(&store.pool)
        .await
        .map_err(Error::db("claim_item (read)"))?;
        // Deleted in between: the identity is free again, claim anew.
        let Some(row) = row else { continue };
        let d = || Error::db("claim_item (read)");
        let id: i64 = row.try_get("id").map_err(d())?;
        let parts: (String, String, String) = (
            row.try_get("scope").map_err(d())?,
            row.try_get("source_type").map_err(d())?,
            row.try_get("item_id").map_err(d())?,
        );
        if (&parts.0, &parts.1, &parts.2)
            != (&identity.scope, &identity.source_type, &identity.item_id)
        {
            return Err(corrupt(
                id,
                format!("identity hash {hash} is stored for a different identity"),
            ));
        }
        let status: String = row.try_get("status").map_err(d())?;
        match status.parse::<ClaimStatus>().map_err(|e| corrupt(id, e))? {
            ClaimStatus::Claimed => return Ok(ClaimOutcome::HeldByOther),
            ClaimStatus::Processed if !req.reprocess => return Ok(ClaimOutcome::AlreadyProcessed),
            // Completed (reprocess) or released in between: claimable again, claim anew.
            ClaimStatus::Processed | ClaimStatus::Deferred => continue,
        }
    }
    // Every attempt lost to another owner cycling the same item: someone else has it.
    Ok(ClaimOutcome::HeldByOther)
}

pub(super) async fn get_claim(store: &PgStore, identity: &Identity) -> Result<Option<ItemClaim>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM dockhand_item_claims WHERE {SAME_IDENTITY}"
    ))
    .bind(identity.hash())
    .bind(&identity.scope)
    .bind(&identity.source_type)
    .bind(&identity.item_id)
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("get_claim"))?;
    row.as_ref().map(claim_from_row).transpose()
}

pub(super) async fn complete_claim(
    store: &PgStore,
    descriptor: &Descriptor,
    handler: Option<Arc<dyn CompletionHandler>>,
    now: DateTime<Utc>,
) -> Result<CompleteOutcome> {
    let handler = handler.as_deref();
    rerun_transaction("postgres", "complete_claim", || {
        complete_once(store, descriptor, handler, now)
    })
    .await
}

/// One attempt of [`complete_claim`].
async fn complete_once(
    store: &PgStore,
    descriptor: &Descriptor,
    handler: Option<&dyn CompletionHandler>,
    now: DateTime<Utc>,
) -> Result<CompleteOutcome> {
    let identity = &descriptor.identity;
    let mut tx = store.begin("complete_claim").await?;
    let row = sqlx::query(&format!(
        "SELECT id, job_id FROM dockhand_item_claims
         WHERE {SAME_IDENTITY} AND token = $5 AND status = 'claimed' FOR UPDATE"
    ))
    .bind(identity.hash())
    .bind(&identity.scope)
    .bind(&identity.source_type)
    .bind(&identity.item_id)
    .bind(&descriptor.token)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("complete_claim"))?;
    let Some(row) = row else {
        tx.rollback().await.map_err(Error::db("complete_claim"))?;
        return Ok(CompleteOutcome::Lost);
    };
    let id: i64 = row.try_get("id").map_err(Error::db("complete_claim"))?;
    if let Some(handler) = handler {
        let ctx = CompletionContext {
            identity: identity.clone(),
            token: descriptor.token.clone(),
            job_id: row.try_get("job_id").map_err(Error::db("complete_claim"))?,
            payload: descriptor.completion.payload.clone(),
            now,
        };
        match run_in_tx(handler, CompletionTx::Postgres(&mut tx), &ctx).await {
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
    store: &PgStore,
    descriptor: &Descriptor,
    defer: bool,
) -> Result<bool> {
    let identity = &descriptor.identity;
    let sql = if defer {
        format!(
            "UPDATE dockhand_item_claims
             SET status = 'deferred', token = NULL, job_id = NULL, expires_at = NULL
             WHERE {SAME_IDENTITY} AND token = $5 AND status = 'claimed'"
        )
    } else {
        format!(
            "DELETE FROM dockhand_item_claims
             WHERE {SAME_IDENTITY} AND token = $5 AND status = 'claimed'"
        )
    };
    let done = sqlx::query(&sql)
        .bind(identity.hash())
        .bind(&identity.scope)
        .bind(&identity.source_type)
        .bind(&identity.item_id)
        .bind(&descriptor.token)
        .execute(&store.pool)
        .await
        .map_err(Error::db("release_claim"))?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn list_claims(store: &PgStore, f: &ClaimFilter) -> Result<Vec<ItemClaim>> {
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT {COLUMNS} FROM dockhand_item_claims WHERE TRUE"
    ));
    if let Some(scope) = &f.scope {
        qb.push(" AND scope = ").push_bind(scope.clone());
    }
    if let Some(job) = f.job_id {
        qb.push(" AND job_id = ").push_bind(job);
    }
    if let Some(status) = f.status {
        qb.push(" AND status = ").push_bind(status.as_str());
    }
    let limit = if f.limit <= 0 { DEFAULT_LIMIT } else { f.limit };
    qb.push(" ORDER BY id LIMIT ").push_bind(limit);
    let rows = qb
        .build()
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("list_claims"))?;
    rows.iter().map(claim_from_row).collect()
}

pub(super) async fn tracked_item(
    store: &PgStore,
    namespace: &str,
    item_id: &str,
) -> Result<Option<TrackedItem>> {
    let row = sqlx::query(
        "SELECT namespace, item_id, revision, last_job, updated_at FROM dockhand_tracked_items
         WHERE namespace = $1 AND item_id = $2",
    )
    .bind(namespace)
    .bind(item_id)
    .fetch_optional(&store.pool)
    .await
    .map_err(Error::db("tracked_item"))?;
    let Some(r) = row else { return Ok(None) };
    let d = || Error::db("tracked_item");
    Ok(Some(TrackedItem {
        namespace: r.try_get("namespace").map_err(d())?,
        item_id: r.try_get("item_id").map_err(d())?,
        revision: r.try_get("revision").map_err(d())?,
        last_job: r.try_get("last_job").map_err(d())?,
        updated_at: r.try_get("updated_at").map_err(d())?,
    }))
}
