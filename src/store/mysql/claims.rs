//! MySQL: item claims (C2–C6) — claim, takeover and reprocess on the locked row,
//! token-guarded completion with the handler on the same transaction, release, listing — and
//! reading the tracked-items ledger (C8).
//!
//! A claim runs `INSERT … ON DUPLICATE KEY UPDATE id = id` on the identity hash: it inserts the
//! row, or (on a duplicate) takes an exclusive lock on the existing one without changing it, so
//! 16–64 tasks racing for one item queue on that row lock and never see a duplicate-key error.
//! The row is then read back under the lock and the takeover rules of the SQLite upsert are
//! applied in Rust; a takeover is an `UPDATE` by id in the same transaction. Before that, the
//! step action's row (a step run's claim) and the owning job's row are locked in share mode
//! and checked (the run still holds its lease; the job is live), so a claim can never commit
//! after the terminal bridge settled its job's claims.
//!
//! The unique index is the identity hash (which distinguishes identities exactly); statements
//! also compare the identity's parts, and the parts read back are compared in Rust, so a
//! (theoretical) hash collision is reported, never merged. Binary collations pad trailing spaces
//! for `=`, so tokens and the scope filter compare as `CAST(… AS BINARY)`.

use super::connect::retry_deadlocks;
use super::jobs::{opt_text, text};
use super::lease_fence::run_fence;
use super::{from_ms, ms, MySqlStore};
use crate::claims::completion::run_in_tx;
use crate::claims::ledger::TrackedItem;
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimStatus, CompleteOutcome, CompletionConfig,
    CompletionContext, CompletionHandler, CompletionTx, Descriptor, Identity, ItemClaim,
};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::claim_rules::{claim_expiry, refusal};
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use std::sync::Arc;

pub(super) const CLAIM_COLUMNS: &str =
    "id, scope, source_type, item_id, status, token, job_id, completion,
    claimed_at, expires_at, processed_at";

/// The parts guard, binding scope, source type and item id after the hash.
const MATCHES: &str = "identity_hash = ? AND scope = ? AND source_type = ? AND item_id = ?";

/// The token guard (exact: no trailing-space padding), binding the token.
const TOKEN_IS: &str = "CAST(token AS BINARY) = CAST(? AS BINARY)";

/// Inserts a fresh claim, or locks the existing row of that identity unchanged.
const INSERT_OR_LOCK: &str = "INSERT INTO dockhand_item_claims
    (identity_hash, scope, source_type, item_id, status, token, job_id, completion,
     claimed_at, expires_at, ttl_ms, run_step, run_action, run_token)
 VALUES (?, ?, ?, ?, 'claimed', ?, ?, ?, ?, ?, ?, ?, ?, ?)
 ON DUPLICATE KEY UPDATE id = id";

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

pub(super) fn claim_from_row(row: &MySqlRow) -> Result<ItemClaim> {
    let d = || Error::db("decode item claim");
    let id: i64 = row.try_get("id").map_err(d())?;
    let status = text(row, "status")?;
    let completion = opt_text(row, "completion")?;
    let time = |c: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row.try_get::<Option<i64>, _>(c).map_err(d())?.map(from_ms))
    };
    Ok(ItemClaim {
        identity: Identity {
            scope: text(row, "scope")?,
            source_type: text(row, "source_type")?,
            item_id: text(row, "item_id")?,
        },
        status: status.parse::<ClaimStatus>().map_err(|e| Error::Corrupt {
            what: "item claim",
            id,
            message: e.to_string(),
        })?,
        token: opt_text(row, "token")?,
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
/// open transaction (the row is locked by the caller).
pub(super) async fn settle(
    conn: &mut MySqlConnection,
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
    store: &MySqlStore,
    req: &ClaimItemRequest,
    now: DateTime<Utc>,
) -> Result<ClaimOutcome> {
    req.identity.validate()?;
    let expires = claim_expiry(req, now)?;
    let hash = req.identity.hash();
    let config = config_json(&req.completion)?;
    let (hash, config) = (hash.as_str(), config.as_str());
    retry_deadlocks("claim_item", move || {
        claim_once(store, req, hash, config, now, expires)
    })
    .await
}

/// One attempt of [`claim_item`]: insert or lock, read back, decide, take over.
async fn claim_once(
    store: &MySqlStore,
    req: &ClaimItemRequest,
    hash: &str,
    config: &str,
    now: DateTime<Utc>,
    expires: DateTime<Utc>,
) -> Result<ClaimOutcome> {
    let op = "claim_item";
    let identity = &req.identity;
    let token = uuid::Uuid::new_v4().to_string();
    let mut tx = store.begin(op).await?;
    // Lock order as everywhere: the action row, then the job row, then claim rows.
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
    sqlx::query(INSERT_OR_LOCK)
        .bind(hash)
        .bind(&identity.scope)
        .bind(&identity.source_type)
        .bind(&identity.item_id)
        .bind(&token)
        .bind(req.job_id)
        .bind(config)
        .bind(ms(now))
        .bind(ms(expires))
        .bind(req.ttl.num_milliseconds())
        .bind(req.run.map(|r| r.step))
        .bind(req.run.map(|r| r.lease.id))
        .bind(req.run.map(|r| r.lease.token))
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let row = sqlx::query(&format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE identity_hash = ? FOR UPDATE"
    ))
    .bind(hash)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let corrupt = |id: i64, message: String| Error::Corrupt {
        what: "item claim",
        id,
        message,
    };
    let Some(row) = row else {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(corrupt(
            0,
            format!("identity {hash}: the insert left no row to read back"),
        ));
    };
    let id: i64 = row.try_get("id").map_err(Error::db(op))?;
    let existing = claim_from_row(&row)?;
    let Takeover { fresh, same_job } = match takeover(id, hash, &existing, req, &token, now) {
        Ok(Ok(t)) => t,
        Ok(Err(refused)) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(refused);
        }
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            return Err(e);
        }
    };
    // A job re-claiming what it holds keeps its token (a retried step); others get a new one.
    let token = match existing.token {
        Some(held) if same_job => held,
        _ => token,
    };
    if !fresh {
        sqlx::query(
            "UPDATE dockhand_item_claims
             SET status = 'claimed', token = ?, job_id = ?, completion = ?, claimed_at = ?,
                 expires_at = ?, processed_at = NULL, ttl_ms = ?, run_step = ?,
                 run_action = ?, run_token = ?
             WHERE id = ?",
        )
        .bind(&token)
        .bind(req.job_id)
        .bind(config)
        .bind(ms(now))
        .bind(ms(expires))
        .bind(req.ttl.num_milliseconds())
        .bind(req.run.map(|r| r.step))
        .bind(req.run.map(|r| r.lease.id))
        .bind(req.run.map(|r| r.lease.token))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    }
    tx.commit().await.map_err(Error::db(op))?;
    Ok(ClaimOutcome::Claimed(Descriptor {
        identity: identity.clone(),
        token,
        job_id: req.job_id,
        completion: req.completion.clone(),
    }))
}

pub(super) async fn get_claim(
    store: &MySqlStore,
    identity: &Identity,
) -> Result<Option<ItemClaim>> {
    let row = sqlx::query(&format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE {MATCHES}"
    ))
    .bind(identity.hash())
    .bind(&identity.scope)
    .bind(&identity.source_type)
    .bind(&identity.item_id)
    .fetch_optional(store.pool())
    .await
    .map_err(Error::db("get_claim"))?;
    let claim = row.as_ref().map(claim_from_row).transpose()?;
    Ok(claim.filter(|c| c.identity == *identity))
}

pub(super) async fn complete_claim(
    store: &MySqlStore,
    descriptor: &Descriptor,
    handler: Option<Arc<dyn CompletionHandler>>,
    now: DateTime<Utc>,
) -> Result<CompleteOutcome> {
    let handler = &handler;
    retry_deadlocks("complete_claim", move || {
        complete_once(store, descriptor, handler.clone(), now)
    })
    .await
}

/// One attempt of [`complete_claim`].
async fn complete_once(
    store: &MySqlStore,
    descriptor: &Descriptor,
    handler: Option<Arc<dyn CompletionHandler>>,
    now: DateTime<Utc>,
) -> Result<CompleteOutcome> {
    let op = "complete_claim";
    let identity = &descriptor.identity;
    let mut tx = store.begin(op).await?;
    let held = sqlx::query(&format!(
        "SELECT id, job_id FROM dockhand_item_claims
         WHERE {MATCHES} AND {TOKEN_IS} AND status = 'claimed'
         FOR UPDATE"
    ))
    .bind(identity.hash())
    .bind(&identity.scope)
    .bind(&identity.source_type)
    .bind(&identity.item_id)
    .bind(&descriptor.token)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let Some(held) = held else {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(CompleteOutcome::Lost);
    };
    let id: i64 = held.try_get("id").map_err(Error::db(op))?;
    let job_id: Option<i64> = held.try_get("job_id").map_err(Error::db(op))?;
    if let Some(handler) = handler {
        let ctx = CompletionContext {
            identity: identity.clone(),
            token: descriptor.token.clone(),
            job_id,
            payload: descriptor.completion.payload.clone(),
            now,
        };
        match run_in_tx(handler.as_ref(), CompletionTx::MySql(&mut tx), &ctx).await {
            Ok(Ok(())) => {}
            Ok(Err(failed)) => {
                tx.rollback().await.map_err(Error::db(op))?;
                return Err(Error::invalid("completion", failed));
            }
            Err(transient) => {
                // Rolled back whole (dropping the transaction rolls back if this fails too);
                // `retry_deadlocks` runs it again.
                let _ = tx.rollback().await;
                return Err(transient);
            }
        }
    }
    settle(&mut tx, id, descriptor.completion.retain_processed, now).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(CompleteOutcome::Completed)
}

pub(super) async fn release_claim(
    store: &MySqlStore,
    descriptor: &Descriptor,
    defer: bool,
) -> Result<bool> {
    let identity = &descriptor.identity;
    let sql = if defer {
        format!(
            "UPDATE dockhand_item_claims
             SET status = 'deferred', token = NULL, job_id = NULL, expires_at = NULL
             WHERE {MATCHES} AND {TOKEN_IS} AND status = 'claimed'"
        )
    } else {
        format!(
            "DELETE FROM dockhand_item_claims
             WHERE {MATCHES} AND {TOKEN_IS} AND status = 'claimed'"
        )
    };
    let (sql, hash) = (sql.as_str(), identity.hash());
    let hash = hash.as_str();
    retry_deadlocks("release_claim", move || async move {
        let done = sqlx::query(sql)
            .bind(hash)
            .bind(&identity.scope)
            .bind(&identity.source_type)
            .bind(&identity.item_id)
            .bind(&descriptor.token)
            .execute(store.pool())
            .await
            .map_err(Error::db("release_claim"))?;
        Ok(done.rows_affected() == 1)
    })
    .await
}

pub(super) async fn list_claims(store: &MySqlStore, f: &ClaimFilter) -> Result<Vec<ItemClaim>> {
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE 1 = 1"
    ));
    if let Some(s) = &f.scope {
        // The plain `=` serves the (scope, status) index; the cast makes the match exact.
        qb.push(" AND scope = ")
            .push_bind(s.clone())
            .push(" AND CAST(scope AS BINARY) = CAST(")
            .push_bind(s.clone())
            .push(" AS BINARY)");
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
        .fetch_all(store.pool())
        .await
        .map_err(Error::db("list_claims"))?;
    rows.iter().map(claim_from_row).collect()
}

pub(super) async fn tracked_item(
    store: &MySqlStore,
    namespace: &str,
    item_id: &str,
) -> Result<Option<TrackedItem>> {
    let row = sqlx::query(
        "SELECT namespace, item_id, revision, last_job, updated_at
         FROM dockhand_tracked_items WHERE item_hash = ? AND namespace = ? AND item_id = ?",
    )
    .bind(super::ledger::item_hash(namespace, item_id))
    .bind(namespace)
    .bind(item_id)
    .fetch_optional(store.pool())
    .await
    .map_err(Error::db("tracked_item"))?;
    let Some(r) = row else { return Ok(None) };
    let d = || Error::db("tracked_item");
    let item = TrackedItem {
        namespace: text(&r, "namespace")?,
        item_id: text(&r, "item_id")?,
        revision: r.try_get("revision").map_err(d())?,
        last_job: r.try_get("last_job").map_err(d())?,
        updated_at: from_ms(r.try_get("updated_at").map_err(d())?),
    };
    Ok((item.namespace == namespace && item.item_id == item_id).then_some(item))
}

/// The owning job's refusal of a claim ([`refusal`]), read under a share lock on the job row
/// (a bridge finishing the job holds it `FOR UPDATE` until it commits, so this waits and then
/// reads the final status); a job id with no row is a free-standing owner and refuses nothing.
async fn job_refusal(
    conn: &mut MySqlConnection,
    req: &ClaimItemRequest,
    job_id: i64,
) -> Result<Option<ClaimOutcome>> {
    Ok(job_state(conn, job_id)
        .await?
        .and_then(|(status, step_index)| refusal(req, job_id, status, step_index)))
}

/// A claim's owning job's status and step, its row locked in share mode (`None`: no row).
pub(super) async fn job_state(
    conn: &mut MySqlConnection,
    job_id: i64,
) -> Result<Option<(JobStatus, i32)>> {
    let row =
        sqlx::query("SELECT status, step_index FROM dockhand_jobs WHERE id = ? LOCK IN SHARE MODE")
            .bind(job_id)
            .fetch_optional(conn)
            .await
            .map_err(Error::db("claim_item (job)"))?;
    let Some(row) = row else { return Ok(None) };
    let status = text(&row, "status")?
        .parse::<JobStatus>()
        .map_err(|e| Error::Corrupt {
            what: "job",
            id: job_id,
            message: e.to_string(),
        })?;
    let step_index: i32 = row
        .try_get("step_index")
        .map_err(Error::db("claim_item (job)"))?;
    Ok(Some((status, step_index)))
}

/// May a claim request take an existing row (C2)?
#[derive(Debug, Clone, Copy)]
pub(super) struct Takeover {
    /// The row is `claimed` under the very token requested (nothing to write).
    pub(super) fresh: bool,
    /// The row is `claimed` by the requesting job (it keeps its token).
    pub(super) same_job: bool,
}

/// The takeover rule for row `id` (identity hash `hash`), the one place MySQL's single and
/// grouped claims decide it: `Ok(Ok(_))` the request takes the row; `Ok(Err(outcome))` it is
/// refused with that outcome (held by another, already processed); `Err` the row is corrupt
/// (an identity-hash collision, an unclaimable deferred row).
pub(super) fn takeover(
    id: i64,
    hash: &str,
    existing: &ItemClaim,
    req: &ClaimItemRequest,
    token: &str,
    now: DateTime<Utc>,
) -> Result<std::result::Result<Takeover, ClaimOutcome>> {
    let corrupt = |message: String| Error::Corrupt {
        what: "item claim",
        id,
        message,
    };
    if existing.identity != req.identity {
        return Err(corrupt(format!(
            "identity hash {hash} collides: stored parts differ from the requested identity"
        )));
    }
    let fresh = existing.status == ClaimStatus::Claimed && existing.token.as_deref() == Some(token);
    let same_job = existing.status == ClaimStatus::Claimed
        && existing.job_id.is_some()
        && existing.job_id == req.job_id;
    let takeable = fresh
        || same_job
        || match existing.status {
            ClaimStatus::Deferred => true,
            ClaimStatus::Claimed => existing.expires_at.is_some_and(|e| ms(e) <= ms(now)),
            ClaimStatus::Processed => req.reprocess,
        };
    if takeable {
        return Ok(Ok(Takeover { fresh, same_job }));
    }
    match existing.status {
        ClaimStatus::Processed => Ok(Err(ClaimOutcome::AlreadyProcessed)),
        ClaimStatus::Claimed => Ok(Err(ClaimOutcome::HeldByOther)),
        ClaimStatus::Deferred => Err(corrupt(format!(
            "identity {hash}: deferred row was not claimable"
        ))),
    }
}
