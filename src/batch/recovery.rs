//! Recovery and audit (R2, R3, DESIGN §11): `recover-stuck` finds processing jobs that nothing
//! will move and gives each a way forward; `liveness` classifies processing jobs; `check`
//! audits the invariants.
//!
//! Recovery goes job by job: one job's error is recorded in the report (and logged) and the
//! others are still recovered. What a job needs and this process lacks is left for a runtime
//! that has it, and said so: a success finish whose claims name a completion handler that is
//! not registered here (the CLI has only the built-in ones; finishing would downgrade the job
//! to `item_claim_completion_failed`), and lifecycle events when this engine runs no hooks.

use super::JobLiveness;
use crate::error::Result;
use crate::jobs::bridge::reason;
use crate::jobs::engine::Engine;
use crate::jobs::StepAction;
use crate::state::{ClaimStatus, JobStatus};
use serde::Serialize;

/// Options of `recover-stuck`.
#[derive(Debug, Clone)]
pub struct RecoverOptions {
    /// Report what would be done; change nothing.
    pub dry_run: bool,
    /// At most this many jobs examined.
    pub limit: i64,
    /// Only jobs unchanged for at least this long.
    pub older_than: chrono::Duration,
}

impl Default for RecoverOptions {
    fn default() -> Self {
        Self {
            dry_run: false,
            limit: 1000,
            older_than: chrono::Duration::minutes(5),
        }
    }
}

/// What recovery does (or, in a dry run, would do) with one stranded job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    /// Its step action is enqueued again.
    Requeue,
    /// Its step had failed for good: finished `failed / stale`.
    FailStale,
    /// A batch parent that is due: finished with its children's aggregate status.
    CompleteBatchParent,
    /// A batch parent not yet due: its chunk action is enqueued again.
    RearmChunk,
    /// Left alone: finishing it needs completion handlers this process does not have.
    LeftForHandler,
}

impl RecoveryAction {
    /// The snake_case name (as in `--json`).
    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryAction::Requeue => "requeue",
            RecoveryAction::FailStale => "fail_stale",
            RecoveryAction::CompleteBatchParent => "complete_batch_parent",
            RecoveryAction::RearmChunk => "rearm_chunk",
            RecoveryAction::LeftForHandler => "left_for_handler",
        }
    }
}

/// One stranded job and what recovery did with it (or would do, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecoveredJob {
    /// The job.
    pub id: i64,
    /// Its pipeline.
    pub pipeline: String,
    /// Its status when examined.
    pub status: JobStatus,
    /// Its status once the action is carried out: the final status it is finished with, or
    /// its status now when it stays (re-enqueued work, left for a handler, an error).
    pub predicted_status: JobStatus,
    /// The reason code of the final status it is finished with (`stale`,
    /// `all_children_failed`, …); `None` when it is not finished.
    pub reason: Option<String>,
    /// What recovery does with it.
    pub action: RecoveryAction,
    /// The completion handlers its claims need and this process lacks (`left_for_handler`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_handlers: Vec<String>,
    /// Why the action failed (the job is unchanged; other jobs were still recovered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `recover-stuck` did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoverReport {
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Pending/processing jobs examined.
    pub examined: u64,
    /// Jobs with a scheduler path (an action or an active child), left alone.
    pub left_alone: u64,
    /// Stranded batch parents completed with their aggregate status.
    pub batch_parents_completed: u64,
    /// Dry run: stranded parents that would be completed.
    pub would_complete_batch_parent: u64,
    /// Stranded parents whose chunk action was re-armed.
    pub chunk_rearmed: u64,
    /// Dry run: parents whose chunk action would be re-armed.
    pub would_rearm_chunk: u64,
    /// Jobs whose step action was enqueued again.
    pub requeued: u64,
    /// Dry run: jobs that would be requeued.
    pub would_requeue: u64,
    /// Jobs finished `failed / stale` (their step had failed for good).
    pub failed_stale: u64,
    /// Dry run: jobs that would be failed stale.
    pub would_fail_stale: u64,
    /// Stranded jobs left for a runtime that has the completion handlers their claims name
    /// (finishing them here would fail them `item_claim_completion_failed`); see `jobs`.
    pub left_for_handler: u64,
    /// Stranded jobs whose recovery failed with an error (see `jobs`); the others were still
    /// recovered.
    pub errors: u64,
    /// Lifecycle events replayed from the outbox.
    pub outbox_replayed: u64,
    /// Dry run: undelivered events that would be replayed.
    pub would_replay_outbox: u64,
    /// Undelivered lifecycle events left for a runtime's outbox sweep: this process runs no
    /// lifecycle hooks (an operator tool), so delivering them here would lose them.
    pub outbox_left_for_runtime: u64,
    /// Each stranded job and what was (or would be) done with it, in id order.
    pub jobs: Vec<RecoveredJob>,
}

impl RecoverReport {
    fn count(&mut self, action: RecoveryAction) {
        let dry = self.dry_run;
        let counter = match action {
            RecoveryAction::Requeue if dry => &mut self.would_requeue,
            RecoveryAction::Requeue => &mut self.requeued,
            RecoveryAction::FailStale if dry => &mut self.would_fail_stale,
            RecoveryAction::FailStale => &mut self.failed_stale,
            RecoveryAction::CompleteBatchParent if dry => &mut self.would_complete_batch_parent,
            RecoveryAction::CompleteBatchParent => &mut self.batch_parents_completed,
            RecoveryAction::RearmChunk if dry => &mut self.would_rearm_chunk,
            RecoveryAction::RearmChunk => &mut self.chunk_rearmed,
            RecoveryAction::LeftForHandler => &mut self.left_for_handler,
        };
        *counter += 1;
    }
}

/// The claims a job holds can hold at most this many for the handler check (a job claims what
/// its steps claimed; a batch parent hands its items to children).
const CLAIMS_CHECKED: i64 = 100_000;

impl Engine {
    /// R2: brings every stranded job forward (see [`RecoverReport`]). An error reading the
    /// jobs is an error; an error recovering one job is recorded in the report and logged,
    /// and recovery goes on with the others.
    pub async fn recover_stuck(&self, opts: &RecoverOptions) -> Result<RecoverReport> {
        let now = self.clock.now();
        let mut report = RecoverReport {
            dry_run: opts.dry_run,
            ..RecoverReport::default()
        };
        let jobs = self
            .store
            .job_liveness(now - opts.older_than, opts.limit)
            .await?;
        for j in jobs {
            report.examined += 1;
            if !j.stranded() {
                report.left_alone += 1;
                continue;
            }
            let Some((entry, changed)) = self.recover_one(&j, opts.dry_run).await else {
                // A batch parent whose batch is gone (finished meanwhile): nothing to do.
                report.left_alone += 1;
                continue;
            };
            match &entry.error {
                Some(error) => {
                    report.errors += 1;
                    tracing::error!(
                        job_id = j.job_id,
                        pipeline = %j.pipeline,
                        action = entry.action.as_str(),
                        %error,
                        "recover-stuck: could not recover the job; going on with the others"
                    );
                }
                None => {
                    if changed {
                        report.count(entry.action);
                    }
                    if !opts.dry_run {
                        tracing::info!(
                            job_id = j.job_id,
                            pipeline = %j.pipeline,
                            action = entry.action.as_str(),
                            status = %entry.status,
                            predicted_status = %entry.predicted_status,
                            reason = entry.reason.as_deref().unwrap_or(""),
                            missing_handlers = ?entry.missing_handlers,
                            "recover-stuck"
                        );
                    }
                }
            }
            report.jobs.push(entry);
        }
        let undelivered = || async { self.store.undelivered_events(opts.limit).await };
        if opts.dry_run {
            report.would_replay_outbox = undelivered().await?.len() as u64;
        } else if self.delivers_events {
            report.outbox_replayed = self.deliver_events().await? as u64;
        } else {
            report.outbox_left_for_runtime = undelivered().await?.len() as u64;
        }
        Ok(report)
    }

    /// Decides (and unless `dry`, carries out) what brings the stranded job `j` forward; with
    /// whether it is counted (false when another writer finished the job first). `None`: a
    /// batch parent whose batch is gone, nothing to do.
    async fn recover_one(&self, j: &JobLiveness, dry: bool) -> Option<(RecoveredJob, bool)> {
        let mut entry = RecoveredJob {
            id: j.job_id,
            pipeline: j.pipeline.clone(),
            status: j.status,
            predicted_status: j.status,
            reason: None,
            action: RecoveryAction::Requeue,
            missing_handlers: Vec::new(),
            error: None,
        };
        match self.plan_and_act(j, dry, &mut entry).await {
            Ok(Some(changed)) => Some((entry, changed)),
            Ok(None) => None,
            Err(e) => {
                entry.predicted_status = j.status;
                entry.reason = None;
                entry.error = Some(e.to_string());
                Some((entry, false))
            }
        }
    }

    /// `Some(changed)`, or `None` for a batch parent whose batch is gone.
    async fn plan_and_act(
        &self,
        j: &JobLiveness,
        dry: bool,
        e: &mut RecoveredJob,
    ) -> Result<Option<bool>> {
        let now = self.clock.now();
        if !j.is_batch_parent {
            return self.plan_step(j, dry, e).await.map(Some);
        }
        let Some(st) = self.store.batch_state(j.job_id).await? else {
            return Ok(None);
        };
        if let Some((status, why)) = st.decision() {
            return self.finish_stranded(j, status, why, dry, e).await.map(Some);
        }
        e.action = RecoveryAction::RearmChunk;
        if !dry {
            let step = self.step_action_for(&j.pipeline);
            self.store
                .schedule_chunk(j.job_id, st.items_total, step.priority, now)
                .await?;
        }
        Ok(Some(true))
    }

    /// A job that is not a batch parent: fail it stale when its step failed for good, else
    /// enqueue its step again.
    async fn plan_step(&self, j: &JobLiveness, dry: bool, e: &mut RecoveredJob) -> Result<bool> {
        if j.step_failed {
            return self
                .finish_stranded(j, JobStatus::Failed, Some(reason::STALE), dry, e)
                .await;
        }
        e.action = RecoveryAction::Requeue;
        if !dry {
            let now = self.clock.now();
            let step = self.step_action_for(&j.pipeline);
            self.store
                .enqueue(&step.action(j.job_id, j.step_index, now), now)
                .await?;
        }
        Ok(true)
    }

    /// Finishes a stranded job with `status` through the bridge, unless a success would need
    /// completion handlers this process lacks: then it is left for a runtime that has them.
    /// False when another writer had finished the job first.
    async fn finish_stranded(
        &self,
        j: &JobLiveness,
        status: JobStatus,
        why: Option<&str>,
        dry: bool,
        e: &mut RecoveredJob,
    ) -> Result<bool> {
        e.action = if status == JobStatus::Failed && why == Some(reason::STALE) {
            RecoveryAction::FailStale
        } else {
            RecoveryAction::CompleteBatchParent
        };
        if status.is_success() {
            let missing = self.missing_handlers(j.job_id).await?;
            if !missing.is_empty() {
                e.action = RecoveryAction::LeftForHandler;
                e.missing_handlers = missing;
                return Ok(true);
            }
        }
        e.predicted_status = status;
        e.reason = why.map(str::to_string);
        if dry {
            return Ok(true);
        }
        let done = self.bridge(j.job_id, status, why).await?;
        // What the bridge wrote, or the status another writer got there with first.
        e.predicted_status = done.status;
        e.reason = done.reason;
        if e.action == RecoveryAction::CompleteBatchParent {
            if let Err(err) = self.store.cleanup_worklist(j.job_id).await {
                tracing::warn!(job_id = j.job_id, error = %err, "worklist cleanup deferred");
            }
        }
        Ok(done.changed)
    }

    /// The completion handlers named by the claims `job_id` holds that are not registered
    /// here (sorted, deduplicated).
    async fn missing_handlers(&self, job_id: i64) -> Result<Vec<String>> {
        let claims = self
            .store
            .list_claims(&crate::claims::ClaimFilter {
                job_id: Some(job_id),
                status: Some(ClaimStatus::Claimed),
                limit: CLAIMS_CHECKED,
                ..Default::default()
            })
            .await?;
        let mut missing: Vec<String> = claims
            .iter()
            .filter_map(|c| c.completion.as_ref()?.handler.clone())
            .filter(|h| self.completions.get(h).is_none())
            .collect();
        missing.sort();
        missing.dedup();
        Ok(missing)
    }

    /// The step-action template of a pipeline, or a default when it is not registered here
    /// (the CLI recovers jobs of pipelines it does not know).
    fn step_action_for(&self, pipeline: &str) -> StepAction {
        self.pipelines
            .pipelines
            .get(pipeline)
            .map(|p| p.step_action())
            .unwrap_or(StepAction {
                priority: crate::action::DEFAULT_PRIORITY,
                max_attempts: 3,
                group: Some(StepAction::group_for(pipeline)),
            })
    }

    /// R3: every pending/processing job with what drives it.
    pub async fn liveness(&self, limit: i64) -> Result<Vec<JobLiveness>> {
        let far_future = self.clock.now() + chrono::Duration::days(36_500);
        self.store.job_liveness(far_future, limit).await
    }

    /// DESIGN §11: every broken invariant. Running actions get a one-minute grace past their
    /// lease before they count as unleased.
    pub async fn check(&self) -> Result<Vec<super::Violation>> {
        self.store
            .audit(self.clock.now(), chrono::Duration::minutes(1))
            .await
    }
}
