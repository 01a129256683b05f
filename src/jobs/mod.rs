//! Jobs and pipelines (J1–J7, E1–E3): a job is one run of a pipeline (a named, ordered list of
//! steps registered in code); each step execution is the action `dockhand.job.step {job, step}`.
//!
//! - `pipeline`: pipelines, steps, what a step sees and returns.
//! - `engine`: runs step actions, claims for steps, delivers lifecycle events.
//! - `bridge`: the terminal bridge, the one writer of final statuses.
//! - `finish`: the durable follow-up of a step action that failed for good.
//! - `grouped`: group commit of concurrently running steps' starts and bridge finishes.
//! - `engine_data`: compare-and-swap mutation of a job's JSON document.
//! - `packets`: content-addressed step output.
//! - `api`: the [`api::Jobs`] handle.
//! - this module: the stored job and the requests stores receive.

pub mod api;
pub mod bridge;
pub mod engine;
pub mod engine_data;
pub mod finish;
mod grouped;
pub mod listeners;
pub(crate) mod packet_cache;
pub mod packets;
pub mod pipeline;
pub mod scheduled;
mod step_claims;

use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

/// The hook of the action that runs one step of one job.
pub const STEP_HOOK: &str = "dockhand.job.step";

pub use finish::FINISH_HOOK;
pub use scheduled::SCHEDULED_START_HOOK;

/// A stored job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// Primary key.
    pub id: i64,
    /// The pipeline it runs.
    pub pipeline: String,
    /// Its status.
    pub status: JobStatus,
    /// Why it reached its final status (`retry_exhausted`, `manual`, ...), stored apart.
    pub reason: Option<String>,
    /// The step to run next (or running).
    pub step_index: i32,
    /// Refs of the packets that are the current step's input.
    pub input_refs: Vec<String>,
    /// Engine data version.
    pub engine_version: i64,
    /// Batch parent (issue 4).
    pub parent_id: Option<i64>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// Reached a final status.
    pub finished_at: Option<DateTime<Utc>>,
}

/// What [`crate::Store::start_step`] decided about a delivered step action (the step
/// boundary: a step starts only through it).
#[derive(Debug, Clone, PartialEq)]
pub enum StepStart {
    /// The job is `processing` at this step (moved there from `pending`): run the step.
    Run(Job),
    /// The job already fanned out (it is a batch parent, recognised by its batch row, not by
    /// the attempt number): its batch drives it from here and the step must not run again —
    /// a re-delivery, or an operator's retry of the step action, resumes the batch instead.
    FannedOut(Job),
    /// The job is a batch child whose parent an operator stopped (cancel or manual fail) or
    /// that is final: no step starts; the child is to be cancelled (B5). Nothing was changed.
    ParentStopped(Job),
    /// The job is final, waiting, or at another step: a stale step action, nothing to do.
    Stale,
}

impl StepStart {
    /// A grouped step start's decision for `job` at `step` ([`crate::state::step_gate`] on
    /// what the group read under its locks), and whether the job moves to `processing` now:
    /// those the caller writes with one statement for the group. The job returned to run is
    /// the one that statement leaves (`processing`, updated at `now`).
    pub(crate) fn decide(
        job: &Job,
        step: i32,
        fanned_out: bool,
        parent: Option<crate::state::ParentView<'_>>,
        now: DateTime<Utc>,
    ) -> (StepStart, bool) {
        use crate::state::StepGate;
        match crate::state::step_gate(job.status, job.step_index == step, fanned_out, parent) {
            StepGate::Stale => (StepStart::Stale, false),
            StepGate::ParentStopped => (StepStart::ParentStopped(job.clone()), false),
            StepGate::FannedOut => (StepStart::FannedOut(job.clone()), false),
            StepGate::Run => (StepStart::Run(job.clone()), false),
            StepGate::Start => {
                let mut job = job.clone();
                job.status = JobStatus::Processing;
                job.updated_at = crate::clock::to_millis(now);
                (StepStart::Run(job), true)
            }
        }
    }

    /// The job, unless the action is stale.
    pub fn job(&self) -> Option<&Job> {
        match self {
            StepStart::Run(j) | StepStart::FannedOut(j) | StepStart::ParentStopped(j) => Some(j),
            StepStart::Stale => None,
        }
    }

    /// The job, unless the action is stale.
    pub fn into_job(self) -> Option<Job> {
        match self {
            StepStart::Run(j) | StepStart::FannedOut(j) | StepStart::ParentStopped(j) => Some(j),
            StepStart::Stale => None,
        }
    }
}

/// The template of a job's step actions.
#[derive(Debug, Clone, PartialEq)]
pub struct StepAction {
    /// Priority of the step actions.
    pub priority: i32,
    /// Attempts per step (J6).
    pub max_attempts: i32,
    /// Group of the step actions.
    pub group: Option<String>,
}

impl StepAction {
    /// The group of pipeline `pipeline`'s step and finish actions, `pipeline:<name>`: what
    /// runners route them by (a runtime claims only those of pipelines it has; see
    /// [`crate::store::Routing`]).
    pub fn group_for(pipeline: &str) -> String {
        format!("pipeline:{pipeline}")
    }

    /// The action that runs step `step` of job `job`: hook [`STEP_HOOK`], args
    /// `{"job": job, "step": step}`, unique among active actions per (job, step).
    pub fn action(&self, job: i64, step: i32, now: DateTime<Utc>) -> crate::action::PreparedAction {
        crate::action::PreparedAction {
            hook: STEP_HOOK.to_string(),
            args_json: format!(r#"{{"job":{job},"step":{step}}}"#),
            group: self.group.clone(),
            priority: self.priority,
            scheduled_at: crate::clock::to_millis(now),
            max_attempts: self.max_attempts,
            timeout_ms: None,
            unique_key: Some(step_action_key(job, step)),
            schedule_id: None,
        }
    }
}

/// The unique key of the action that runs step `step` of job `job` ([`StepAction::action`]).
pub(crate) fn step_action_key(job: i64, step: i32) -> String {
    format!("j:{job}:{step}")
}

/// A job to create.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Pipeline name.
    pub pipeline: String,
    /// Refs of the first step's input packets.
    pub input_refs: Vec<String>,
    /// Initial engine data.
    pub engine_data: Value,
    /// Step action template.
    pub step: StepAction,
    /// The caller's idempotency key (`Jobs::start_with`): unique among the jobs of the
    /// pipeline; creating a job whose key is taken creates nothing and returns the id of the
    /// job that holds it. `None` for jobs without one.
    pub idempotency_key: Option<String>,
}

impl NewJob {
    /// The value the database keeps unique for [`NewJob::idempotency_key`]: sha256 of the
    /// pipeline and the key (fixed width on every backend, whatever the key's length).
    pub fn idempotency_hash(&self) -> Option<String> {
        use sha2::{Digest, Sha256};
        self.idempotency_key.as_ref().map(|key| {
            let mut h = Sha256::new();
            h.update(self.pipeline.as_bytes());
            h.update([0u8]);
            h.update(key.as_bytes());
            crate::claims::hex(&h.finalize())
        })
    }
}

/// The schedule a job is started for ([`crate::Store::start_scheduled_job`]).
#[derive(Debug, Clone, Copy)]
pub struct ScheduleGuard<'a> {
    /// The schedule's name; its row is locked for the start's transaction, so two
    /// occurrences of one schedule start one after the other.
    pub schedule: &'a str,
    /// Start nothing while a job this schedule started is not final.
    pub no_overlap: bool,
}

/// What a job start decided, in its one transaction (the stores' shared answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobCreated {
    /// A new job with this id.
    New(i64),
    /// The idempotency key is held by this job: nothing created.
    Existing(i64),
    /// The parent to mark as re-run moved (its engine version changed): nothing created.
    ParentMoved,
    /// No overlap: this job of the schedule is not final yet, nothing created.
    Overlapping(i64),
    /// The schedule no longer exists (unscheduled): nothing created.
    ScheduleGone,
}

/// Filters for listing jobs.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only this pipeline.
    pub pipeline: Option<String>,
    /// Only these statuses (empty = all).
    pub statuses: Vec<JobStatus>,
    /// Page size (default 100 when 0).
    pub limit: i64,
    /// Rows to skip.
    pub offset: i64,
}

/// What the terminal bridge's transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeOutcome {
    /// The job now has the requested final status.
    Finished,
    /// The job was already final: `same` when with the requested status (idempotent success),
    /// otherwise the first status stands.
    AlreadyFinal {
        /// The standing status.
        status: JobStatus,
        /// Its reason.
        reason: Option<String>,
    },
    /// Completing a claim failed on the success path; everything was rolled back.
    ClaimCompletionFailed {
        /// What failed.
        error: String,
    },
    /// Only from [`crate::Store::finish_jobs`]: the finishing step run's lease
    /// ([`FinishRequest::lease`]) is no longer `running` with its token (a newer run owns the
    /// step, or the reaper took it): nothing was written for this job.
    LeaseLost {
        /// The step action.
        action_id: i64,
        /// The token the finishing run held.
        token: i64,
    },
}

/// One job of a [`crate::Store::finish_jobs`] group: what [`crate::Store::finish_job`] gets,
/// plus, optionally, the lease of the step run that finishes it (an owner-guarded finish).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishRequest {
    /// The job.
    pub job_id: i64,
    /// Its final status.
    pub status: JobStatus,
    /// Its reason.
    pub reason: Option<String>,
    /// When set, the job is finished only while this action is still `running` with this
    /// token; otherwise its outcome is [`BridgeOutcome::LeaseLost`] and nothing is written
    /// for the job.
    pub lease: Option<crate::store::Lease>,
    /// With `lease`: the action holding it is also completed in the same transaction (the
    /// step run's acknowledgement, owner-guarded like [`crate::Store::finish`]), whenever the
    /// job's part committed ([`BridgeOutcome::Finished`] or [`BridgeOutcome::AlreadyFinal`]).
    pub complete_run: bool,
    /// With `lease`: first, in the same transaction, the claims other runs of the same step
    /// took for the job and the finishing output does not carry are released (what
    /// [`crate::Store::release_superseded_claims`] does on its own), so they are not completed
    /// with the job though never processed.
    pub superseded: Option<Superseded>,
    /// The lifecycle event is written already delivered (J5): set by a runtime that registers
    /// no lifecycle hook, which has nothing to run for it and would otherwise mark it
    /// delivered unheard with a write of its own (the outbox sweep). The store writes it
    /// delivered only while no runtime holds the listeners' lease, read in the finishing
    /// transaction ([`crate::jobs::listeners`]). Operator tools, which leave events for a
    /// runtime's hooks, never set it.
    pub event_delivered: bool,
}

/// The finishing run's step and the claim tokens its output carries
/// ([`FinishRequest::superseded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseded {
    /// The step index the run executed.
    pub step: i32,
    /// The tokens of the claims the output holds (kept).
    pub keep: Vec<String>,
}

/// What [`crate::Store::finish_jobs`] did with a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupFinished {
    /// Committed: one outcome per request, in request order (never
    /// [`BridgeOutcome::ClaimCompletionFailed`]).
    Committed(Vec<BridgeOutcome>),
    /// Completing a claim of `job_id` failed (for good or transiently): the whole group was
    /// rolled back and nothing was written. The caller finishes each job alone through
    /// [`crate::Store::finish_job`] (the bridge's single path, which re-runs transient
    /// failures and downgrades this job to `failed / item_claim_completion_failed`).
    RolledBack {
        /// The job whose completion failed.
        job_id: i64,
        /// What failed.
        error: String,
    },
}

/// A lifecycle event from the outbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobEvent {
    /// Event id.
    pub id: i64,
    /// The job.
    pub job_id: i64,
    /// Its pipeline.
    pub pipeline: String,
    /// The final status.
    pub status: JobStatus,
    /// The reason.
    pub reason: Option<String>,
    /// Written at.
    pub created_at: DateTime<Utc>,
}
