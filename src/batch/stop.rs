//! Operator stops (B5): the one batch-aware cancel and manual fail behind every surface — the
//! library (`Jobs::cancel`, `Jobs::manual_fail`, `Jobs::finish`), the CLI (`cancel-job`,
//! `manual-fail`) and the dashboard's job and batch buttons. It works from the store alone (the
//! CLI registers no pipeline).
//!
//! A job that is not a batch parent finishes through the terminal bridge at once. A batch
//! parent is stopped in this order:
//! 1. `Store::abort_batch` marks it (`cancel_requested` with the stop's status and reason) and,
//!    in the same transaction, discards its unscheduled rows (claims released) and, if nothing
//!    is active, enqueues its finalize action: from then on no chunk creates a child
//!    (`Store::create_child` discards instead) and no child starts a step (`Store::start_step`
//!    answers `ParentStopped`).
//! 2. Its children that have not started (`pending`, or parked `waiting`) are cancelled through
//!    the bridge, releasing their claims; a child that is itself a batch parent is stopped the
//!    same way.
//! 3. The parent finishes through the bridge now if no child is active; otherwise the last
//!    child's terminal transaction enqueues its finalize action.
//!
//! A child whose step is running when the mark commits finishes that step and its result
//! stands: when it was the child's last step the child completes (its claims are completed:
//! the item was processed); otherwise its output is dropped at the next step boundary, where
//! the child is cancelled. "No child completes after the cancel" therefore means: no child
//! that had not started a step when the mark committed.

use crate::error::{Error, Result};
use crate::jobs::bridge::{self, reason, Finished};
use crate::jobs::engine::Engine;
use crate::jobs::Job;
use crate::search::{JobSearch, MAX_PAGE};
use crate::state::JobStatus;
use futures_util::future::BoxFuture;

/// The reason a stopped batch parent reports while it waits for running children: a cancel.
pub const CANCEL_REQUESTED: &str = "cancel_requested";
/// The same for a manual fail.
pub const FAIL_REQUESTED: &str = "fail_requested";

impl Engine {
    /// B5: finishes job `id` by hand with `status` and `why`, batch-aware (see the module
    /// docs). A batch parent accepts only `cancelled` and `failed` (it finishes from its
    /// children otherwise); while children still run, the result keeps the parent's status
    /// with reason [`CANCEL_REQUESTED`] or [`FAIL_REQUESTED`].
    pub(crate) async fn stop_job(
        &self,
        id: i64,
        status: JobStatus,
        why: Option<&str>,
    ) -> Result<Finished> {
        let job = self
            .store
            .get_job(id)
            .await?
            .ok_or(Error::NotFound { what: "job", id })?;
        if job.status.is_final() {
            // Reports the standing status (idempotent), changing nothing.
            return self.bridge(id, status, why).await;
        }
        if self.store.batch_state(id).await?.is_none() {
            return self.bridge(id, status, why).await;
        }
        let requested = match status {
            JobStatus::Cancelled => CANCEL_REQUESTED,
            JobStatus::Failed => FAIL_REQUESTED,
            other => {
                return Err(Error::invalid(
                    "status",
                    format!(
                        "job {id} is a batch parent: it finishes from its children; it can be \
                         cancelled or failed by hand, not finished {other}"
                    ),
                ))
            }
        };
        self.stop_batch(&job, status, why.unwrap_or(reason::MANUAL))
            .await?;
        let st = self.store.batch_state(id).await?;
        if let Some((final_status, final_why)) = st.as_ref().and_then(|s| s.decision()) {
            let done = self.bridge(id, final_status, final_why).await?;
            if let Err(e) = self.store.cleanup_worklist(id).await {
                tracing::warn!(parent = id, error = %e, "worklist cleanup deferred");
            }
            return Ok(done);
        }
        Ok(Finished {
            status: job.status,
            reason: Some(requested.into()),
            changed: true,
        })
    }

    /// Steps 1 and 2 of the module docs for batch parent `job`.
    fn stop_batch<'a>(
        &'a self,
        job: &'a Job,
        status: JobStatus,
        why: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let parent = job.id;
            let stop = super::BatchAbort::Stop {
                status,
                reason: why.to_string(),
            };
            self.store
                .abort_batch(parent, stop, self.clock.now())
                .await?;
            let now = || self.clock.now();
            let mut cancelled = 0u64;
            for waiting in [JobStatus::Pending, JobStatus::Waiting] {
                for child in self.children(parent, waiting, false).await? {
                    let done = bridge::finish(
                        &self.store,
                        &self.completions,
                        child.id,
                        JobStatus::Cancelled,
                        Some(reason::MANUAL),
                        now(),
                    )
                    .await?;
                    cancelled += u64::from(done.changed);
                }
            }
            // A child that fanned out itself runs no further step: stop its batch too.
            for nested in self.children(parent, JobStatus::Processing, true).await? {
                self.stop_batch(&nested, JobStatus::Cancelled, reason::MANUAL)
                    .await?;
                if let Some(st) = self.store.batch_state(nested.id).await? {
                    self.finalize_if_due(nested.id, &st).await?;
                }
            }
            tracing::info!(parent, %status, cancelled, "batch stopped by an operator");
            if cancelled > 0 {
                if let Err(e) = self.deliver_events().await {
                    tracing::warn!(parent, error = %e, "lifecycle delivery deferred to the outbox sweep");
                }
            }
            Ok(())
        })
    }

    /// Every child of `parent` in `status` (only those that fanned out when `batches`), read
    /// page by page before any is changed.
    async fn children(&self, parent: i64, status: JobStatus, batches: bool) -> Result<Vec<Job>> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .store
                .search_jobs(&JobSearch {
                    status: Some(status),
                    parent_id: Some(parent),
                    batches_only: batches,
                    after,
                    limit: MAX_PAGE,
                    ..JobSearch::default()
                })
                .await?;
            out.extend(page.rows);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// The step boundary of a batch child whose parent was stopped (or is final): the child
    /// starts no step and is cancelled (B5); a child that fanned out is stopped as a batch.
    pub(crate) async fn stop_at_step_boundary(&self, job: &Job) -> Result<()> {
        tracing::info!(
            job_id = job.id,
            parent = ?job.parent_id,
            "batch stopped: the child starts no further step"
        );
        self.stop_job(job.id, JobStatus::Cancelled, Some(reason::MANUAL))
            .await
            .map(|_| ())
    }
}
