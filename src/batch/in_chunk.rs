//! Children run by the chunk run that created them ([`crate::Pipeline::children_in_chunk`]).
//!
//! The chunk's [`crate::Store::create_children`] leased the new children's step actions to its
//! runner ([`super::ChildSpec::run_by`]) and started the children in the same transaction
//! ([`super::ChildOutcome::Leased`]); here the chunk runs their steps through the engine's
//! step path ([`Engine::run_started`], as a runner's [`Engine::run_step`] would), up to the
//! pipeline's bound at once, their bridge finishes queued in a [`FinishQueue`] and written
//! together once every child still running has reached its finish (or [`FINISH_WAIT`] after
//! the first), so a chunk of 100 uniform children is one finish transaction. Leases are
//! heartbeated while the children run. A step that finished its job settled its step action in
//! the bridge's transaction; every other end is written as the runner writes it
//! ([`crate::runner::execute::finish_for`]: retry with backoff and the attempt counted, fail,
//! snooze), in one [`crate::Store::finish_many`]. If the chunk run dies, or that write fails,
//! the leases lapse and the reaper hands the step actions to the runners (R1).

use crate::error::{Error, Result};
use crate::handler::{ActionContext, RunControl, RunnerFacts};
use crate::jobs::bridge::{self, RunFinished};
use crate::jobs::engine::Engine;
use crate::jobs::{FinishRequest, StepStart};
use crate::runner::execute::{finish_for, task_end, RunEnd, RunOf};
use crate::store::{Finish, Lease};
use crate::telemetry;
use backon::{ExponentialBuilder, Retryable};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;

/// A child whose step action the chunk run leased.
#[derive(Debug, Clone)]
pub(crate) struct LeasedChild {
    /// The child as its creating transaction left it: started, at its first step.
    pub(crate) job: crate::jobs::Job,
    pub(crate) lease: Lease,
    pub(crate) max_attempts: i32,
    pub(crate) group: Option<String>,
}

/// How long the first of a chunk's children to reach its bridge finish waits for the others
/// before the ones waiting are written without them.
const FINISH_WAIT: Duration = Duration::from_millis(2);

/// The bridge finishes of a chunk's children
/// ([`crate::handler::RunControl::with_finish_queue`]): a child's run queues its request
/// here and waits; the chunk writes the queued ones with one [`bridge::finish_runs`] once as
/// many wait as may run at once, or every child left does (or [`FINISH_WAIT`] after the
/// first arrived).
#[derive(Default)]
pub(crate) struct FinishQueue {
    waiting: Mutex<Vec<(FinishRequest, oneshot::Sender<Result<RunFinished>>)>>,
    arrived: Notify,
}

impl std::fmt::Debug for FinishQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FinishQueue")
            .field("waiting", &self.len())
            .finish()
    }
}

impl FinishQueue {
    /// Queues a child's finish and waits for the chunk to write it.
    pub(crate) async fn submit(&self, req: FinishRequest) -> Result<RunFinished> {
        let (tx, rx) = oneshot::channel();
        self.lock().push((req, tx));
        self.arrived.notify_one();
        rx.await.unwrap_or_else(|_| {
            Err(Error::Config(
                "the chunk run writing this child's finish ended first".into(),
            ))
        })
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Vec<(FinishRequest, oneshot::Sender<Result<RunFinished>>)>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Engine {
    /// Runs `children`'s steps (at most `max_concurrent` at once; each started by the
    /// transaction that created it), their bridge finishes through a [`FinishQueue`],
    /// their leases heartbeated until each is done; then writes the finishes their runs did
    /// not settle themselves. Never fails: what it cannot write is left to the leases' lapse.
    pub(crate) async fn run_children_in_chunk(
        self: &Arc<Self>,
        chunk: &ActionContext,
        facts: &RunnerFacts,
        children: Vec<LeasedChild>,
        max_concurrent: usize,
    ) {
        let queue = Arc::new(FinishQueue::default());
        let bound = max_concurrent.max(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(bound));
        let mut runs = JoinSet::new();
        let mut by_task = HashMap::with_capacity(children.len());
        for c in children {
            // Started by the transaction that created it (`ChildOutcome::Leased`).
            let start = StepStart::Run(c.job.clone());
            let control = RunControl::new(None).with_finish_queue(Arc::clone(&queue));
            let ctx = ActionContext {
                action_id: c.lease.id,
                hook: crate::jobs::STEP_HOOK.to_string(),
                args: serde_json::json!({"job": c.job.id, "step": c.job.step_index}),
                group: c.group.clone(),
                attempt: 1,
                max_attempts: c.max_attempts,
                scheduled_at: self.clock.now(),
                token: c.lease.token,
                queue: chunk.queue.clone(),
                run: control.clone(),
            };
            let engine = Arc::clone(self);
            let slots = Arc::clone(&slots);
            let limit = facts.default_timeout;
            let handle = runs.spawn(async move {
                let _slot = slots.acquire_owned().await;
                let run = tokio::spawn(async move { engine.run_started(ctx, start).await });
                let abort = run.abort_handle();
                let end = match limit {
                    Some(limit) => match tokio::time::timeout(limit, run).await {
                        Ok(joined) => task_end(joined),
                        Err(_) => {
                            abort.abort();
                            RunEnd::TimedOut(limit)
                        }
                    },
                    None => task_end(run.await),
                };
                (end, control.is_settled())
            });
            by_task.insert(handle.id(), c);
        }
        let beat = facts.heartbeat_interval.max(Duration::from_millis(10));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut writes: Vec<(Lease, Finish)> = Vec::new();
        let mut first_waiting: Option<tokio::time::Instant> = None;
        loop {
            let waiting = queue.len();
            if waiting == 0 {
                first_waiting = None;
            } else {
                let since = *first_waiting.get_or_insert_with(tokio::time::Instant::now);
                // As many wait as can run at once (one waiting keeps its slot, so the rest
                // cannot start before this write), or every child left.
                if waiting >= bound.min(by_task.len()) || since.elapsed() >= FINISH_WAIT {
                    self.write_queued_finishes(&queue).await;
                    first_waiting = None;
                    continue;
                }
            }
            let flush_at = first_waiting.map(|t| t + FINISH_WAIT);
            tokio::select! {
                done = runs.join_next_with_id() => {
                    let Some(done) = done else { break };
                    let (id, end, settled) = match done {
                        Ok((id, (end, settled))) => (id, end, settled),
                        Err(e) => (e.id(), RunEnd::Panicked("child run task failed".into()), false),
                    };
                    let Some(c) = by_task.remove(&id) else { continue };
                    if settled {
                        metrics::counter!(telemetry::COMPLETED, "hook" => crate::jobs::STEP_HOOK).increment(1);
                        continue;
                    }
                    let run = RunOf {
                        id: c.lease.id,
                        hook: crate::jobs::STEP_HOOK,
                        attempt: 1,
                        max_attempts: c.max_attempts,
                    };
                    let finish = finish_for(end, run, &facts.backoff, self.clock.now());
                    if let Finish::Fail { error } | Finish::Retry { error, .. } = &finish {
                        tracing::warn!(job_id = c.job.id, action_id = c.lease.id, %error, "child step run in its chunk failed");
                    }
                    writes.push((c.lease, finish));
                }
                _ = queue.arrived.notified() => {}
                _ = async { if let Some(at) = flush_at { tokio::time::sleep_until(at).await } },
                    if flush_at.is_some() => {}
                _ = tick.tick() => {
                    let leases: Vec<Lease> = by_task.values().map(|c| c.lease).collect();
                    if leases.is_empty() {
                        continue;
                    }
                    let until = self.clock.now() + facts.lease;
                    if let Err(e) = self.store.heartbeat(&facts.owner, &leases, until).await {
                        tracing::warn!(error = %e, "heartbeat of the chunk's children failed");
                    }
                }
            }
        }
        self.write_child_finishes(&writes).await;
    }

    /// Writes the queued children's finishes with one [`bridge::finish_runs`] and hands each
    /// its result; lifecycle events are delivered after, as [`Engine::finish_run`] does.
    async fn write_queued_finishes(&self, queue: &FinishQueue) {
        let batch = std::mem::take(&mut *queue.lock());
        let (reqs, waiters): (Vec<FinishRequest>, Vec<_>) = batch.into_iter().unzip();
        let n = reqs.len();
        let mut results =
            bridge::finish_runs(&self.store, &self.completions, &reqs, self.clock.now())
                .await
                .into_iter();
        for (i, waiter) in waiters.into_iter().enumerate() {
            let r = results.next().unwrap_or_else(|| {
                Err(Error::Config(format!(
                    "finish_runs answered fewer than {n} children (child {i})"
                )))
            });
            let _ = waiter.send(r);
        }
    }

    /// Writes the children's finishes in one call, retrying transient errors as the runner's
    /// acknowledgements do; a lost lease drops its result (a newer attempt owns the action).
    async fn write_child_finishes(&self, writes: &[(Lease, Finish)]) {
        if writes.is_empty() {
            return;
        }
        let call = || async { self.store.finish_many(writes, self.clock.now()).await };
        let written = call
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(20))
                    .with_max_times(4),
            )
            .when(|e: &crate::Error| e.is_transient())
            .await;
        match written {
            Ok(results) => {
                for ((lease, finish), result) in writes.iter().zip(results) {
                    let name = match (result, finish) {
                        (crate::store::FinishResult::LeaseLost, _) => telemetry::LEASE_LOST,
                        (_, Finish::Complete) => telemetry::COMPLETED,
                        (_, Finish::Fail { .. }) => telemetry::FAILED,
                        (_, Finish::Retry { .. }) => telemetry::RETRIED,
                        (_, Finish::Snooze { .. } | Finish::Release) => telemetry::SNOOZED,
                    };
                    if name == telemetry::LEASE_LOST {
                        tracing::warn!(
                            action_id = lease.id,
                            token = lease.token,
                            "lease lost: child result dropped, a newer attempt owns the action"
                        );
                    }
                    metrics::counter!(name, "hook" => crate::jobs::STEP_HOOK).increment(1);
                }
            }
            Err(e) => tracing::error!(
                error = %e,
                children = writes.len(),
                "could not record the chunk's child runs; their leases will lapse and the reaper retries them"
            ),
        }
    }
}
