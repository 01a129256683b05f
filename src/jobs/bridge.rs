//! The terminal bridge (J4): [`finish`] is the one function through which every final job
//! status is written — success, ordinary failure, manual fail, retry exhaustion, stale
//! recovery and cancellation alike.
//!
//! One store transaction locks the job, completes (success) or releases (failure) its claims,
//! writes the status with a compare-and-swap and records the lifecycle event in the outbox.
//! When a success cannot complete its claims, that transaction rolls back whole and the job is
//! finished `failed / item_claim_completion_failed` instead, which releases the claims.
//! Lifecycle hooks run from the outbox after commit ([`super::engine::Engine::deliver_events`]).
//!
//! [`finish_runs`] is the same bridge for several step runs at once (the engine's group commit
//! of concurrently finishing steps, `jobs::grouped`): one store transaction
//! ([`crate::Store::finish_jobs`]), each job guarded by its step run's lease; when completing a
//! claim fails anywhere in the group, every job of it goes through [`finish`] alone instead.

use super::{BridgeOutcome, FinishRequest, GroupFinished};
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
                BridgeOutcome::LeaseLost { .. } => Err(unguarded_lease_lost(job_id)),
            }
        }
        BridgeOutcome::LeaseLost { .. } => Err(unguarded_lease_lost(job_id)),
    }
}

/// `finish_job` is not lease-guarded: a lease-lost outcome from it is a store bug.
fn unguarded_lease_lost(job_id: i64) -> crate::Error {
    crate::Error::Config(format!(
        "job {job_id}: an unguarded finish reported a lost lease"
    ))
}

/// What [`finish_runs`] did for one step run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunFinished {
    /// The bridge ran: see [`Finished`].
    Done {
        /// What the bridge did with the job.
        finished: Finished,
        /// Whether the request's step action was completed in the same transaction
        /// ([`FinishRequest::complete_run`]); false when the job was finished alone through
        /// [`finish`] (the fallback), which leaves the acknowledgement to the runner.
        run_completed: bool,
    },
    /// The run no longer holds its step action's lease: nothing was written for its job (a
    /// newer run of the step, or the reaper's follow-up, owns it now).
    LeaseLost {
        /// The step action.
        action_id: i64,
        /// The token the run held.
        token: i64,
    },
}

/// Finishes several step runs' jobs through the bridge in one store transaction
/// ([`crate::Store::finish_jobs`]); one result per request, in order. Each request names the
/// finishing run's lease: a run that lost it gets [`RunFinished::LeaseLost`] and its job is
/// left alone. When completing a claim failed for any job the store wrote nothing, and each
/// job is finished alone through [`finish`] (which downgrades the failing one to
/// `failed / item_claim_completion_failed`); so it is when the group call fails (a database
/// error) and the group has more than one request, so that one job's error is not every
/// job's. A group of one returns the store's error as it is.
pub async fn finish_runs(
    store: &DynStore,
    completions: &CompletionRegistry,
    reqs: &[FinishRequest],
    now: DateTime<Utc>,
) -> Vec<Result<RunFinished>> {
    let group = store.finish_jobs(reqs, completions, now).await;
    crate::failpoint::crash("bridge.after_commit");
    match group {
        Ok(GroupFinished::Committed(outcomes)) if outcomes.len() == reqs.len() => reqs
            .iter()
            .zip(outcomes)
            .map(|(r, o)| committed(r, o))
            .collect(),
        Ok(GroupFinished::Committed(outcomes)) => {
            let n = reqs.len();
            let got = outcomes.len();
            reqs.iter()
                .map(|r| {
                    Err(crate::Error::Config(format!(
                        "job {}: finish_jobs answered {got} of {n} requests",
                        r.job_id
                    )))
                })
                .collect()
        }
        Ok(GroupFinished::RolledBack { job_id, error }) => {
            tracing::info!(job_id, %error, jobs = reqs.len(), "claim completion failed in a grouped finish; finishing each job alone");
            finish_each(store, completions, reqs, now).await
        }
        Err(e) if reqs.len() == 1 => vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, jobs = reqs.len(), "grouped finish failed; finishing each job alone");
            finish_each(store, completions, reqs, now).await
        }
    }
}

/// The fallback of [`finish_runs`]: each job alone. In a group of several, each job is first
/// finished as a group of one (still guarded by its run's lease); only a job whose claim
/// completion fails alone (or a group of one) goes through [`finish`], the single path that
/// re-runs transient failures and downgrades the job to `failed / item_claim_completion_failed`.
async fn finish_each(
    store: &DynStore,
    completions: &CompletionRegistry,
    reqs: &[FinishRequest],
    now: DateTime<Utc>,
) -> Vec<Result<RunFinished>> {
    let mut out = Vec::with_capacity(reqs.len());
    for r in reqs {
        if reqs.len() > 1 {
            match store
                .finish_jobs(std::slice::from_ref(r), completions, now)
                .await
            {
                Ok(GroupFinished::Committed(o)) => {
                    out.push(match o.into_iter().next() {
                        Some(o) => committed(r, o),
                        None => Err(crate::Error::Config(format!(
                            "job {}: finish_jobs answered no outcome",
                            r.job_id
                        ))),
                    });
                    continue;
                }
                Ok(GroupFinished::RolledBack { .. }) => {}
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            }
        }
        let done = finish(
            store,
            completions,
            r.job_id,
            r.status,
            r.reason.as_deref(),
            now,
        )
        .await;
        out.push(done.map(|finished| RunFinished::Done {
            finished,
            run_completed: false,
        }));
    }
    out
}

/// A committed outcome of `r` as a [`RunFinished`].
fn committed(r: &FinishRequest, outcome: BridgeOutcome) -> Result<RunFinished> {
    match outcome {
        BridgeOutcome::Finished => Ok(RunFinished::Done {
            finished: Finished {
                status: r.status,
                reason: r.reason.clone(),
                changed: true,
            },
            run_completed: r.complete_run && r.lease.is_some(),
        }),
        BridgeOutcome::AlreadyFinal { status, reason } => Ok(RunFinished::Done {
            finished: Finished {
                status,
                reason,
                changed: false,
            },
            run_completed: r.complete_run && r.lease.is_some(),
        }),
        BridgeOutcome::LeaseLost { action_id, token } => {
            Ok(RunFinished::LeaseLost { action_id, token })
        }
        BridgeOutcome::ClaimCompletionFailed { error } => Err(crate::Error::Config(format!(
            "job {}: a committed group reported a claim completion failure: {error}",
            r.job_id
        ))),
    }
}
