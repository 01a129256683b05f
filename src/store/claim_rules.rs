//! The backend-independent rules of taking a claim (C2, defects 4 and 8 of issue 15), shared by
//! the three `claims` modules: when a claim expires, and when its owning job refuses it.

use crate::claims::{ClaimItemRequest, ClaimOutcome};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use chrono::{DateTime, Utc};

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
