//! The backend-independent rules of taking a claim (C2, defects 4 and 8 of issue 15), shared by
//! the three `claims` modules: when a claim expires, and when its owning job refuses it; and
//! the planning every backend's `claim_items` shares (its runs and jobs, checked once each, and
//! its rounds of distinct identities).

use crate::claims::{ClaimItemRequest, ClaimOutcome};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// `now + ttl`, the claim's `expires_at`; the TTL must be positive and the sum in range. The
/// claim holds while `now < expires_at` and is expired from `now == expires_at` on.
pub(crate) fn claim_expiry(req: &ClaimItemRequest, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    if req.ttl <= chrono::Duration::zero() {
        return Err(Error::invalid(
            "ttl",
            format!("{} must be positive", req.ttl),
        ));
    }
    now.checked_add_signed(req.ttl)
        .ok_or_else(|| Error::invalid("ttl", format!("{} is out of range", req.ttl)))
}

/// Whether the owning job (read under a share lock in the claim's transaction) refuses the
/// claim: a final job takes no claim; a step run's claim also needs the job `processing` at
/// the run's step (a run whose job moved on is not the job's current run any more).
pub(crate) fn refusal(
    req: &ClaimItemRequest,
    job_id: i64,
    status: JobStatus,
    step_index: i32,
) -> Option<ClaimOutcome> {
    let moved_on = req
        .run
        .is_some_and(|run| status != JobStatus::Processing || step_index != run.step);
    (status.is_final() || moved_on).then_some(ClaimOutcome::JobNotLive {
        job_id,
        status,
        step_index,
    })
}

/// Each request's identity validated and its expiry ([`claim_expiry`]), in order: a bad
/// request fails the whole `claim_items` call before anything is written.
pub(crate) fn expiries(
    reqs: &[ClaimItemRequest],
    now: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>> {
    reqs.iter()
        .map(|r| {
            r.identity.validate()?;
            claim_expiry(r, now)
        })
        .collect()
}

/// The distinct step runs of the requests, by action id (the order rows are locked in).
pub(crate) fn distinct_runs(reqs: &[ClaimItemRequest]) -> Vec<Lease> {
    let runs: BTreeMap<(i64, i64), Lease> = reqs
        .iter()
        .filter_map(|r| {
            r.run
                .map(|run| ((run.lease.id, run.lease.token), run.lease))
        })
        .collect();
    runs.into_values().collect()
}

/// The distinct owning jobs of the requests, ascending (the order rows are locked in).
pub(crate) fn distinct_jobs(reqs: &[ClaimItemRequest]) -> Vec<i64> {
    let jobs: BTreeSet<i64> = reqs.iter().filter_map(|r| r.job_id).collect();
    jobs.into_iter().collect()
}

/// [`refusal`] of one request by its job's state as read (a job id with no row refuses
/// nothing).
pub(crate) fn refused(
    req: &ClaimItemRequest,
    jobs: &HashMap<i64, (JobStatus, i32)>,
) -> Option<ClaimOutcome> {
    let job_id = req.job_id?;
    let &(status, step_index) = jobs.get(&job_id)?;
    refusal(req, job_id, status, step_index)
}

/// The positions of `todo` in rounds a set-based statement can take at once: round k holds the
/// k-th request of each identity hash, with the same `reprocess` flag (the statement's
/// takeover rule names it once), sorted by hash (the order rows are locked in). Running the
/// rounds in order gives each request the outcome it gets after the ones before it.
pub(crate) fn rounds(
    reqs: &[ClaimItemRequest],
    hashes: &[String],
    todo: &[usize],
) -> Vec<(bool, Vec<usize>)> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut by_round: BTreeMap<(usize, bool), Vec<usize>> = BTreeMap::new();
    for &at in todo {
        let k = seen.entry(hashes[at].as_str()).or_insert(0);
        by_round
            .entry((*k, reqs[at].reprocess))
            .or_default()
            .push(at);
        *k += 1;
    }
    // A repeated identity's later request must see the earlier one: (k, false) and (k, true)
    // both run before k + 1, and an identity appears once per k.
    by_round
        .into_iter()
        .map(|((_, reprocess), mut ats)| {
            ats.sort_by(|&a, &b| hashes[a].cmp(&hashes[b]));
            (reprocess, ats)
        })
        .collect()
}
