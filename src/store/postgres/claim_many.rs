//! PostgreSQL: many item claims in one transaction ([`crate::Store::claim_items`]). The
//! transaction locks each distinct step run's action row and the owning jobs' rows `FOR
//! SHARE` once (the lock order of the one-claim statement: action, job, claim rows), then
//! takes the claims round by round ([`rounds`]) with one `INSERT … SELECT FROM UNNEST(…) ON
//! CONFLICT (identity_hash) DO UPDATE … WHERE` each, the takeover rule of
//! [`super::claims`]. The conflicting rows the rule refuses are locked all the same, so one
//! read of them in the same transaction tells a held claim from a processed one, and it
//! cannot change before the commit. Rows are taken in hash order, so two such calls cannot
//! deadlock on each other; a deadlock with anything else re-runs the whole transaction.

use super::{ts, PgStore};
use crate::claims::{ClaimItemRequest, ClaimOutcome, ClaimStatus, Descriptor};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::claim_rules::{distinct_jobs, distinct_runs, expiries, refused, rounds};
use crate::store::rerun::rerun_transaction;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use std::collections::HashMap;

/// One round's upsert: the requests as arrays, the rule of the one-claim statement (`$14`:
/// whether a processed row is taken again).
const CLAIM_ROUND: &str = "INSERT INTO dockhand_item_claims AS c
    (identity_hash, scope, source_type, item_id, status, token, job_id, completion,
     claimed_at, expires_at, processed_at, ttl_ms, run_step, run_action, run_token)
 SELECT u.h, u.s, u.t, u.i, 'claimed', u.tok, u.j, u.comp::jsonb, $1, u.e, NULL, u.ttl,
        u.rs, u.ra, u.rt
 FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[],
             $8::text[], $9::timestamptz[], $10::bigint[], $11::integer[], $12::bigint[],
             $13::bigint[])
      WITH ORDINALITY AS u(h, s, t, i, tok, j, comp, e, ttl, rs, ra, rt, n)
 ORDER BY u.n
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
        OR (c.status = 'claimed' AND c.expires_at <= $1)
        OR (c.status = 'claimed' AND c.job_id = excluded.job_id)
        OR (c.status = 'processed' AND $14))
 RETURNING identity_hash, token";

pub(super) async fn claim_items(
    store: &PgStore,
    reqs: &[ClaimItemRequest],
    now: DateTime<Utc>,
) -> Result<Vec<ClaimOutcome>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let expires = expiries(reqs, now)?;
    let hashes: Vec<String> = reqs.iter().map(|r| r.identity.hash()).collect();
    let mut configs = Vec::with_capacity(reqs.len());
    for r in reqs {
        configs.push(
            serde_json::to_string(&r.completion)
                .map_err(|e| Error::invalid("completion", e.to_string()))?,
        );
    }
    let plan = Plan {
        reqs,
        hashes: &hashes,
        configs: &configs,
        expires: &expires,
        now,
    };
    rerun_transaction("postgres", "claim_items", || claim_once(store, &plan)).await
}

/// A refused request's row as read back: id, (scope, source type, item id), status.
type StoredRow = (i64, (String, String, String), String);

/// The requests and what is computed of them once.
struct Plan<'a> {
    reqs: &'a [ClaimItemRequest],
    hashes: &'a [String],
    configs: &'a [String],
    expires: &'a [DateTime<Utc>],
    now: DateTime<Utc>,
}

/// One run of the transaction.
async fn claim_once(store: &PgStore, plan: &Plan<'_>) -> Result<Vec<ClaimOutcome>> {
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

async fn claim_in_tx(conn: &mut PgConnection, plan: &Plan<'_>) -> Result<Vec<ClaimOutcome>> {
    let op = "claim_items";
    let reqs = plan.reqs;
    for lease in distinct_runs(reqs) {
        let live: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM dockhand_actions
             WHERE id = $1 AND status = 'running' AND lease_token = $2 FOR SHARE",
        )
        .bind(lease.id)
        .bind(lease.token)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::db(op))?;
        if live.is_none() {
            return Err(lease.lost());
        }
    }
    let jobs = lock_jobs(&mut *conn, &distinct_jobs(reqs)).await?;
    let mut out: Vec<Option<ClaimOutcome>> = vec![None; reqs.len()];
    let mut todo = Vec::with_capacity(reqs.len());
    for (at, req) in reqs.iter().enumerate() {
        match refused(req, &jobs) {
            Some(refusal) => out[at] = Some(refusal),
            None => todo.push(at),
        }
    }
    for (reprocess, round) in rounds(reqs, plan.hashes, &todo) {
        claim_round(&mut *conn, plan, reprocess, &round, &mut out).await?;
    }
    out.into_iter()
        .map(|o| o.ok_or_else(|| Error::Config("claim_items: a request got no outcome".into())))
        .collect()
}

/// The owning jobs' status and step, their rows locked for share (ascending id).
async fn lock_jobs(conn: &mut PgConnection, ids: &[i64]) -> Result<HashMap<i64, (JobStatus, i32)>> {
    let op = "claim_items (jobs)";
    let rows = sqlx::query(
        "SELECT id, status, step_index FROM dockhand_jobs WHERE id = ANY($1)
         ORDER BY id FOR SHARE",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut jobs = HashMap::with_capacity(rows.len());
    for row in rows {
        let id: i64 = row.try_get("id").map_err(Error::db(op))?;
        let status: String = row.try_get("status").map_err(Error::db(op))?;
        let status = status.parse::<JobStatus>().map_err(|e| Error::Corrupt {
            what: "job",
            id,
            message: e.to_string(),
        })?;
        jobs.insert(
            id,
            (status, row.try_get("step_index").map_err(Error::db(op))?),
        );
    }
    Ok(jobs)
}

/// One round (distinct identities, one `reprocess` flag): the upsert, then the refused rows
/// read back; fills the round's outcomes.
async fn claim_round(
    conn: &mut PgConnection,
    plan: &Plan<'_>,
    reprocess: bool,
    round: &[usize],
    out: &mut [Option<ClaimOutcome>],
) -> Result<()> {
    let op = "claim_items";
    let reqs = plan.reqs;
    let pick = |f: &dyn Fn(usize) -> String| round.iter().map(|&at| f(at)).collect::<Vec<_>>();
    let hashes = pick(&|at| plan.hashes[at].clone());
    let tokens = pick(&|_| uuid::Uuid::new_v4().to_string());
    let rows = sqlx::query(CLAIM_ROUND)
        .bind(ts(plan.now))
        .bind(&hashes)
        .bind(pick(&|at| reqs[at].identity.scope.clone()))
        .bind(pick(&|at| reqs[at].identity.source_type.clone()))
        .bind(pick(&|at| reqs[at].identity.item_id.clone()))
        .bind(&tokens)
        .bind(round.iter().map(|&at| reqs[at].job_id).collect::<Vec<_>>())
        .bind(pick(&|at| plan.configs[at].clone()))
        .bind(
            round
                .iter()
                .map(|&at| ts(plan.expires[at]))
                .collect::<Vec<_>>(),
        )
        .bind(
            round
                .iter()
                .map(|&at| reqs[at].ttl.num_milliseconds())
                .collect::<Vec<_>>(),
        )
        .bind(
            round
                .iter()
                .map(|&at| reqs[at].run.map(|r| r.step))
                .collect::<Vec<_>>(),
        )
        .bind(
            round
                .iter()
                .map(|&at| reqs[at].run.map(|r| r.lease.id))
                .collect::<Vec<_>>(),
        )
        .bind(
            round
                .iter()
                .map(|&at| reqs[at].run.map(|r| r.lease.token))
                .collect::<Vec<_>>(),
        )
        .bind(reprocess)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?;
    let mut taken: HashMap<String, String> = HashMap::with_capacity(rows.len());
    for row in rows {
        taken.insert(
            row.try_get("identity_hash").map_err(Error::db(op))?,
            row.try_get("token").map_err(Error::db(op))?,
        );
    }
    let refused: Vec<String> = hashes
        .iter()
        .filter(|h| !taken.contains_key(*h))
        .cloned()
        .collect();
    let mut held: HashMap<String, StoredRow> = HashMap::new();
    if !refused.is_empty() {
        // Locked by the upsert that refused them: their state stands until the commit.
        let rows = sqlx::query(
            "SELECT identity_hash, id, scope, source_type, item_id, status
             FROM dockhand_item_claims WHERE identity_hash = ANY($1)",
        )
        .bind(&refused)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim_items (read)"))?;
        let d = || Error::db("claim_items (read)");
        for row in rows {
            held.insert(
                row.try_get("identity_hash").map_err(d())?,
                (
                    row.try_get("id").map_err(d())?,
                    (
                        row.try_get("scope").map_err(d())?,
                        row.try_get("source_type").map_err(d())?,
                        row.try_get("item_id").map_err(d())?,
                    ),
                    row.try_get("status").map_err(d())?,
                ),
            );
        }
    }
    for &at in round {
        let req = &reqs[at];
        let hash = &plan.hashes[at];
        if let Some(token) = taken.get(hash) {
            out[at] = Some(ClaimOutcome::Claimed(Descriptor {
                identity: req.identity.clone(),
                token: token.clone(),
                job_id: req.job_id,
                completion: req.completion.clone(),
            }));
            continue;
        }
        out[at] = Some(refused_outcome(req, hash, held.get(hash))?);
    }
    Ok(())
}

/// Why the upsert refused a request, from its (locked) row: held or processed; anything else
/// is a corrupt row (another identity under the hash, or a row the rule should have taken).
fn refused_outcome(
    req: &ClaimItemRequest,
    hash: &str,
    row: Option<&StoredRow>,
) -> Result<ClaimOutcome> {
    let corrupt = |id: i64, message: String| Error::Corrupt {
        what: "item claim",
        id,
        message,
    };
    let Some((id, parts, status)) = row else {
        return Err(corrupt(
            0,
            format!("identity {hash}: the upsert took no row and none exists"),
        ));
    };
    let identity = &req.identity;
    if (&parts.0, &parts.1, &parts.2) != (&identity.scope, &identity.source_type, &identity.item_id)
    {
        return Err(corrupt(
            *id,
            format!("identity hash {hash} is stored for a different identity"),
        ));
    }
    match status
        .parse::<ClaimStatus>()
        .map_err(|e| corrupt(*id, e.to_string()))?
    {
        ClaimStatus::Claimed => Ok(ClaimOutcome::HeldByOther),
        ClaimStatus::Processed if !req.reprocess => Ok(ClaimOutcome::AlreadyProcessed),
        ClaimStatus::Processed | ClaimStatus::Deferred => Err(corrupt(
            *id,
            format!("identity {hash}: a claimable row was refused"),
        )),
    }
}
