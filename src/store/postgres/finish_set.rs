//! PostgreSQL: a grouped bridge finish ([`crate::Store::finish_jobs`]) written set-based on the
//! open transaction, after the group's job rows were locked in id order. The single path
//! ([`super::bridge::finish_in_tx`]) spends 6-8 round trips per job while its parent's row
//! and its siblings' rows stay locked; here a group of any size costs five: the step runs'
//! acknowledgements, the superseded claims' release, the jobs read, their claims read (locked),
//! and one statement of data-modifying CTEs writing the settles, releases, status
//! compare-and-swaps and lifecycle events.
//!
//! The decisions are the single path's, per request in job order (as the SQLite
//! `finish_set`): a lost lease leaves its job alone, a job already final (or finished earlier
//! in the same group) is [`InTx::AlreadyFinal`], success completes the job's claims (a claim
//! with a completion handler runs it and is settled at once on the same transaction; the
//! handler-less ones are settled together), failure releases them.

use super::bridge::claim_context;
use super::claims::settle;
use super::finish::{complete_leases, log};
use super::jobs::{job_from_row, COLUMNS as JOB_COLUMNS};
use super::ts;
use crate::claims::completion::run_in_tx;
use crate::claims::{CompletionRegistry, CompletionTx};
use crate::error::{Error, Result};
use crate::jobs::listeners::LISTENERS_TASK;
use crate::jobs::{FinishRequest, Job};
use crate::store::finish_group::{all_moved, plan, roll_back_on, Completed, Plan, SetFinished};
use crate::store::{Finish, Lease};
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::collections::HashMap;

/// Which requests' step runs still hold their leases; the `complete_run` ones are completed
/// under them in one statement (a lost one gets its `lease_lost` log row).
async fn runs_held(
    tx: &mut PgConnection,
    reqs: &[FinishRequest],
    now: DateTime<Utc>,
) -> Result<Vec<bool>> {
    let leases: Vec<Lease> = reqs
        .iter()
        .filter(|r| r.complete_run)
        .filter_map(|r| r.lease)
        .collect();
    let completed = complete_leases(tx, &leases, now).await?;
    let mut held = Vec::with_capacity(reqs.len());
    for r in reqs {
        let ok = match r.lease {
            None => true,
            Some(l) if r.complete_run => {
                let ok = completed.contains(&(l.id, l.token));
                if !ok {
                    let (event, detail) = Finish::Complete.lease_lost_entry(l.token);
                    log(tx, l.id, now, event, Some(detail)).await?;
                }
                ok
            }
            Some(l) => super::lease_fence::lease_live(tx, l, "finish_jobs (lease)").await?,
        };
        held.push(ok);
    }
    Ok(held)
}

/// Binds: 1 jobs, 2 steps, 3 step actions, 4 their tokens, 5 kept claims' jobs, 6 their
/// tokens. The claims are read by `job_id = ANY($1)` (the claims index of the group's own
/// jobs); joined by `job_id` alone, on statistics taken before the batch's claims existed,
/// PostgreSQL read every claimed claim of the table instead (`tests/plans.rs`). The join
/// then tests each of those claims against the group's rows: a group's size squared at most.
pub(super) const RELEASE_SUPERSEDED: &str = "DELETE FROM dockhand_item_claims c
 USING UNNEST($1::bigint[], $2::int[], $3::bigint[], $4::bigint[])
       AS r(job, step, action, token)
 WHERE c.job_id = ANY($1::bigint[]) AND c.job_id = r.job AND c.status = 'claimed'
   AND c.run_step = r.step AND (c.run_action <> r.action OR c.run_token <> r.token)
   AND NOT EXISTS (SELECT 1 FROM UNNEST($5::bigint[], $6::text[]) AS k(job, token)
                   WHERE k.job = c.job_id AND k.token = c.token)";

/// Releases, for every held request that names them ([`FinishRequest::superseded`]), the
/// claims other runs of its step took and its output does not carry, in one statement. A
/// claim with no step run recorded (`run_action` NULL) is nobody's superseded claim.
async fn release_superseded(
    tx: &mut PgConnection,
    reqs: &[FinishRequest],
    held: &[bool],
) -> Result<()> {
    let (mut jobs, mut steps, mut actions, mut tokens) = (vec![], vec![], vec![], vec![]);
    let (mut keep_jobs, mut keep_tokens) = (vec![], vec![]);
    for (r, _) in reqs.iter().zip(held).filter(|(_, h)| **h) {
        let (Some(lease), Some(s)) = (r.lease, r.superseded.as_ref()) else {
            continue;
        };
        jobs.push(r.job_id);
        steps.push(s.step);
        actions.push(lease.id);
        tokens.push(lease.token);
        for k in &s.keep {
            keep_jobs.push(r.job_id);
            keep_tokens.push(k.clone());
        }
    }
    if jobs.is_empty() {
        return Ok(());
    }
    sqlx::query(RELEASE_SUPERSEDED)
        .bind(&jobs)
        .bind(&steps)
        .bind(&actions)
        .bind(&tokens)
        .bind(&keep_jobs)
        .bind(&keep_tokens)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs (superseded claims)"))?;
    Ok(())
}

/// The group's jobs by id (their rows already locked by the caller).
async fn read_jobs(tx: &mut PgConnection, ids: &[i64]) -> Result<HashMap<i64, Job>> {
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (jobs)"))?;
    rows.iter()
        .map(|row| job_from_row(row).map(|j| (j.id, j)))
        .collect()
}

/// The claims the group's succeeding jobs own, locked, by job, oldest first.
async fn read_claims(tx: &mut PgConnection, jobs: &[i64]) -> Result<HashMap<i64, Vec<PgRow>>> {
    let mut by_job: HashMap<i64, Vec<PgRow>> = HashMap::new();
    if jobs.is_empty() {
        return Ok(by_job);
    }
    let rows = sqlx::query(
        "SELECT id, job_id, scope, source_type, item_id, token, completion
         FROM dockhand_item_claims
         WHERE job_id = ANY($1) AND status = 'claimed'
         ORDER BY id FOR UPDATE",
    )
    .bind(jobs)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (claims)"))?;
    for row in rows {
        let job: i64 = row
            .try_get("job_id")
            .map_err(Error::db("decode item claim"))?;
        by_job.entry(job).or_default().push(row);
    }
    Ok(by_job)
}

/// The handler-less claims of succeeding jobs, settled together after the group's handlers ran.
#[derive(Default)]
struct Settles {
    processed: Vec<i64>,
    deleted: Vec<i64>,
}

/// Completes `job_id`'s claims: a claim with a handler runs it and is settled at once; the
/// others go to `settles`. `Ok(Err(_))`: a completion failed for good (the caller rolls back).
async fn complete_claims(
    tx: &mut PgConnection,
    job_id: i64,
    rows: Vec<PgRow>,
    completions: &CompletionRegistry,
    settles: &mut Settles,
    now: DateTime<Utc>,
) -> Completed {
    for row in &rows {
        let (id, ctx, config) = match claim_context(row, job_id, now) {
            Ok(c) => c,
            // A corrupt claim cannot be completed: fail the job, which releases its claims.
            Err(e) => return Ok(Err(e.to_string())),
        };
        let item = &ctx.identity.item_id;
        let handler = match completions.resolve(&config) {
            Ok(h) => h,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        let Some(handler) = handler else {
            if config.retain_processed {
                settles.processed.push(id);
            } else {
                settles.deleted.push(id);
            }
            continue;
        };
        // A transient failure is the error: the caller's transaction is re-run whole.
        if let Err(failed) =
            run_in_tx(handler.as_ref(), CompletionTx::Postgres(&mut *tx), &ctx).await?
        {
            return Ok(Err(failed));
        }
        settle(tx, id, config.retain_processed, now).await?;
    }
    Ok(Ok(()))
}

/// The final statuses a group writes, column by column (for `UNNEST`).
#[derive(Default)]
struct Moves {
    ids: Vec<i64>,
    statuses: Vec<&'static str>,
    reasons: Vec<Option<String>>,
    was: Vec<&'static str>,
    /// Whether each event is written delivered ([`FinishRequest::event_delivered`]).
    delivered: Vec<bool>,
}

/// The group's writes in one statement: the settles, the releases, the status
/// compare-and-swaps and the events, as data-modifying CTEs (each touches rows no other one
/// does: the succeeding jobs' claims, the failing jobs' claims, the jobs, their events; each
/// runs to completion whether or not the final SELECT reads it). An event is written delivered
/// only if its request says so ([`FinishRequest::event_delivered`], the runtime's view of the
/// listeners' lease, up to a maintenance tick old) and the statement finds that lease unheld.
/// Returns how many jobs moved.
async fn write_set(
    tx: &mut PgConnection,
    settles: &Settles,
    released: &[i64],
    moves: &Moves,
    now: DateTime<Utc>,
) -> Result<i64> {
    let moved: i64 = sqlx::query_scalar(
        "WITH processed AS (
             UPDATE dockhand_item_claims SET status = 'processed', processed_at = $1, token = NULL
             WHERE id = ANY($2::bigint[]) RETURNING id),
         deleted AS (
             DELETE FROM dockhand_item_claims WHERE id = ANY($3::bigint[]) RETURNING id),
         released AS (
             DELETE FROM dockhand_item_claims
             WHERE job_id = ANY($4::bigint[]) AND status = 'claimed' RETURNING id),
         m AS (
             SELECT * FROM UNNEST($5::bigint[], $6::text[], $7::text[], $8::text[],
                                  $9::boolean[])
                 AS m(id, status, reason, was, delivered)),
         moved AS (
             UPDATE dockhand_jobs j SET status = m.status, reason = m.reason, finished_at = $1,
                 updated_at = $1
             FROM m WHERE j.id = m.id AND j.status = m.was
             RETURNING j.id),
         events AS (
             INSERT INTO dockhand_job_events (job_id, status, reason, created_at, delivered_at)
             SELECT m.id, m.status, m.reason, $1,
                    CASE WHEN m.delivered AND NOT EXISTS (
                             SELECT 1 FROM dockhand_maintenance_leases
                             WHERE task = $10 AND until > $1)
                         THEN $1 END
             FROM m
             ON CONFLICT (job_id) DO UPDATE SET status = EXCLUDED.status,
                 reason = EXCLUDED.reason, created_at = EXCLUDED.created_at,
                 delivered_at = EXCLUDED.delivered_at
             RETURNING job_id)
         SELECT count(*) FROM moved",
    )
    .bind(ts(now))
    .bind(&settles.processed)
    .bind(&settles.deleted)
    .bind(released)
    .bind(&moves.ids)
    .bind(&moves.statuses)
    .bind(&moves.reasons)
    .bind(&moves.was)
    .bind(&moves.delivered)
    .bind(LISTENERS_TASK)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs"))?;
    Ok(moved)
}

/// The group's part of a [`crate::Store::finish_jobs`] transaction, set-based (module docs),
/// on a transaction that locked the group's job rows. The parents' counters are left to the
/// caller ([`GroupOutcomes::parents`]).
pub(super) async fn finish_set(
    tx: &mut PgConnection,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<SetFinished> {
    let held = runs_held(tx, reqs, now).await?;
    release_superseded(tx, reqs, &held).await?;
    let mut ids: Vec<i64> = reqs
        .iter()
        .zip(&held)
        .filter(|(_, h)| **h)
        .map(|(r, _)| r.job_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let jobs = read_jobs(tx, &ids).await?;
    let succeeding: Vec<i64> = reqs
        .iter()
        .zip(&held)
        .filter(|(r, h)| **h && r.status.is_success())
        .filter(|(r, _)| jobs.get(&r.job_id).is_some_and(|j| !j.status.is_final()))
        .map(|(r, _)| r.job_id)
        .collect();
    let mut claims = read_claims(tx, &succeeding).await?;
    let Plan { group, moves: plan } = plan(reqs, &held, &jobs)?;
    let mut settles = Settles::default();
    let mut released = Vec::new();
    let mut moves = Moves::default();
    for m in plan {
        if m.status.is_success() {
            let owned = claims.remove(&m.job_id).unwrap_or_default();
            let done = complete_claims(tx, m.job_id, owned, completions, &mut settles, now).await;
            if let Some(rb) = roll_back_on(m.job_id, done)? {
                return Ok(SetFinished::RollBack(rb));
            }
        } else {
            released.push(m.job_id);
        }
        moves.ids.push(m.job_id);
        moves.statuses.push(m.status.as_str());
        moves.reasons.push(m.reason.map(str::to_string));
        moves.was.push(m.was.as_str());
        moves.delivered.push(m.event_delivered);
    }
    let moved = write_set(tx, &settles, &released, &moves, now).await?;
    all_moved(
        "finish_jobs",
        u64::try_from(moved).unwrap_or(0),
        moves.ids.len(),
    )?;
    Ok(SetFinished::Written(group))
}
