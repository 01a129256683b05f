//! SQLite: item claims (C2–C6) — claim/takeover/reprocess in one upsert, token-guarded
//! completion with the handler on the same transaction, release, listing — and reading the
//! tracked-items ledger (C8).
//!
//! The unique index is the identity hash; every statement also compares the identity's parts in
//! full, so a (theoretical) hash collision is reported, never merged.

use super::{from_ms, ms, SqliteStore};
use crate::claims::ledger::TrackedItem;
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimStatus, CompleteOutcome, CompletionConfig,
    CompletionContext, CompletionHandler, CompletionTx, Descriptor, Identity, ItemClaim,
};
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};
use std::sync::Arc;

pub(super) const CLAIM_COLUMNS: &str =
    "id, scope, source_type, item_id, status, token, job_id, completion,
    claimed_at, expires_at, processed_at";

/// The parts guard, binding scope, source type and item id after the hash.
const MATCHES: &str = "identity_hash = ? AND scope = ? AND source_type = ? AND item_id = ?";

const CLAIM: &str = "INSERT INTO dockhand_item_claims
    (identity_hash, scope, source_type, item_id, status, token, job_id, completion,
     claimed_at, expires_at)
 VALUES (?1, ?2, ?3, ?4, 'claimed', ?5, ?6, ?7, ?8, ?9)
 ON CONFLICT (identity_hash) DO UPDATE SET
    status = 'claimed',
    token = CASE WHEN status = 'claimed' AND job_id = excluded.job_id THEN token
                 ELSE excluded.token END,
    job_id = excluded.job_id,
    completion = excluded.completion, claimed_at = excluded.claimed_at,
    expires_at = excluded.expires_at, processed_at = NULL
 WHERE scope = excluded.scope AND source_type = excluded.source_type
   AND item_id = excluded.item_id
   AND (status = 'deferred'
        OR (status = 'claimed' AND expires_at <= ?8)
        OR (status = 'claimed' AND job_id = excluded.job_id)
        OR (status = 'processed' AND ?10))
 RETURNING token";

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

/// The error a failed completion handler becomes, naming the item.
pub(super) fn handler_failed(item_id: &str, msg: &str) -> String {
    format!("handler failed for item {item_id}: {msg}")
}

pub(super) async fn claim_item(
    store: &SqliteStore,
    req: &ClaimItemRequest,
    now: DateTime<Utc>,
) -> Result<ClaimOutcome> {
    let identity = &req.identity;
    identity.validate()?;
    let expires = now
        .checked_add_signed(req.ttl)
        .ok_or_else(|| Error::invalid("ttl", format!("{} is out of range", req.ttl)))?;
    let hash = identity.hash();
    let token = uuid::Uuid::new_v4().to_string();
    let mut tx = store.begin_write("claim_item").await?;
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
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("claim_item"))?;
    if let Some(token) = claimed {
        tx.commit().await.map_err(Error::db("claim_item"))?;
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
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("claim_item"))?;
    tx.rollback().await.map_err(Error::db("claim_item"))?;
    let id = match &row {
        Some(r) => r.try_get("id").map_err(Error::db("claim_item"))?,
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
        if let Err(msg) = handler.complete(CompletionTx::Sqlite(&mut tx), &ctx).await {
            tx.rollback().await.map_err(Error::db("complete_claim"))?;
            return Err(Error::invalid(
                "completion",
                handler_failed(&identity.item_id, &msg),
            ));
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
