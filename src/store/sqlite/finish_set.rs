//! SQLite: a grouped bridge finish ([`crate::Store::finish_jobs`]) written set-based on the
//! open write transaction. The single path ([`super::bridge::finish_in_tx`]) spends 6-7
//! statements per job; here a group of any size costs one statement per kind of write: the step
//! runs' acknowledgements, the jobs read, their claims read, the claims settled (processed,
//! deleted) and released, the status compare-and-swap and the lifecycle events. Every statement
//! is one hop to sqlx's worker thread, and the one writer runs them all, so this is what a
//! batch's children cost the writer.
//!
//! The decisions are the single path's, per request in job order: a lost lease leaves its job
//! alone, a job already final (or finished earlier in the same group) is
//! [`InTx::AlreadyFinal`], success completes the job's claims (a claim with a completion handler
//! runs it and is settled at once, on the same transaction, as the single path does; the
//! handler-less ones are settled together), failure releases them.

use super::claims::{config_from, settle};
use super::finish::{complete_set_sql, log};
use super::jobs::{job_from_row, JOB_COLUMNS};
use super::ms;
use crate::claims::completion::run_in_tx;
use crate::claims::{CompletionContext, CompletionRegistry, CompletionTx, Identity};
use crate::error::{Error, Result};
use crate::jobs::{FinishRequest, Job};
use crate::state::JobStatus;
use crate::store::finish_group::{job_order, GroupOutcomes, InTx, RollBack};
use crate::store::Finish;
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};
use std::collections::{HashMap, HashSet};

/// What a set-based group finish did on the transaction.
pub(super) enum SetFinished {
    /// Every request's part is written (uncommitted): the outcomes, and the parents to bump.
    Written(GroupOutcomes),
    /// A claim completion failed: the caller must roll back.
    RollBack(RollBack),
}

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
            Some(l) => super::grouped::lease_live(tx, l).await?,
        };
        held.push(ok);
    }
    Ok(held)
}

/// The group's jobs by id, read in one statement.
async fn read_jobs(tx: &mut SqliteConnection, ids: &[i64]) -> Result<HashMap<i64, Job>> {
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE id IN (SELECT value FROM json_each(?))"
    ))
    .bind(json(&ids, "job ids")?)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (jobs)"))?;
    rows.iter()
        .map(|row| job_from_row(row).map(|j| (j.id, j)))
        .collect()
}

/// One claim a finishing job owns.
struct OwnedClaim {
    id: i64,
    identity: Identity,
    token: Option<String>,
    completion: Option<String>,
}

/// The claims the group's succeeding jobs own, by job, oldest first, in one statement.
async fn read_claims(
    tx: &mut SqliteConnection,
    jobs: &[i64],
) -> Result<HashMap<i64, Vec<OwnedClaim>>> {
    let mut by_job: HashMap<i64, Vec<OwnedClaim>> = HashMap::new();
    if jobs.is_empty() {
        return Ok(by_job);
    }
    let rows = sqlx::query(
        "SELECT id, job_id, scope, source_type, item_id, token, completion
         FROM dockhand_item_claims
         WHERE job_id IN (SELECT value FROM json_each(?)) AND status = 'claimed'
         ORDER BY id",
    )
    .bind(json(&jobs, "job ids")?)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (claims)"))?;
    let d = || Error::db("decode item claim");
    for row in rows {
        let job: i64 = row.try_get("job_id").map_err(d())?;
        by_job.entry(job).or_default().push(OwnedClaim {
            id: row.try_get("id").map_err(d())?,
            identity: Identity {
                scope: row.try_get("scope").map_err(d())?,
                source_type: row.try_get("source_type").map_err(d())?,
                item_id: row.try_get("item_id").map_err(d())?,
            },
            token: row.try_get("token").map_err(d())?,
            completion: row.try_get("completion").map_err(d())?,
        });
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
    tx: &mut SqliteConnection,
    job_id: i64,
    claims: Vec<OwnedClaim>,
    completions: &CompletionRegistry,
    settles: &mut Settles,
    now: DateTime<Utc>,
) -> Result<std::result::Result<(), String>> {
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
}

/// The group's writes, each kind in one statement.
async fn write_set(
    tx: &mut SqliteConnection,
    settles: &Settles,
    released: &[i64],
    moves: &[Transition<'_>],
    now: DateTime<Utc>,
) -> Result<()> {
    let op = "finish_jobs";
    let now_ms = ms(now);
    if !settles.processed.is_empty() {
        sqlx::query(
            "UPDATE dockhand_item_claims SET status = 'processed', processed_at = ?, token = NULL
             WHERE id IN (SELECT value FROM json_each(?))",
        )
        .bind(now_ms)
        .bind(json(&settles.processed, "claim ids")?)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs (settle)"))?;
    }
    if !settles.deleted.is_empty() {
        sqlx::query(
            "DELETE FROM dockhand_item_claims WHERE id IN (SELECT value FROM json_each(?))",
        )
        .bind(json(&settles.deleted, "claim ids")?)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs (settle)"))?;
    }
    if !released.is_empty() {
        sqlx::query(
            "DELETE FROM dockhand_item_claims
             WHERE job_id IN (SELECT value FROM json_each(?)) AND status = 'claimed'",
        )
        .bind(json(&released, "job ids")?)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs (release claims)"))?;
    }
    if moves.is_empty() {
        return Ok(());
    }
    let moves_json = json(&moves, "job transitions")?;
    let done = sqlx::query(
        "UPDATE dockhand_jobs SET status = m.status, reason = m.reason, finished_at = ?1,
             updated_at = ?1
         FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.status') AS status,
                      json_extract(value, '$.reason') AS reason, json_extract(value, '$.was') AS was
               FROM json_each(?2)) AS m
         WHERE dockhand_jobs.id = m.id AND dockhand_jobs.status = m.was",
    )
    .bind(now_ms)
    .bind(&moves_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if done.rows_affected() != moves.len() as u64 {
        // Unreachable under the write lock; never report a write that did not happen.
        return Err(Error::Config(format!(
            "finish_jobs: {} of {} jobs changed under the write lock",
            moves.len() as u64 - done.rows_affected(),
            moves.len()
        )));
    }
    // One event per job (unique job_id), replaced undelivered when a row is already there (as
    // the single path does).
    sqlx::query(
        "INSERT INTO dockhand_job_events (job_id, status, reason, created_at)
         SELECT json_extract(value, '$.id'), json_extract(value, '$.status'),
                json_extract(value, '$.reason'), ?1
         FROM json_each(?2) WHERE true
         ON CONFLICT (job_id) DO UPDATE SET status = excluded.status,
             reason = excluded.reason, created_at = excluded.created_at, delivered_at = NULL",
    )
    .bind(now_ms)
    .bind(&moves_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (events)"))?;
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
    let mut group = GroupOutcomes::new(reqs.len());
    let mut settles = Settles::default();
    let mut released = Vec::new();
    let mut moves = Vec::new();
    // Jobs this group finished: a later request for the same job finds it final.
    let mut finished: HashMap<i64, (JobStatus, Option<String>)> = HashMap::new();
    for i in job_order(reqs.iter().map(|r| r.job_id)) {
        let r = &reqs[i];
        if !held[i] {
            if let Some(lease) = r.lease {
                group.lease_lost(i, lease);
            }
            continue;
        }
        let Some(job) = jobs.get(&r.job_id) else {
            let missing = Err(Error::NotFound {
                what: "job",
                id: r.job_id,
            });
            group.record(i, r, missing)?;
            continue;
        };
        let standing = finished.get(&r.job_id).cloned().or_else(|| {
            job.status
                .is_final()
                .then(|| (job.status, job.reason.clone()))
        });
        if let Some((status, reason)) = standing {
            group.record(i, r, Ok(InTx::AlreadyFinal { status, reason }))?;
            continue;
        }
        if r.status.is_success() {
            let owned = claims.remove(&r.job_id).unwrap_or_default();
            let done = complete_claims(tx, r.job_id, owned, completions, &mut settles, now).await;
            let failed = match done {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(Ok(InTx::ClaimCompletionFailed { error })),
                Err(e) => Some(Err(e)),
            };
            if let Some(done) = failed {
                return match group.record(i, r, done)? {
                    Some(rb) => Ok(SetFinished::RollBack(rb)),
                    None => Err(Error::Config(format!(
                        "finish_jobs: job {}'s failed completion was not a roll back",
                        r.job_id
                    ))),
                };
            }
        } else {
            released.push(r.job_id);
        }
        moves.push(Transition {
            id: r.job_id,
            status: r.status.as_str(),
            reason: r.reason.as_deref(),
            was: job.status.as_str(),
        });
        finished.insert(r.job_id, (r.status, r.reason.clone()));
        group.record(
            i,
            r,
            Ok(InTx::Finished {
                parent: job.parent_id,
            }),
        )?;
    }
    write_set(tx, &settles, &released, &moves, now).await?;
    Ok(SetFinished::Written(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_serialize_with_the_names_the_update_reads() {
        let t = Transition {
            id: 7,
            status: JobStatus::Completed.as_str(),
            reason: None,
            was: JobStatus::Processing.as_str(),
        };
        let text = json(&[t], "t").unwrap();
        assert_eq!(
            text,
            r#"[{"id":7,"status":"completed","reason":null,"was":"processing"}]"#
        );
    }
}
