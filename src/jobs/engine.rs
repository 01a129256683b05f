//! The job engine: runs `dockhand.job.step` actions (J1, J2, J6), takes item claims for steps
//! with the reprocess decision (J7), and delivers lifecycle events from the outbox (J5).

use super::bridge::{self, reason};
use super::packets;
use super::pipeline::{Packet, PipelineRegistry, StepContext, StepOutput};
use super::{JobEvent, StepAction, StepStart, Superseded};
use crate::claims::{
    ClaimItemRequest, ClaimOutcome, ClaimRun, CompletionConfig, CompletionRegistry, Descriptor,
    Identity,
};
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
            return self.run_rerun(&job, source, &pipeline).await;
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
                self.fan_out(&job, step, &p, &pipeline).await
            }
            StepOutput::Packets(p) => {
                self.continue_inline(job_id, step, &p, &template, false)
                    .await
            }
            StepOutput::Park(p) => {
                self.continue_inline(job_id, step, &p, &template, true)
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

    /// Stores the packets and hands them to the next step on the same job (or parks it there).
    async fn continue_inline(
        &self,
        job_id: i64,
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
        let moved = if park {
            self.store
                .park_job(job_id, step, step + 1, &refs, now)
                .await
        } else {
            self.store
                .advance_job(job_id, step, step + 1, &refs, template, now)
                .await
        }
        .map_err(HandlerError::retry)?;
        if !moved {
            tracing::debug!(
                job_id,
                step,
                "job moved on before this step finished; output dropped"
            );
        }
        Ok(())
    }

    /// Claims `identity` for the step's job, as this run of the step (fenced by its lease,
    /// recorded on the claim) and with the step's TTL; when it was processed already, asks the
    /// reprocess callback (with the executing step's id) whether to take it again. `None` also
    /// when the job is final or moved past this step: the store checks that under a lock on
    /// the job row in the claim's own transaction, so no claim outlives its job.
    pub(crate) async fn claim_for_step(
        &self,
        ctx: &StepContext,
        identity: Identity,
        completion: CompletionConfig,
    ) -> Result<Option<Descriptor>> {
        let mut req = ClaimItemRequest {
            identity,
            job_id: Some(ctx.job_id),
            ttl: ctx.claim_ttl,
            completion,
            reprocess: false,
            run: Some(ctx.run),
        };
        loop {
            match self.store.claim_item(&req, self.clock.now()).await? {
                ClaimOutcome::Claimed(d) => return Ok(Some(d)),
                ClaimOutcome::HeldByOther => return Ok(None),
                ClaimOutcome::JobNotLive {
                    job_id,
                    status,
                    step_index,
                } => {
                    tracing::info!(job_id, %status, step_index, run_step = ctx.step_index, item = %req.identity.item_id, "claim refused: the job is final or moved on");
                    return Ok(None);
                }
                ClaimOutcome::AlreadyProcessed if req.reprocess => return Ok(None),
                ClaimOutcome::AlreadyProcessed => {
                    let again = self.reprocess.as_ref().is_some_and(|f| {
                        f(&ReprocessContext {
                            step_id: ctx.step_id(),
                            scope: req.identity.scope.clone(),
                            source_type: req.identity.source_type.clone(),
                            item_id: req.identity.item_id.clone(),
                            job_id: ctx.job_id,
                        })
                    });
                    if !again {
                        return Ok(None);
                    }
                    req.reprocess = true;
                }
            }
        }
    }

    /// [`Self::claim_for_step`] for many identities, in one store call
    /// ([`crate::Store::claim_items`]: one transaction, the job and run checked once); the
    /// items processed already are put to the reprocess callback, and those it takes again
    /// claimed in a second call. One result per identity, in order.
    pub(crate) async fn claim_many_for_step(
        &self,
        ctx: &StepContext,
        identities: Vec<Identity>,
        completion: CompletionConfig,
    ) -> Result<Vec<Option<Descriptor>>> {
        let reqs: Vec<ClaimItemRequest> = identities
            .into_iter()
            .map(|identity| ClaimItemRequest {
                identity,
                job_id: Some(ctx.job_id),
                ttl: ctx.claim_ttl,
                completion: completion.clone(),
                reprocess: false,
                run: Some(ctx.run),
            })
            .collect();
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.store.claim_items(&reqs, self.clock.now()).await?;
        let mut out = vec![None; reqs.len()];
        let mut again = Vec::new();
        let mut refused = None;
        for (at, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                ClaimOutcome::Claimed(d) => out[at] = Some(d),
                ClaimOutcome::HeldByOther => {}
                ClaimOutcome::JobNotLive { .. } => refused = Some(outcome),
                ClaimOutcome::AlreadyProcessed => {
                    let req = &reqs[at];
                    let take = self.reprocess.as_ref().is_some_and(|f| {
                        f(&ReprocessContext {
                            step_id: ctx.step_id(),
                            scope: req.identity.scope.clone(),
                            source_type: req.identity.source_type.clone(),
                            item_id: req.identity.item_id.clone(),
                            job_id: ctx.job_id,
                        })
                    });
                    if take {
                        again.push(at);
                    }
                }
            }
        }
        if !again.is_empty() {
            let retake: Vec<ClaimItemRequest> = again
                .iter()
                .map(|&at| ClaimItemRequest {
                    reprocess: true,
                    ..reqs[at].clone()
                })
                .collect();
            let outcomes = self.store.claim_items(&retake, self.clock.now()).await?;
            for (&at, outcome) in again.iter().zip(outcomes) {
                match outcome {
                    ClaimOutcome::Claimed(d) => out[at] = Some(d),
                    ClaimOutcome::JobNotLive { .. } => refused = Some(outcome),
                    _ => {}
                }
            }
        }
        if let Some(ClaimOutcome::JobNotLive {
            job_id,
            status,
            step_index,
        }) = refused
        {
            tracing::info!(job_id, %status, step_index, run_step = ctx.step_index, items = reqs.len(), "claims refused: the job is final or moved on");
        }
        Ok(out)
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
        match self
            .store
            .release_superseded_claims(job_id, run, &keep)
            .await
        {
            Ok(0) => Ok(true),
            Ok(released) => {
                tracing::info!(job_id, step = run.step, released, "released the claims earlier runs of this step took and its output does not hold");
                Ok(true)
            }
            Err(Error::LeaseLost { action_id, token }) => {
                tracing::warn!(
                    job_id,
                    step = run.step,
                    action_id,
                    token,
                    "step run lost its lease; output dropped"
                );
                Ok(false)
            }
            Err(e) => Err(HandlerError::retry(e)),
        }
    }

    /// Delivers undelivered lifecycle events (J5): runs the hooks, then marks the event
    /// delivered. At least once; a crash between the two re-delivers on the next sweep. An
    /// engine that runs no hooks (an operator tool's) delivers nothing and returns 0.
    pub async fn deliver_events(&self) -> Result<usize> {
        if !self.delivers_events {
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
                // Nothing to run: the page is marked delivered with one write.
                let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
                delivered += self
                    .store
                    .mark_events_delivered(&ids, self.clock.now())
                    .await? as usize;
                if delivered == before {
                    // Every event of the page was marked by someone else since it was read
                    // (or the read saw an older snapshot): the next sweep reads again,
                    // rather than this one re-reading the same page without end.
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
