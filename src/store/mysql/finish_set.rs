//! MySQL: a grouped bridge finish ([`crate::Store::finish_jobs`]) written set-based on the open
//! transaction. The single path ([`super::bridge::finish_in_tx`]) spends about eight statements
//! per job (the step run's acknowledgement, the superseded-claims read, the job read, its claims
//! read, one settle per claim, the status write, the event) while its siblings' rows stay
//! locked; here a group of any size costs about eight in all: the jobs locked and read, the step
//! runs' acknowledgements (locked and decided as a batched acknowledgement is), the group's
//! claims locked and read, then one `DELETE` for every claim that goes (superseded, released,
//! completed without a retained row), one `UPDATE` for the processed ones, one status
//! compare-and-swap per distinct (status, reason, was) and one multi-row event insert.
//!
//! Lock order is the single path's: the jobs (id order), their step actions, their claims (id
//! order); the parents' counters are left to the caller. The decisions are the single path's
//! too, per request in job order (as the PostgreSQL and SQLite `finish_set`): a lost lease
//! leaves its job alone; a held run's superseded claims go first, whatever the job's state; a
//! job already final (or finished earlier in the same group) is [`InTx::AlreadyFinal`]; success
//! completes the job's claims (a claim with a completion handler runs it and is settled at once
//! on the same transaction; the handler-less ones are settled together), failure releases them.

use super::claim::{push_in, push_list};
use super::claims::{config_from, settle};
use super::finish::finish_chunk;
use super::jobs::{job_from_row, opt_text, text, JOB_COLUMNS};
use super::ms;
use crate::claims::completion::run_in_tx;
use crate::claims::{CompletionContext, CompletionRegistry, CompletionTx, Identity};
use crate::error::{Error, Result};
use crate::jobs::listeners::LISTENERS_TASK;
use crate::jobs::{FinishRequest, Job};
use crate::store::finish_group::{all_moved, plan, roll_back_on, Completed, Plan, SetFinished};
use crate::store::{Finish, FinishResult, Lease};
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Ids per `IN (…)` list of the claim writes.
const IDS_PER_STATEMENT: usize = 1_000;

/// Locks the group's job rows in id order and reads them.
async fn lock_jobs(tx: &mut MySqlConnection, reqs: &[FinishRequest]) -> Result<HashMap<i64, Job>> {
    let mut ids: Vec<i64> = reqs.iter().map(|r| r.job_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE id IN ("
    ));
    push_list(&mut qb, &ids);
    qb.push(") ORDER BY id FOR UPDATE");
    let rows = qb
        .build()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs (jobs)"))?;
    rows.iter()
        .map(|row| job_from_row(row).map(|j| (j.id, j)))
        .collect()
}

/// Which requests' step runs still hold their leases; the `complete_run` ones are completed
/// under them together, as a batched acknowledgement (a lost one gets its `lease_lost` log
/// row; a lease named twice is completed once, the second request finding it lost).
async fn runs_held(
    tx: &mut MySqlConnection,
    reqs: &[FinishRequest],
    now: DateTime<Utc>,
) -> Result<Vec<bool>> {
    let completing: Vec<(Lease, Finish)> = reqs
        .iter()
        .filter(|r| r.complete_run)
        .filter_map(|r| r.lease.map(|l| (l, Finish::Complete)))
        .collect();
    let completed = match completing.is_empty() {
        true => Vec::new(),
        false => finish_chunk(tx, &completing, now).await?,
    };
    let mut completed = completed.into_iter();
    let mut held = Vec::with_capacity(reqs.len());
    for r in reqs {
        let ok = match r.lease {
            None => true,
            Some(_) if r.complete_run => {
                matches!(completed.next(), Some(FinishResult::Applied))
            }
            Some(l) => super::lease_fence::lease_live(tx, l, "finish_jobs (lease)").await?,
        };
        held.push(ok);
    }
    Ok(held)
}

/// A claimed claim of one of the group's jobs, as read (locked).
struct ClaimRow {
    id: i64,
    token: Option<String>,
    taken_by: TakenBy,
    row: MySqlRow,
}

/// The claimed claims of `jobs`, locked in id order, by job (oldest first). By the
/// `(job_id, status)` index, forced: with a list of jobs MariaDB chose a `status` index and
/// walked (and waited to lock) every claimed row, the parent's too, which concurrent chunks
/// hold while they hand them over (221 ms per group with four chunk lanes).
async fn read_claims(
    tx: &mut MySqlConnection,
    jobs: &[i64],
) -> Result<HashMap<i64, Vec<ClaimRow>>> {
    let mut by_job: HashMap<i64, Vec<ClaimRow>> = HashMap::new();
    if jobs.is_empty() {
        return Ok(by_job);
    }
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT id, job_id, scope, source_type, item_id, token, completion,
                run_step, run_action, run_token
         FROM dockhand_item_claims FORCE INDEX (dockhand_item_claims_job)
         WHERE status = 'claimed' AND job_id IN (",
    );
    push_list(&mut qb, jobs);
    qb.push(") ORDER BY id FOR UPDATE");
    let rows = qb
        .build()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("finish_jobs (claims)"))?;
    let d = || Error::db("decode item claim");
    for row in rows {
        let job: i64 = row.try_get("job_id").map_err(d())?;
        let claim = ClaimRow {
            id: row.try_get("id").map_err(d())?,
            token: opt_text(&row, "token")?,
            taken_by: (
                row.try_get("run_step").map_err(d())?,
                row.try_get("run_action").map_err(d())?,
                row.try_get("run_token").map_err(d())?,
            ),
            row,
        };
        by_job.entry(job).or_default().push(claim);
    }
    Ok(by_job)
}

/// The step run a claim records taking it: `run_step`, `run_action`, `run_token`.
type TakenBy = (Option<i32>, Option<i64>, Option<i64>);

/// Whether a claim taken by `run` (holding `token`) is one another run of `step` took (SQL's
/// `run_step = ? AND (run_action <> ? OR run_token <> ?)`, NULLs matching nothing) that the
/// finishing output does not keep.
fn superseded(
    run: TakenBy,
    token: Option<&String>,
    step: i32,
    lease: Lease,
    keep: &[String],
) -> bool {
    let (run_step, run_action, run_token) = run;
    let other_run =
        run_action.is_some_and(|a| a != lease.id) || run_token.is_some_and(|t| t != lease.token);
    run_step == Some(step) && other_run && !token.is_some_and(|t| keep.contains(t))
}

/// The claim writes a group collects before it writes them together.
#[derive(Default)]
struct ClaimWrites {
    /// Claims deleted: superseded, released, or completed without a retained row.
    deleted: Vec<i64>,
    /// Handler-less claims completed with a retained (processed) row.
    processed: Vec<i64>,
}

/// Completes one succeeding job's claims: a claim with a handler runs it and is settled at
/// once; the others go to `writes`. `Ok(Err(_))`: a completion failed for good (the caller
/// rolls back).
async fn complete_claims(
    tx: &mut MySqlConnection,
    job_id: i64,
    claims: &[ClaimRow],
    completions: &CompletionRegistry,
    writes: &mut ClaimWrites,
    now: DateTime<Utc>,
) -> Completed {
    for c in claims {
        let row = &c.row;
        let identity = Identity {
            scope: text(row, "scope")?,
            source_type: text(row, "source_type")?,
            item_id: text(row, "item_id")?,
        };
        let item = &identity.item_id;
        let completion = opt_text(row, "completion")?;
        let config = match config_from(c.id, completion.as_deref()) {
            Ok(config) => config,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        let handler = match completions.resolve(&config) {
            Ok(h) => h,
            Err(e) => return Ok(Err(format!("item {item}: {e}"))),
        };
        let Some(handler) = handler else {
            if config.retain_processed {
                writes.processed.push(c.id);
            } else {
                writes.deleted.push(c.id);
            }
            continue;
        };
        let ctx = CompletionContext {
            token: c.token.clone().unwrap_or_default(),
            job_id: Some(job_id),
            payload: config.payload.clone(),
            now,
            identity,
        };
        // A transient failure is the error: the caller's transaction is re-run whole.
        if let Err(failed) =
            run_in_tx(handler.as_ref(), CompletionTx::MySql(&mut *tx), &ctx).await?
        {
            return Ok(Err(failed));
        }
        settle(tx, c.id, config.retain_processed, now).await?;
    }
    Ok(Ok(()))
}

/// One final status a group writes: (status, reason, the status it replaces) → job ids.
type Moves = BTreeMap<(&'static str, Option<String>, &'static str), Vec<i64>>;

/// The group's claim and job writes, set-based; returns how many jobs moved.
async fn write_set(
    tx: &mut MySqlConnection,
    writes: &ClaimWrites,
    moves: &Moves,
    events: &[(i64, &'static str, Option<String>, bool)],
    now: DateTime<Utc>,
) -> Result<u64> {
    let op = "finish_jobs";
    for chunk in writes.deleted.chunks(IDS_PER_STATEMENT) {
        let mut qb = QueryBuilder::<MySql>::new("DELETE FROM dockhand_item_claims WHERE id");
        push_in(&mut qb, chunk);
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_jobs (claims)"))?;
    }
    for chunk in writes.processed.chunks(IDS_PER_STATEMENT) {
        let mut qb = QueryBuilder::<MySql>::new(
            "UPDATE dockhand_item_claims SET status = 'processed', token = NULL, processed_at = ",
        );
        qb.push_bind(ms(now)).push(" WHERE id");
        push_in(&mut qb, chunk);
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_jobs (claims)"))?;
    }
    let mut moved = 0;
    for ((status, reason, was), ids) in moves {
        let mut qb = QueryBuilder::<MySql>::new("UPDATE dockhand_jobs SET status = ");
        qb.push_bind(*status)
            .push(", reason = ")
            .push_bind(reason.as_deref())
            .push(", finished_at = ")
            .push_bind(ms(now))
            .push(", updated_at = ")
            .push_bind(ms(now))
            .push(" WHERE status = ")
            .push_bind(*was)
            .push(" AND id");
        push_in(&mut qb, ids);
        moved += qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?
            .rows_affected();
    }
    // An event is written delivered only if its request says so (the runtime's view of the
    // listeners' lease, up to a maintenance tick old) and no runtime holds that lease now: a
    // locking read sees the latest lease and holds it until this transaction commits.
    let unheard = !events.iter().any(|e| e.3) || !listened(tx, now).await?;
    if !events.is_empty() {
        // As the single path: an event row already there describes no finish that happened
        // (one per job, written only on the move to final), so it is replaced: undelivered, or
        // delivered when the request writes it so (`FinishRequest::event_delivered`).
        let mut qb = QueryBuilder::<MySql>::new(
            "INSERT INTO dockhand_job_events (job_id, status, reason, created_at, delivered_at) ",
        );
        qb.push_values(events, |mut b, (id, status, reason, delivered)| {
            b.push_bind(*id)
                .push_bind(*status)
                .push_bind(reason.as_deref())
                .push_bind(ms(now))
                .push_bind((*delivered && unheard).then(|| ms(now)));
        });
        qb.push(
            " ON DUPLICATE KEY UPDATE status = VALUES(status), reason = VALUES(reason),
              created_at = VALUES(created_at), delivered_at = VALUES(delivered_at)",
        );
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_jobs (events)"))?;
    }
    Ok(moved)
}

/// Whether a runtime holds the listeners' lease at `now` (a locking read, see `write_set`).
async fn listened(tx: &mut MySqlConnection, now: DateTime<Utc>) -> Result<bool> {
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM dockhand_maintenance_leases WHERE task = ? AND until > ?
         LOCK IN SHARE MODE",
    )
    .bind(LISTENERS_TASK.as_bytes())
    .bind(ms(now))
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("finish_jobs (listeners)"))?;
    Ok(held.is_some())
}

/// The group's part of a [`crate::Store::finish_jobs`] transaction, set-based (module docs).
/// The parents' counters are left to the caller ([`GroupOutcomes::parents`]).
pub(super) async fn finish_set(
    tx: &mut MySqlConnection,
    reqs: &[FinishRequest],
    completions: &CompletionRegistry,
    now: DateTime<Utc>,
) -> Result<SetFinished> {
    let jobs = lock_jobs(tx, reqs).await?;
    let held = runs_held(tx, reqs, now).await?;
    let mut held_jobs: Vec<i64> = reqs
        .iter()
        .zip(&held)
        .filter(|(_, h)| **h)
        .map(|(r, _)| r.job_id)
        .collect();
    held_jobs.sort_unstable();
    held_jobs.dedup();
    let mut claims = read_claims(tx, &held_jobs).await?;
    let mut writes = ClaimWrites::default();
    // The superseded claims of every held run go first, as the single path releases them
    // before it looks at the job.
    let mut gone: HashSet<i64> = HashSet::new();
    for (r, _) in reqs.iter().zip(&held).filter(|(_, h)| **h) {
        let (Some(lease), Some(s)) = (r.lease, r.superseded.as_ref()) else {
            continue;
        };
        for c in claims.get(&r.job_id).into_iter().flatten() {
            if superseded(c.taken_by, c.token.as_ref(), s.step, lease, &s.keep) && gone.insert(c.id)
            {
                writes.deleted.push(c.id);
            }
        }
    }
    for owned in claims.values_mut() {
        owned.retain(|c| !gone.contains(&c.id));
    }
    let Plan { group, moves: plan } = plan(reqs, &held, &jobs)?;
    let mut moves = Moves::new();
    let mut events = Vec::with_capacity(plan.len());
    for m in plan {
        let owned = claims.remove(&m.job_id).unwrap_or_default();
        if m.status.is_success() {
            let done = complete_claims(tx, m.job_id, &owned, completions, &mut writes, now).await;
            if let Some(rb) = roll_back_on(m.job_id, done)? {
                return Ok(SetFinished::RollBack(rb));
            }
        } else {
            writes.deleted.extend(owned.iter().map(|c| c.id));
        }
        let reason = m.reason.map(str::to_string);
        moves
            .entry((m.status.as_str(), reason.clone(), m.was.as_str()))
            .or_default()
            .push(m.job_id);
        events.push((m.job_id, m.status.as_str(), reason, m.event_delivered));
    }
    let moved = write_set(tx, &writes, &moves, &events, now).await?;
    all_moved("finish_jobs", moved, events.len())?;
    Ok(SetFinished::Written(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superseded_is_another_run_of_the_step_not_kept_nulls_matching_nothing() {
        let lease = Lease { id: 7, token: 3 };
        let keep = vec!["kept".to_string()];
        let (t, k) = ("tok".to_string(), "kept".to_string());
        // (taken by, token, superseded?)
        let cases: [(TakenBy, &String, bool); 8] = [
            // Another action, or the same action under another token: superseded.
            ((Some(1), Some(8), Some(3)), &t, true),
            ((Some(1), Some(7), Some(4)), &t, true),
            ((Some(1), None, Some(4)), &t, true),
            // This run's own claim, another step's, no run recorded, or kept by the output.
            ((Some(1), Some(7), Some(3)), &t, false),
            ((Some(2), Some(8), Some(3)), &t, false),
            ((None, Some(8), Some(9)), &t, false),
            ((Some(1), None, None), &t, false),
            ((Some(1), Some(8), Some(3)), &k, false),
        ];
        for (run, token, want) in cases {
            assert_eq!(
                superseded(run, Some(token), 1, lease, &keep),
                want,
                "{run:?} {token}"
            );
        }
    }
}
