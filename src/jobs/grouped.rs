//! Group commit of step starts and step finishes: the step boundary
//! ([`crate::Store::start_steps`]) and the terminal bridge from a step
//! ([`super::bridge::finish_runs`]) of concurrently running step actions go to the store as one
//! call each (leader/follower through [`GroupCommit`], no timer: a lone step writes at once,
//! and under contention one call carries every request queued while the previous one was
//! being written). For c children of a batch running at once that is one write transaction
//! per group instead of one per child, and on PostgreSQL/MySQL one wait on their parent's
//! row lock per group.
//!
//! A group call that fails as a whole (a database error) is retried per request when the
//! group held more than one, so that one job's error is not reported for every job; a group
//! of one returns its error as it is. Operator and other bridge calls keep
//! [`super::bridge::finish`].

use super::bridge::{self, RunFinished};
use super::engine::Engine;
use super::{FinishRequest, StepStart, Superseded};
use crate::error::Result;
use crate::state::JobStatus;
use crate::store::group_commit::GroupCommit;
use crate::store::Lease;
use std::sync::Arc;

/// The engine's group commits of step starts and step finishes.
#[derive(Debug, Default)]
pub(crate) struct Grouped {
    starts: GroupCommit<(i64, i32), StepStart>,
    finishes: GroupCommit<FinishRequest, RunFinished>,
}

impl Engine {
    /// The step boundary for `(job_id, step)`, in a group with the concurrently starting steps
    /// ([`crate::Store::start_steps`]).
    pub(crate) async fn start_step_grouped(&self, job_id: i64, step: i32) -> Result<StepStart> {
        let store = Arc::clone(&self.store);
        let clock = Arc::clone(&self.clock);
        self.grouped
            .starts
            .submit((job_id, step), move |reqs: Vec<(i64, i32)>| {
                let (store, clock) = (Arc::clone(&store), Arc::clone(&clock));
                async move {
                    let now = clock.now();
                    match store.start_steps(&reqs, now).await {
                        Ok(v) if v.len() == reqs.len() => v.into_iter().map(Ok).collect(),
                        Ok(v) => {
                            let n = reqs.len();
                            let got = v.len();
                            reqs.iter()
                                .map(|(job, _)| {
                                    Err(crate::Error::Config(format!(
                                        "job {job}: start_steps answered {got} of {n} requests"
                                    )))
                                })
                                .collect()
                        }
                        Err(e) if reqs.len() == 1 => vec![Err(e)],
                        Err(e) => {
                            tracing::warn!(error = %e, jobs = reqs.len(), "grouped step start failed; starting each alone");
                            let mut out = Vec::with_capacity(reqs.len());
                            for (job, step) in reqs {
                                out.push(store.start_step(job, step, now).await);
                            }
                            out
                        }
                    }
                }
            })
            .await
    }

    /// Finishes `job_id` from the step run holding `lease` through the bridge, in a group
    /// with the concurrently finishing steps ([`bridge::finish_runs`]), and completes the step
    /// action in the same transaction ([`FinishRequest::complete_run`]), releasing first the
    /// claims `superseded` names ([`FinishRequest::superseded`]); then delivers
    /// lifecycle events as [`Engine::bridge`] does.
    pub(crate) async fn finish_run(
        &self,
        job_id: i64,
        lease: Lease,
        control: &crate::handler::RunControl,
        status: JobStatus,
        reason: Option<&str>,
        superseded: Option<Superseded>,
    ) -> Result<RunFinished> {
        let store = Arc::clone(&self.store);
        let clock = Arc::clone(&self.clock);
        let completions = self.completions.clone();
        let req = FinishRequest {
            job_id,
            status,
            reason: reason.map(str::to_string),
            lease: Some(lease),
            complete_run: true,
            superseded,
            // No hook to run anywhere: the event is the record, written delivered (no sweep
            // write).
            event_delivered: self.writes_events_delivered(),
        };
        let done = match control.finish_queue() {
            // A child run by its chunk: the chunk writes its children's finishes together.
            Some(queue) => queue.submit(req).await?,
            None => {
                self.grouped
                    .finishes
                    .submit(req, move |reqs: Vec<FinishRequest>| {
                        let (store, clock) = (Arc::clone(&store), Arc::clone(&clock));
                        let completions = completions.clone();
                        async move {
                            bridge::finish_runs(&store, &completions, &reqs, clock.now()).await
                        }
                    })
                    .await?
            }
        };
        if matches!(&done, RunFinished::Done { finished, .. } if finished.changed)
            && self.hooks.any()
        {
            if let Err(e) = self.deliver_events().await {
                tracing::warn!(job_id, error = %e, "lifecycle delivery deferred to the outbox sweep");
            }
        }
        Ok(done)
    }
}
