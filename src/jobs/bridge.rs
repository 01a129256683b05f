//! The terminal bridge (J4): [`finish`] is the one function through which every final job
//! status is written — success, ordinary failure, manual fail, retry exhaustion, stale
//! recovery and cancellation alike.
//!
//! One store transaction locks the job, completes (success) or releases (failure) its claims,
//! writes the status with a compare-and-swap and records the lifecycle event in the outbox.
//! When a success cannot complete its claims, that transaction rolls back whole and the job is
//! finished `failed / item_claim_completion_failed` instead, which releases the claims.
//! Lifecycle hooks run from the outbox after commit ([`super::engine::Engine::deliver_events`]).

use super::BridgeOutcome;
use crate::claims::CompletionRegistry;
use crate::error::Result;
use crate::state::JobStatus;
use crate::store::DynStore;
use chrono::{DateTime, Utc};

/// Reason codes written by dockhand itself.
pub mod reason {
    /// A success could not complete the job's claims.
    pub const ITEM_CLAIM_COMPLETION_FAILED: &str = "item_claim_completion_failed";
    /// A step failed on its last attempt.
    pub const RETRY_EXHAUSTED: &str = "retry_exhausted";
    /// A step failed with a fatal error.
    pub const STEP_FAILED: &str = "step_failed";
    /// An operator failed or cancelled the job.
    pub const MANUAL: &str = "manual";
    /// Recovery found the job without a way forward.
    pub const STALE: &str = "stale";
    /// The job names a pipeline or step this runtime does not have, or its input is unreadable.
    pub const UNRUNNABLE: &str = "unrunnable";
}

/// What the bridge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The job's final status now.
    pub status: JobStatus,
    /// Its reason.
    pub reason: Option<String>,
    /// False when the job was already final (nothing was written). With the same status as
    /// requested that is success (idempotent); with another, the first status stands.
    pub changed: bool,
}

/// Finishes `job_id` with `status` (final) and `reason`. Idempotent: finishing an already
/// final job writes nothing and reports the standing status with `changed = false`.
pub async fn finish(
    store: &DynStore,
    completions: &CompletionRegistry,
    job_id: i64,
    status: JobStatus,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Finished> {
    let outcome = store
        .finish_job(job_id, status, reason, completions, now)
        .await?;
    crate::failpoint::crash("bridge.after_commit");
    match outcome {
        BridgeOutcome::Finished => Ok(Finished {
            status,
            reason: reason.map(str::to_string),
            changed: true,
        }),
        BridgeOutcome::AlreadyFinal { status, reason } => Ok(Finished {
            status,
            reason,
            changed: false,
        }),
        BridgeOutcome::ClaimCompletionFailed { error } => {
            tracing::warn!(job_id, %error, "claim completion failed; finishing the job failed");
            let r = reason::ITEM_CLAIM_COMPLETION_FAILED;
            match store
                .finish_job(job_id, JobStatus::Failed, Some(r), completions, now)
                .await?
            {
                BridgeOutcome::Finished => Ok(Finished {
                    status: JobStatus::Failed,
                    reason: Some(r.to_string()),
                    changed: true,
                }),
                BridgeOutcome::AlreadyFinal { status, reason } => Ok(Finished {
                    status,
                    reason,
                    changed: false,
                }),
                BridgeOutcome::ClaimCompletionFailed { error } => {
                    Err(crate::Error::Config(format!(
                        "job {job_id}: the failure path reported a claim completion error: {error}"
                    )))
                }
            }
        }
    }
}
