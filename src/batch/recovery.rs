//! Recovery and audit (R2, R3, DESIGN §11): `recover-stuck` finds processing jobs that nothing
//! will move and gives each a way forward; `liveness` classifies processing jobs; `check`
//! audits the invariants.

use super::JobLiveness;
use crate::error::Result;
use crate::jobs::bridge::reason;
use crate::jobs::engine::Engine;
use crate::jobs::StepAction;
use crate::state::JobStatus;
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
    /// Lifecycle events replayed from the outbox.
    pub outbox_replayed: u64,
    /// Dry run: undelivered events that would be replayed.
    pub would_replay_outbox: u64,
}

impl Engine {
    /// R2: brings every stranded job forward (see [`RecoverReport`]).
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
            if j.is_batch_parent {
                self.recover_parent(&j, opts.dry_run, &mut report).await?;
            } else if j.step_failed {
                if opts.dry_run {
                    report.would_fail_stale += 1;
                } else {
                    self.bridge(j.job_id, JobStatus::Failed, Some(reason::STALE))
                        .await?;
                    report.failed_stale += 1;
                }
            } else if opts.dry_run {
                report.would_requeue += 1;
            } else {
                let step = self.step_action_for(&j.pipeline);
                self.store
                    .enqueue(&step.action(j.job_id, j.step_index, now), now)
                    .await?;
                report.requeued += 1;
            }
        }
        if opts.dry_run {
            report.would_replay_outbox =
                self.store.undelivered_events(opts.limit).await?.len() as u64;
        } else {
            report.outbox_replayed = self.deliver_events().await? as u64;
        }
        Ok(report)
    }

    async fn recover_parent(
        &self,
        j: &JobLiveness,
        dry: bool,
        report: &mut RecoverReport,
    ) -> Result<()> {
        let Some(st) = self.store.batch_state(j.job_id).await? else {
            return Ok(());
        };
        match st.decision() {
            Some((status, why)) => {
                if dry {
                    report.would_complete_batch_parent += 1;
                } else {
                    let done = self.bridge(j.job_id, status, why).await?;
                    if done.changed {
                        report.batch_parents_completed += 1;
                    }
                    let _ = self.store.cleanup_worklist(j.job_id).await;
                }
            }
            None if dry => report.would_rearm_chunk += 1,
            None => {
                let step = self.step_action_for(&j.pipeline);
                self.store
                    .schedule_chunk(j.job_id, st.items_total, step.priority, self.clock.now())
                    .await?;
                report.chunk_rearmed += 1;
            }
        }
        Ok(())
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
