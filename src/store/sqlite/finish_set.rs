//! SQLite: a grouped bridge finish ([`crate::Store::finish_jobs`]) written set-based on the
//! open write transaction. The single path ([`super::bridge::finish_in_tx`]) spends 6-7
//! statements per job; here a group of any size costs four round trips to sqlx's worker
//! thread, whatever its size: the step runs' acknowledgements, the superseded claims' release,
//! one batch reading the jobs and their claims, and one batch writing the settles, releases,
//! status compare-and-swaps and lifecycle events. Each round trip is a hop between threads
//! (the profile of W4 is mostly the kernel switching them), and the one writer runs them all,
//! so this is what a batch's children cost the writer.
//!
//! The decisions are the single path's, per request in job order: a lost lease leaves its job
//! alone, a job already final (or finished earlier in the same group) is
//! [`InTx::AlreadyFinal`], success completes the job's claims (a claim with a completion handler
//! runs it and is settled at once, on the same transaction, as the single path does; the
//! handler-less ones are settled together), failure releases them.

use super::claims::{config_from, settle};
use super::finish::{complete_set_sql, log};
use super::jobs::{job_from_parts, JobParts, JOB_COLUMNS};
use super::ms;
use super::one_row::decode;
use crate::claims::completion::run_in_tx;
use crate::claims::{CompletionContext, CompletionRegistry, CompletionTx, Identity};
use crate::error::{Error, Result};
use crate::jobs::listeners::LISTENERS_TASK;
use crate::jobs::{FinishRequest, Job};
use crate::store::finish_group::{plan, roll_back_on, Completed, Plan, SetFinished};
use crate::store::Finish;
use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use std::collections::{HashMap, HashSet};

fn json<T: serde::Serialize>(v: &T, what: &'static str) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::invalid(what, e.to_string()))
}

/// Which requests' step runs still hold their leases; the `complete_run` ones are completed
/// under them in one statement (a lost one gets its `lease_lost` log row).
async fn runs_held(
    tx: &mut SqliteConnection,
    reqs: &[FinishRequest],
    now: DateTime<Utc>,
) -> Result<Vec<bool>> {
    let pairs: Vec<[i64; 2]> = reqs
        .iter()
        .filter(|r| r.complete_run)
        .filter_map(|r| r.lease.map(|l| [l.id, l.token]))
        .collect();
    let completed: HashSet<(i64, i64)> = if pairs.is_empty() {
        HashSet::new()
    } else {
        let rows: Vec<(i64, i64)> = sqlx::query_as(complete_set_sql!("?1", "?2"))
            .bind(ms(now))
            .bind(json(&pairs, "leases")?)
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("finish_jobs (runs)"))?;
        rows.into_iter().collect()
    };
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

/// The claims other runs of the finishing steps took and the outputs do not carry, released
/// for every held request that names them ([`FinishRequest::superseded`]), in one statement.
/// A claim with no step run recorded (`run_action` NULL) is nobody's superseded claim.
async fn release_superseded(
    tx: &mut SqliteConnection,
    reqs: &[FinishRequest],
    held: &[bool],
) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Run<'a> {
        job: i64,
        step: i32,
        action: i64,
        token: i64,
        keep: &'a [String],
    }
    let runs: Vec<Run<'_>> = reqs
        .iter()
        .zip(held)
        .filter(|(_, h)| **h)
        .filter_map(|(r, _)| {
            let (lease, s) = (r.lease?, r.superseded.as_ref()?);
            Some(Run {
                job: r.job_id,
                step: s.step,
                action: lease.id,
                token: lease.token,
                keep: &s.keep,
            })
        })
        .collect();
    if runs.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "DELETE FROM dockhand_item_claims WHERE id IN (
             SELECT c.id FROM json_each(?) AS r
             JOIN dockhand_item_claims c ON c.job_id = json_extract(r.value, '$.job')
             WHERE c.status = 'claimed' AND c.run_step = json_extract(r.value, '$.step')
               AND (c.run_action <> json_extract(r.value, '$.action')
                    OR c.run_token <> json_extract(r.value, '$.token'))
               AND (c.token IS NULL
                    OR c.token NOT IN (SELECT k.value FROM json_each(r.value, '$.keep') AS k)))",
    )
    .bind(json(&runs, "step runs")?)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (superseded claims)"))?;
    Ok(())
}

/// One claim a finishing job owns.
struct OwnedClaim {
    id: i64,
    identity: Identity,
    token: Option<String>,
    completion: Option<String>,
}

/// What the group reads: its jobs by id, and the claims its succeeding jobs own by job,
/// oldest first.
struct ReadSet {
    jobs: HashMap<i64, Job>,
    claims: HashMap<i64, Vec<OwnedClaim>>,
}

/// Reads the group's jobs and the claims of its succeeding jobs in one statement that answers
/// one row: both lists folded into JSON (see `one_row`).
async fn read_set(tx: &mut SqliteConnection, jobs: &[i64], succeeding: &[i64]) -> Result<ReadSet> {
    let ids = serde_json::json!({ "jobs": jobs, "succeeding": succeeding });
    let (job_rows, claim_rows): (String, String) = sqlx::query_as(&format!(
        "SELECT (SELECT json_group_array(json_array({JOB_COLUMNS})) FROM dockhand_jobs
                 WHERE id IN (SELECT value FROM json_each(?1, '$.jobs'))),
                (SELECT json_group_array(json_array(id, job_id, scope, source_type, item_id,
                                                    token, completion))
                 FROM (SELECT id, job_id, scope, source_type, item_id, token, completion
                       FROM dockhand_item_claims
                       WHERE job_id IN (SELECT value FROM json_each(?1, '$.succeeding'))
                         AND status = 'claimed'
                       ORDER BY id))"
    ))
    .bind(json(&ids, "job ids")?)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (read)"))?;
    let mut set = ReadSet {
        jobs: HashMap::with_capacity(jobs.len()),
        claims: HashMap::new(),
    };
    for parts in decode::<Vec<JobParts>>(&job_rows, "jobs")? {
        let job = job_from_parts(parts)?;
        set.jobs.insert(job.id, job);
    }
    type ClaimParts = (
        i64,
        i64,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
    );
    let mut claims: Vec<ClaimParts> = decode(&claim_rows, "item claims")?;
    // `json_group_array` keeps its rows' order in practice; the claims are oldest first by rule.
    claims.sort_by_key(|c| c.0);
    for (id, job, scope, source_type, item_id, token, completion) in claims {
        set.claims.entry(job).or_default().push(OwnedClaim {
            id,
            identity: Identity {
                scope,
                source_type,
                item_id,
            },
            token,
            completion,
        });
    }
    Ok(set)
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
    tx: &mut SqliteConnection,
    job_id: i64,
    claims: Vec<OwnedClaim>,
    completions: &CompletionRegistry,
    settles: &mut Settles,
    now: DateTime<Utc>,
) -> Completed {
    for c in claims {
        let item = &c.identity.item_id;
        let config = match config_from(c.id, c.completion.as_deref()) {
            Ok(config) => config,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        let handler = match completions.resolve(&config) {
            Ok(h) => h,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        let Some(handler) = handler else {
            if config.retain_processed {
                settles.processed.push(c.id);
            } else {
                settles.deleted.push(c.id);
            }
            continue;
        };
        let ctx = CompletionContext {
            token: c.token.unwrap_or_default(),
            job_id: Some(job_id),
            payload: config.payload.clone(),
            now,
            identity: c.identity,
        };
        // A transient failure is the error: the caller rolls the group back.
        if let Err(failed) =
            run_in_tx(handler.as_ref(), CompletionTx::Sqlite(&mut *tx), &ctx).await?
        {
            return Ok(Err(failed));
        }
        settle(tx, c.id, config.retain_processed, now).await?;
    }
    Ok(Ok(()))
}

/// One final status written by the group.
#[derive(serde::Serialize)]
struct Transition<'a> {
    id: i64,
    status: &'a str,
    reason: Option<&'a str>,
    was: &'a str,
    /// Whether its event is written delivered ([`FinishRequest::event_delivered`]).
    delivered: bool,
}

/// The group's writes: each kind one statement, all of them sent as one batch (one hop to
/// the writer's worker thread; an empty list makes its statement a no-op). `?1` is one JSON
/// object holding every list (`processed`, `deleted` claim ids, `released` job ids, `moves`)
/// and the name of the listeners' lease, which an event written delivered must find unheld
/// ([`FinishRequest::event_delivered`] is the runtime's view of it, up to a maintenance tick
/// old); `?2` is the time. sqlx binds a batch's `?NNN` parameters per statement and stops at a
/// gap it cannot fill, so every statement uses `?1` and, when it needs the time, `?2`.
/// One row comes back: the status compare-and-swap's count of jobs moved (`changes()` right
/// after it; a row per job would be a message per job, see `one_row`).
const WRITE_SET: &str = "
UPDATE dockhand_item_claims SET status = 'processed', processed_at = ?2, token = NULL
 WHERE id IN (SELECT value FROM json_each(?1, '$.processed'));
DELETE FROM dockhand_item_claims WHERE id IN (SELECT value FROM json_each(?1, '$.deleted'));
DELETE FROM dockhand_item_claims
 WHERE job_id IN (SELECT value FROM json_each(?1, '$.released')) AND status = 'claimed';
UPDATE dockhand_jobs SET status = m.status, reason = m.reason, finished_at = ?2, updated_at = ?2
  FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.status') AS status,
               json_extract(value, '$.reason') AS reason, json_extract(value, '$.was') AS was
        FROM json_each(?1, '$.moves')) AS m
 WHERE dockhand_jobs.id = m.id AND dockhand_jobs.status = m.was;
SELECT changes();
INSERT INTO dockhand_job_events (job_id, status, reason, created_at, delivered_at)
 SELECT json_extract(value, '$.id'), json_extract(value, '$.status'),
        json_extract(value, '$.reason'), ?2,
        CASE WHEN json_extract(value, '$.delivered')
                  AND NOT EXISTS (SELECT 1 FROM dockhand_maintenance_leases
                                  WHERE task = json_extract(?1, '$.listeners') AND until > ?2)
             THEN ?2 END
 FROM json_each(?1, '$.moves') WHERE true
 ON CONFLICT (job_id) DO UPDATE SET status = excluded.status,
     reason = excluded.reason, created_at = excluded.created_at,
     delivered_at = excluded.delivered_at";

/// Writes the group's settles, releases, final statuses and events ([`WRITE_SET`]). The event
/// is one per job (unique `job_id`), replaced when a row is already there, as the single path
/// does; undelivered unless its request writes it delivered
/// ([`FinishRequest::event_delivered`]).
async fn write_set(
    tx: &mut SqliteConnection,
    settles: &Settles,
    released: &[i64],
    moves: &[Transition<'_>],
    now: DateTime<Utc>,
) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Lists<'a> {
        processed: &'a [i64],
        deleted: &'a [i64],
        released: &'a [i64],
        moves: &'a [Transition<'a>],
        listeners: &'static str,
    }
    let lists = Lists {
        processed: &settles.processed,
        deleted: &settles.deleted,
        released,
        moves,
        listeners: LISTENERS_TASK,
    };
    // `fetch_all`: every statement of the batch runs (a stream dropped after its first row
    // would leave the ones after it unsent).
    let counts: Vec<i64> = sqlx::query_scalar(WRITE_SET)
        .bind(json(&lists, "finish lists")?)
        .bind(ms(now))
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs"))?;
    let moved = counts.first().copied().unwrap_or(-1);
    if counts.len() != 1 || usize::try_from(moved).ok() != Some(moves.len()) {
        // Unreachable under the write lock; never report a write that did not happen.
        return Err(Error::Config(format!(
            "finish_jobs: {moved} of {} jobs moved under the write lock",
            moves.len()
        )));
    }
    Ok(())
}

/// The group's part of a [`crate::Store::finish_jobs`] transaction, set-based (module docs).
/// The parents' counters are left to the caller ([`GroupOutcomes::parents`]).
pub(super) async fn finish_set(
    tx: &mut SqliteConnection,
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
    // The claims of every held success request are read with the jobs; those of a job found
    // final are not used.
    let succeeding: Vec<i64> = reqs
        .iter()
        .zip(&held)
        .filter(|(r, h)| **h && r.status.is_success())
        .map(|(r, _)| r.job_id)
        .collect();
    let ReadSet { jobs, mut claims } = read_set(tx, &ids, &succeeding).await?;
    let Plan { group, moves: plan } = plan(reqs, &held, &jobs)?;
    let mut settles = Settles::default();
    let mut released = Vec::new();
    let mut moves = Vec::with_capacity(plan.len());
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
        moves.push(Transition {
            id: m.job_id,
            status: m.status.as_str(),
            reason: m.reason,
            was: m.was.as_str(),
            delivered: m.event_delivered,
        });
    }
    write_set(tx, &settles, &released, &moves, now).await?;
    Ok(SetFinished::Written(group))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::JobStatus;

    #[test]
    fn transitions_serialize_with_the_names_the_update_reads() {
        let t = Transition {
            id: 7,
            status: JobStatus::Completed.as_str(),
            reason: None,
            was: JobStatus::Processing.as_str(),
            delivered: false,
        };
        let text = json(&[t], "t").unwrap();
        assert_eq!(
            text,
            r#"[{"id":7,"status":"completed","reason":null,"was":"processing","delivered":false}]"#
        );
    }
}
