//! MySQL: many item claims in one transaction ([`crate::Store::claim_items`]). The
//! transaction locks each distinct step run's action row and each owning job's row in share
//! mode once (the lock order of one claim: action, job, claim rows), then takes the claims
//! round by round ([`rounds`]): one multi-row `INSERT … ON DUPLICATE KEY UPDATE id = id` per
//! round (inserting the new identities, locking the existing rows unchanged, in hash order),
//! one `SELECT … FOR UPDATE` reading them back, the takeover rule of [`super::claims`] applied
//! in Rust, and an `UPDATE` by id for each row taken over (rare: a fresh row is written by the
//! insert). A deadlock re-runs the whole transaction.

use super::claims::{claim_from_row, config_json, job_state, takeover, Takeover, CLAIM_COLUMNS};
use super::connect::retry_deadlocks;
use super::lease_fence::run_fence;
use super::{ms, MySqlStore};
use crate::claims::{ClaimItemRequest, ClaimOutcome, Descriptor, ItemClaim};
use crate::error::{Error, Result};
use crate::store::claim_rules::{distinct_jobs, distinct_runs, expiries, refused, rounds};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use std::collections::HashMap;

/// Requests per multi-row insert (13 parameters each, under MySQL's 65,535).
const ROWS_PER_INSERT: usize = 2_000;

/// The requests and what is computed of them once.
struct Plan<'a> {
    reqs: &'a [ClaimItemRequest],
    hashes: &'a [String],
    configs: &'a [String],
    expires: &'a [DateTime<Utc>],
    now: DateTime<Utc>,
}

pub(super) async fn claim_items(
    store: &MySqlStore,
    reqs: &[ClaimItemRequest],
    now: DateTime<Utc>,
) -> Result<Vec<ClaimOutcome>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let expires = expiries(reqs, now)?;
    let hashes: Vec<String> = reqs.iter().map(|r| r.identity.hash()).collect();
    let configs = reqs
        .iter()
        .map(|r| config_json(&r.completion))
        .collect::<Result<Vec<_>>>()?;
    let plan = Plan {
        reqs,
        hashes: &hashes,
        configs: &configs,
        expires: &expires,
        now,
    };
    let plan = &plan;
    retry_deadlocks("claim_items", move || claim_once(store, plan)).await
}

/// One attempt of the transaction.
async fn claim_once(store: &MySqlStore, plan: &Plan<'_>) -> Result<Vec<ClaimOutcome>> {
    let op = "claim_items";
    let mut tx = store.begin(op).await?;
    match claim_in_tx(&mut tx, plan).await {
        Ok(out) => {
            tx.commit().await.map_err(Error::db(op))?;
            Ok(out)
        }
        Err(e) => {
            // Dropping the transaction rolls back if this fails too.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

async fn claim_in_tx(conn: &mut MySqlConnection, plan: &Plan<'_>) -> Result<Vec<ClaimOutcome>> {
    let op = "claim_items";
    let reqs = plan.reqs;
    for lease in distinct_runs(reqs) {
        run_fence(&mut *conn, lease, op).await?;
    }
    let mut jobs = HashMap::new();
    for job_id in distinct_jobs(reqs) {
        if let Some(state) = job_state(&mut *conn, job_id).await? {
            jobs.insert(job_id, state);
        }
    }
    let mut out: Vec<Option<ClaimOutcome>> = vec![None; reqs.len()];
    let mut todo = Vec::with_capacity(reqs.len());
    for (at, req) in reqs.iter().enumerate() {
        match refused(req, &jobs) {
            Some(refusal) => out[at] = Some(refusal),
            None => todo.push(at),
        }
    }
    for (_, round) in rounds(reqs, plan.hashes, &todo) {
        for part in round.chunks(ROWS_PER_INSERT) {
            claim_round(&mut *conn, plan, part, &mut out).await?;
        }
    }
    out.into_iter()
        .map(|o| o.ok_or_else(|| Error::Config("claim_items: a request got no outcome".into())))
        .collect()
}

/// One round (distinct identities): insert or lock, read back, decide, take over.
async fn claim_round(
    conn: &mut MySqlConnection,
    plan: &Plan<'_>,
    round: &[usize],
    out: &mut [Option<ClaimOutcome>],
) -> Result<()> {
    let op = "claim_items";
    let (reqs, now) = (plan.reqs, plan.now);
    let tokens: Vec<String> = round
        .iter()
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "INSERT INTO dockhand_item_claims
            (identity_hash, scope, source_type, item_id, status, token, job_id, completion,
             claimed_at, expires_at, ttl_ms, run_step, run_action, run_token) ",
    );
    qb.push_values(round.iter().zip(&tokens), |mut b, (&at, token)| {
        let req = &reqs[at];
        b.push_bind(&plan.hashes[at])
            .push_bind(&req.identity.scope)
            .push_bind(&req.identity.source_type)
            .push_bind(&req.identity.item_id)
            .push_bind("claimed")
            .push_bind(token)
            .push_bind(req.job_id)
            .push_bind(&plan.configs[at])
            .push_bind(ms(now))
            .push_bind(ms(plan.expires[at]))
            .push_bind(req.ttl.num_milliseconds())
            .push_bind(req.run.map(|r| r.step))
            .push_bind(req.run.map(|r| r.lease.id))
            .push_bind(req.run.map(|r| r.lease.token));
    });
    qb.push(" ON DUPLICATE KEY UPDATE id = id");
    qb.build()
        .execute(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    let mut read: QueryBuilder<MySql> = QueryBuilder::new(format!(
        "SELECT identity_hash, {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE identity_hash IN ("
    ));
    let mut sep = read.separated(", ");
    for &at in round {
        sep.push_bind(&plan.hashes[at]);
    }
    read.push(") FOR UPDATE");
    let rows = read
        .build()
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    let mut found: HashMap<String, (i64, ItemClaim)> = HashMap::with_capacity(rows.len());
    for row in rows {
        let hash = super::jobs::text(&row, "identity_hash")?;
        let id: i64 = row.try_get("id").map_err(Error::db(op))?;
        found.insert(hash, (id, claim_from_row(&row)?));
    }
    for (&at, token) in round.iter().zip(tokens) {
        let hash = &plan.hashes[at];
        let Some((id, existing)) = found.get(hash) else {
            return Err(corrupt(
                0,
                format!("identity {hash}: the insert left no row to read back"),
            ));
        };
        out[at] = Some(decide(conn, plan, at, *id, existing, token).await?);
    }
    Ok(())
}

/// The takeover rule of one claim on its locked row (as [`super::claims`] applies it); a row
/// taken over is written by id.
async fn decide(
    conn: &mut MySqlConnection,
    plan: &Plan<'_>,
    at: usize,
    id: i64,
    existing: &ItemClaim,
    token: String,
) -> Result<ClaimOutcome> {
    let (req, hash, now) = (&plan.reqs[at], &plan.hashes[at], plan.now);
    let Takeover { fresh, same_job } = match takeover(id, hash, existing, req, &token, now)? {
        Ok(t) => t,
        Err(refused) => return Ok(refused),
    };
    // A job re-claiming what it holds keeps its token (a retried step); others get a new one.
    let token = match &existing.token {
        Some(held) if same_job => held.clone(),
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
        .bind(&plan.configs[at])
        .bind(ms(now))
        .bind(ms(plan.expires[at]))
        .bind(req.ttl.num_milliseconds())
        .bind(req.run.map(|r| r.step))
        .bind(req.run.map(|r| r.lease.id))
        .bind(req.run.map(|r| r.lease.token))
        .bind(id)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("claim_items"))?;
    }
    Ok(ClaimOutcome::Claimed(Descriptor {
        identity: req.identity.clone(),
        token,
        job_id: req.job_id,
        completion: req.completion.clone(),
    }))
}

fn corrupt(id: i64, message: String) -> Error {
    Error::Corrupt {
        what: "item claim",
        id,
        message,
    }
}
