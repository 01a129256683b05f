//! The job engine: runs `dockhand.job.step` actions (J1, J2, J6) and delivers lifecycle events
//! from the outbox (J5). Its item claims for steps (J7) are in `step_claims`.

use super::bridge::{self, reason};
use super::packets;
use super::pipeline::{Packet, PipelineRegistry, StepContext, StepOutput};
use super::{JobEvent, StepAction, StepStart, Superseded};
use crate::claims::{ClaimRun, CompletionRegistry};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::handler::{ActionContext, HandlerError, HandlerResult};
use crate::state::JobStatus;
use crate::store::{DynStore, Lease};
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// A lifecycle hook: called with each final job event after its commit, at least once.
pub type LifecycleHook = Arc<dyn Fn(JobEvent) -> BoxFuture<'static, ()> + Send + Sync>;

/// What the reprocess callback is told (J7).
#[derive(Debug, Clone, PartialEq)]
pub struct ReprocessContext {
    /// The executing step's real id (`pipeline/step`), never the shared scope.
    pub step_id: String,
    /// The identity scope the claim is in.
    pub scope: String,
    /// Source type.
    pub source_type: String,
    /// Item id.
    pub item_id: String,
    /// The job asking.
    pub job_id: i64,
}

/// Decides whether an already processed item should run again.
pub type ReprocessFn = Arc<dyn Fn(&ReprocessContext) -> bool + Send + Sync>;

/// Lifecycle hooks by stage.
#[derive(Clone, Default)]
pub(crate) struct LifecycleHooks {
    pub(crate) on_completed: Vec<LifecycleHook>,
    pub(crate) on_failed: Vec<LifecycleHook>,
    pub(crate) on_finished: Vec<LifecycleHook>,
}

impl LifecycleHooks {
    /// Whether any hook is registered.
    pub(crate) fn any(&self) -> bool {
        !(self.on_completed.is_empty() && self.on_failed.is_empty() && self.on_finished.is_empty())
    }
}

/// Everything the job machinery shares.
pub struct Engine {
    pub(crate) store: DynStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) pipelines: PipelineRegistry,
    pub(crate) completions: CompletionRegistry,
    pub(crate) hooks: LifecycleHooks,
    pub(crate) reprocess: Option<ReprocessFn>,
    /// Whether this engine delivers lifecycle events (a runtime, with the hooks registered
    /// in code). An operator tool's engine ([`super::api::Jobs::without_pipelines`]: the CLI,
    /// the dashboard) runs no hooks, so it leaves events in the outbox for a runtime's sweep
    /// instead of marking them delivered unheard.
    pub(crate) delivers_events: bool,
    /// Whether some runtime of the cluster hears lifecycle events ([`super::listeners`]).
    pub(crate) listeners: super::listeners::Listeners,
    /// Serialises outbox delivery in this process.
    pub(crate) delivering: tokio::sync::Mutex<()>,
    /// Group commit of concurrently running steps' starts and finishes.
    pub(crate) grouped: super::grouped::Grouped,
    /// Packet bodies the chunk action verified, for its children's step runs.
    pub(crate) packet_cache: super::packet_cache::PacketCache,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("pipelines", &self.pipelines)
            .field("completions", &self.completions)
            .finish()
    }
}

/// The step action a run holds: its lease, and where the run notes that the bridge's
/// transaction completed the action ([`crate::handler::RunControl`]).
struct RunAck {
    lease: Lease,
    control: crate::handler::RunControl,
}

/// The tokens of the claims a step's output carries (kept when superseded claims are
/// released).
fn kept_tokens(output: &StepOutput) -> Vec<String> {
    match output {
        StepOutput::Packets(p) | StepOutput::Park(p) => p
            .iter()
            .flat_map(|p| p.descriptors.iter().map(|d| d.token.clone()))
            .collect(),
        StepOutput::Skip => Vec::new(),
    }
}

/// Parses `{"job": i64, "step": i32}`.
fn step_args(ctx: &ActionContext) -> Result<(i64, i32)> {
    let job = ctx.args.get("job").and_then(|v| v.as_i64());
    let step = ctx
        .args
        .get("step")
        .and_then(|v| v.as_i64())
        .and_then(|s| i32::try_from(s).ok());
    match (job, step) {
        (Some(j), Some(s)) => Ok((j, s)),
        _ => Err(Error::invalid(
            "args",
            format!(
                "action {}: step actions need {{\"job\": int, \"step\": int}}, got {}",
                ctx.action_id, ctx.args
            ),
        )),
    }
}

impl Engine {
    /// The job API over this engine.
    pub fn jobs(self: &Arc<Self>) -> super::api::Jobs {
        super::api::Jobs::new(Arc::clone(self))
    }

    pub(crate) async fn bridge(
        &self,
        job_id: i64,
        status: JobStatus,
        reason: Option<&str>,
    ) -> Result<bridge::Finished> {
        let done = bridge::finish(
            &self.store,
            &self.completions,
            job_id,
            status,
            reason,
            self.clock.now(),
        )
        .await?;
        // With no lifecycle hook registered there is nothing to run: the outbox sweep marks
        // the event delivered later, off the finishing job's path (a delivery reads the outbox
        // and writes each event it marks).
        if done.changed && self.hooks.any() {
            if let Err(e) = self.deliver_events().await {
                tracing::warn!(job_id, error = %e, "lifecycle delivery deferred to the outbox sweep");
            }
        }
        Ok(done)
    }

    /// Runs one `dockhand.job.step` action (the handler the runtime registers for it).
    pub(crate) async fn run_step(self: Arc<Self>, action: ActionContext) -> HandlerResult {
        let (job_id, step) = step_args(&action).map_err(HandlerError::fatal)?;
        // The step boundary (B5, B7): the store decides whether this step may start.
        let start = self
            .start_step_grouped(job_id, step)
            .await
            .map_err(HandlerError::retry)?;
        self.run_started(action, start).await
    }

    /// [`Self::run_step`] after its step boundary: `start` is what the store decided for the
    /// action's `(job, step)` (a chunk running its children decides all of theirs in one
    /// [`crate::Store::start_steps`]).
    pub(crate) async fn run_started(
        self: Arc<Self>,
        action: ActionContext,
        start: StepStart,
    ) -> HandlerResult {
        let (job_id, step) = step_args(&action).map_err(HandlerError::fatal)?;
        let lease = Lease {
            id: action.action_id,
            token: action.token,
        };
        let ack = RunAck {
            lease,
            control: action.run.clone(),
        };
        let job = match start {
            StepStart::Run(job) => job,
            StepStart::Stale => {
                tracing::debug!(job_id, step, "stale step action: the job moved on");
                return Ok(());
            }
            StepStart::ParentStopped(job) => {
                return self
                    .stop_at_step_boundary(&job)
                    .await
                    .map_err(HandlerError::retry)
            }
            StepStart::FannedOut(job) => return self.resume_fanned_out(&job, step).await,
        };
        let Some(pipeline) = self.pipelines.pipelines.get(&job.pipeline).cloned() else {
            return self
                .unrunnable(job_id, &ack, format!("unknown pipeline `{}`", job.pipeline))
                .await;
        };
        if let Some(source) = self
            .rerun_source(&job, step)
            .await
            .map_err(HandlerError::retry)?
        {
            return self.run_rerun(&job, source, &pipeline, lease).await;
        }
        let Some(def) = usize::try_from(step)
            .ok()
            .and_then(|i| pipeline.steps.get(i))
            .cloned()
        else {
            return self
                .unrunnable(
                    job_id,
                    &ack,
                    format!("pipeline `{}` has no step {step}", job.pipeline),
                )
                .await;
        };
        let mut inputs = Vec::with_capacity(job.input_refs.len());
        for r in &job.input_refs {
            let hash = match packets::parse_ref(r) {
                Ok(h) => h,
                Err(e) => return self.unrunnable(job_id, &ack, e.to_string()).await,
            };
            let body = self.input_body(hash).await.map_err(HandlerError::retry)?;
            match packets::verify(r, body) {
                Ok(v) => inputs.push(v),
                Err(e) => return self.unrunnable(job_id, &ack, e.to_string()).await,
            }
        }
        let run = ClaimRun { step, lease };
        let ctx = StepContext {
            job_id,
            pipeline: pipeline.name.clone(),
            step: def.name.clone(),
            step_index: step,
            attempt: action.attempt,
            inputs,
            scope: def
                .scope
                .clone()
                .unwrap_or_else(|| format!("{}/{}", pipeline.name, def.name)),
            completion: def.completion.clone(),
            claim_ttl: def.claim_ttl,
            run,
            engine: Arc::clone(&self),
        };
        let output = (def.run)(ctx).await?;
        // The step's own code is done: its slot goes to the next run while this one writes
        // its output (the bridge, a fan-out, the next step), as an acknowledgement would.
        ack.control.release_slot();
        let last = usize::try_from(step + 1).map_or(true, |n| n >= pipeline.steps.len());
        let terminal = match &output {
            StepOutput::Skip => Some(JobStatus::Skipped),
            StepOutput::Packets(p) if p.is_empty() => Some(JobStatus::CompletedNoItems),
            StepOutput::Packets(_) if last => Some(JobStatus::Completed),
            _ => None,
        };
        if let Some(status) = terminal {
            // The superseded claims are released in the bridge's own transaction.
            let superseded = Superseded {
                step,
                keep: kept_tokens(&output),
            };
            return self
                .finish_from_step(job_id, &ack, status, None, Some(superseded))
                .await;
        }
        if !self.release_superseded(job_id, run, &output).await? {
            return Ok(());
        }
        let template = pipeline.step_action();
        match output {
            // Finished above, with the other terminal outputs.
            StepOutput::Skip => Ok(()),
            StepOutput::Packets(p) if p.len() > 1 && !def.inline => {
                self.fan_out(&job, step, &p, &pipeline, lease).await
            }
            StepOutput::Packets(p) => {
                self.continue_inline(job_id, lease, step, &p, &template, false)
                    .await
            }
            StepOutput::Park(p) => {
                self.continue_inline(job_id, lease, step, &p, &template, true)
                    .await
            }
        }
    }

    async fn unrunnable(&self, job_id: i64, ack: &RunAck, what: String) -> HandlerResult {
        tracing::error!(job_id, %what, "job cannot run");
        self.finish_from_step(
            job_id,
            ack,
            JobStatus::Failed,
            Some(reason::UNRUNNABLE),
            None,
        )
        .await
    }

    /// Finishes the job of the step run holding `ack.lease` through the bridge (grouped with
    /// concurrently finishing steps), completing the step action in the same transaction
    /// (noted in `ack.control`, so the runner writes no acknowledgement); nothing when the
    /// run lost its lease.
    async fn finish_from_step(
        &self,
        job_id: i64,
        ack: &RunAck,
        status: JobStatus,
        why: Option<&str>,
        superseded: Option<Superseded>,
    ) -> HandlerResult {
        match self
            .finish_run(job_id, ack.lease, &ack.control, status, why, superseded)
            .await
            .map_err(HandlerError::retry)?
        {
            bridge::RunFinished::Done { run_completed, .. } => {
                if run_completed {
                    ack.control.mark_settled();
                }
                Ok(())
            }
            bridge::RunFinished::LeaseLost { action_id, token } => {
                tracing::warn!(
                    job_id,
                    action_id,
                    token,
                    "step run lost its lease; its job is not finished by it"
                );
                Ok(())
            }
        }
    }

    /// Stores the packets and hands them to the next step on the same job (or parks it there),
    /// fenced by the step run's `lease`: a run that lost it moves nothing on.
    async fn continue_inline(
        &self,
        job_id: i64,
        lease: Lease,
        step: i32,
        packets_out: &[Packet],
        template: &StepAction,
        park: bool,
    ) -> HandlerResult {
        let encoded = packets_out
            .iter()
            .map(|p| packets::encode(&p.data))
            .collect::<Result<Vec<_>>>()
            .map_err(HandlerError::fatal)?;
        let now = self.clock.now();
        self.store
            .put_packets(&encoded, now)
            .await
            .map_err(HandlerError::retry)?;
        let refs: Vec<String> = encoded.into_iter().map(|e| e.reference).collect();
        let (store, fence, steps) = (&self.store, Some(lease), (step, step + 1));
        let written = if park {
            store.park_job(job_id, fence, steps, &refs, now).await
        } else {
            store
                .advance_job(job_id, fence, steps, &refs, template, now)
                .await
        };
        let Some(moved) = unless_lease_lost(written, job_id, "output")? else {
            return Ok(());
        };
        if !moved {
            tracing::debug!(
                job_id,
                step,
                "job moved on before this step finished; output dropped"
            );
        }
        Ok(())
    }

    /// Before a step run's output is written (defect 8 of issue 15): the claims earlier runs of
    /// this step took for the job and this output does not carry are released, so a zombie's
    /// or a failed attempt's extra items are not completed with the job though never
    /// processed. False when this run lost its lease: a newer run owns the step, so this
    /// output is dropped (as a lost compare-and-swap would drop it).
    async fn release_superseded(
        &self,
        job_id: i64,
        run: ClaimRun,
        output: &StepOutput,
    ) -> std::result::Result<bool, HandlerError> {
        let keep = kept_tokens(output);
        let released = self
            .store
            .release_superseded_claims(job_id, run, &keep)
            .await;
        match unless_lease_lost(released, job_id, "output")? {
            None => Ok(false),
            Some(0) => Ok(true),
            Some(released) => {
                tracing::info!(job_id, step = run.step, released, "released the claims earlier runs of this step took and its output does not hold");
                Ok(true)
            }
        }
    }

    /// Whether this engine's outbox sweep has anything to do: it has lifecycle hooks to run,
    /// or it has none and no other runtime listens, so the events are marked delivered
    /// unheard ([`super::listeners`]). While another runtime listens, the sweep is left to it.
    pub(crate) fn sweeps_outbox(&self) -> bool {
        self.hooks.any() || !self.listeners.someone_listens()
    }

    /// Whether a step run's event is written delivered by its finishing transaction: this
    /// runtime delivers events, has no hook to run, and no other runtime listens.
    pub(crate) fn writes_events_delivered(&self) -> bool {
        self.delivers_events && !self.listeners.someone_listens()
    }

    /// Delivers undelivered lifecycle events (J5): runs the hooks, then marks the event
    /// delivered. At least once; a crash between the two re-delivers on the next sweep. An
    /// engine that runs no hooks (an operator tool's) delivers nothing and returns 0, and so
    /// does a runtime with no hook while another runtime listens ([`super::listeners`]).
    pub async fn deliver_events(&self) -> Result<usize> {
        if !self.delivers_events || !self.sweeps_outbox() {
            return Ok(0);
        }
        let _guard = self.delivering.lock().await;
        let mut delivered = 0;
        loop {
            let events = self.store.undelivered_events(100).await?;
            if events.is_empty() {
                return Ok(delivered);
            }
            let before = delivered;
            if !self.hooks.any() {
                // Nothing to run: the page is marked delivered with one write, which marks
                // nothing once a listener holds the lease (this runtime's view of it can be a
                // tick old).
                let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
                delivered += self
                    .store
                    .mark_events_unheard(&ids, self.clock.now())
                    .await? as usize;
                if delivered == before {
                    // A listener holds the lease now, or every event of the page was marked by
                    // someone else since it was read (or the read saw an older snapshot): the
                    // next sweep reads again, rather than this one re-reading the same page
                    // without end.
                    return Ok(delivered);
                }
                continue;
            }
            for event in events {
                let mut hooks: Vec<&LifecycleHook> = Vec::new();
                if event.status.is_success() {
                    hooks.extend(&self.hooks.on_completed);
                }
                if event.status == JobStatus::Failed {
                    hooks.extend(&self.hooks.on_failed);
                }
                hooks.extend(&self.hooks.on_finished);
                for hook in hooks {
                    hook(event.clone()).await;
                }
                if self
                    .store
                    .mark_event_delivered(event.id, self.clock.now())
                    .await?
                {
                    delivered += 1;
                }
            }
            if delivered == before {
                return Ok(delivered);
            }
        }
    }
}

/// The result of a step run's write, fenced by the run's lease: `None` (logged) when the run
/// lost it, so its `what` is dropped; other errors are transient (the run is retried).
pub(crate) fn unless_lease_lost<T>(
    written: Result<T>,
    job_id: i64,
    what: &str,
) -> std::result::Result<Option<T>, HandlerError> {
    match written {
        Ok(v) => Ok(Some(v)),
        Err(Error::LeaseLost { action_id, token }) => {
            tracing::warn!(
                job_id,
                action_id,
                token,
                "step run lost its lease; {what} dropped"
            );
            Ok(None)
        }
        Err(e) => Err(HandlerError::retry(e)),
    }
}
