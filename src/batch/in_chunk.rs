//! Children run by the chunk run that created them ([`crate::Pipeline::children_in_chunk`]).
//!
//! The chunk's [`crate::Store::create_children`] leased the new children's step actions to its
//! runner ([`super::ChildSpec::run_by`]); here the chunk runs their steps through the same
//! [`Engine::run_step`] a runner would call, up to the pipeline's bound at once, so their step
//! starts and bridge finishes meet in the engine's group commits as chunk-sized groups. Leases
//! are heartbeated while the children run. A step that finished its job settled its step
//! action in the bridge's transaction; every other end is written as the runner writes it
//! ([`crate::runner::execute::finish_for`]: retry with backoff and the attempt counted, fail,
//! snooze), in one [`crate::Store::finish_many`]. If the chunk run dies, or that write fails,
//! the leases lapse and the reaper hands the step actions to the runners (R1).

use crate::handler::{ActionContext, RunControl, RunnerFacts};
use crate::jobs::engine::Engine;
use crate::runner::execute::{finish_for, task_end, RunEnd, RunOf};
use crate::store::{Finish, Lease};
use crate::telemetry;
use backon::{ExponentialBuilder, Retryable};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// A child whose step action the chunk run leased.
#[derive(Debug, Clone)]
pub(crate) struct LeasedChild {
    pub(crate) child: i64,
    pub(crate) step: i32,
    pub(crate) lease: Lease,
    pub(crate) max_attempts: i32,
    pub(crate) group: Option<String>,
}

impl Engine {
    /// Runs `children`'s steps (at most `max_concurrent` at once), heartbeating their leases
    /// until each is done, then writes the finishes their runs did not settle themselves.
    /// Never fails: what it cannot write is left to the leases' lapse.
    pub(crate) async fn run_children_in_chunk(
        self: &Arc<Self>,
        chunk: &ActionContext,
        facts: &RunnerFacts,
        children: Vec<LeasedChild>,
        max_concurrent: usize,
    ) {
        let slots = Arc::new(tokio::sync::Semaphore::new(max_concurrent.max(1)));
        let mut runs = JoinSet::new();
        let mut by_task = HashMap::with_capacity(children.len());
        for c in children {
            let control = RunControl::new(None);
            let ctx = ActionContext {
                action_id: c.lease.id,
                hook: crate::jobs::STEP_HOOK.to_string(),
                args: serde_json::json!({"job": c.child, "step": c.step}),
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
                let run = tokio::spawn(engine.run_step(ctx));
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
        let mut running: HashMap<i64, Lease> =
            by_task.values().map(|c| (c.lease.id, c.lease)).collect();
        loop {
            tokio::select! {
                done = runs.join_next_with_id() => {
                    let Some(done) = done else { break };
                    let (id, end, settled) = match done {
                        Ok((id, (end, settled))) => (id, end, settled),
                        Err(e) => (e.id(), RunEnd::Panicked("child run task failed".into()), false),
                    };
                    let Some(c) = by_task.remove(&id) else { continue };
                    running.remove(&c.lease.id);
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
                        tracing::warn!(job_id = c.child, action_id = c.lease.id, %error, "child step run in its chunk failed");
                    }
                    writes.push((c.lease, finish));
                }
                _ = tick.tick() => {
                    let leases: Vec<Lease> = running.values().copied().collect();
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
