//! Pipelines registered in code (J1, J2): a named, ordered list of steps, and what a step sees
//! ([`StepContext`]) and returns ([`StepOutput`]).

use super::engine::Engine;
use crate::claims::{ClaimRun, CompletionConfig, Descriptor, Identity, DEFAULT_CLAIM_TTL};
use crate::error::{Error, Result};
use crate::handler::HandlerError;
use futures_util::future::BoxFuture;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

/// A unit of data a step emits, with the item claims it carries (C7).
#[derive(Debug, Clone, PartialEq)]
pub struct Packet {
    /// The data handed to the next step.
    pub data: Value,
    /// Claims that travel with this packet.
    pub descriptors: Vec<Descriptor>,
}

impl Packet {
    /// A packet without claims.
    pub fn new(data: Value) -> Self {
        Self {
            data,
            descriptors: Vec::new(),
        }
    }

    /// Attaches a claim descriptor.
    pub fn with_claim(mut self, d: Descriptor) -> Self {
        self.descriptors.push(d);
        self
    }
}

/// What a step returns.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// Packets for the next step. None: the job finishes `completed_no_items`. After the last
    /// step: `completed`. Several, from a step that is not `.inline()`: batch fan-out — each
    /// packet becomes a child job that starts at the next step, and the job finishes from its
    /// children (B6).
    Packets(Vec<Packet>),
    /// Finish the job `skipped`.
    Skip,
    /// Park the job (`waiting`) with these packets as the next step's input, until resumed.
    Park(Vec<Packet>),
}

impl StepOutput {
    /// One packet.
    pub fn one(data: Value) -> Self {
        StepOutput::Packets(vec![Packet::new(data)])
    }
    /// Nothing to do.
    pub fn none() -> Self {
        StepOutput::Packets(Vec::new())
    }
}

/// What a step's handler returns.
pub type StepResult = Result<StepOutput, HandlerError>;

pub(crate) type BoxStep = Arc<dyn Fn(StepContext) -> BoxFuture<'static, StepResult> + Send + Sync>;

/// One step of a pipeline.
#[derive(Clone)]
pub struct Step {
    pub(crate) name: String,
    pub(crate) run: BoxStep,
    /// Several packets continue inline on the same job instead of fanning out.
    pub(crate) inline: bool,
    /// The claim scope (default: the step id `pipeline/step`).
    pub(crate) scope: Option<String>,
    /// Default completion config for claims this step takes.
    pub(crate) completion: CompletionConfig,
    /// Time-to-live of the claims this step takes (default [`DEFAULT_CLAIM_TTL`]).
    pub(crate) claim_ttl: chrono::Duration,
}

/// A named, ordered list of steps.
///
/// A step that returns several packets fans out into a batch of child jobs (each runs the
/// remaining steps), `chunk_size` children at a time:
///
/// ```
/// use dockhand::{Packet, Pipeline, StepOutput};
/// use serde_json::json;
///
/// let pipeline = Pipeline::new("thumbnails")
///     .chunk_size(100)
///     .max_attempts(5)
///     .step("list", |ctx| async move {
///         let n = ctx.input()["count"].as_u64().unwrap_or(0);
///         Ok(StepOutput::Packets((0..n).map(|i| Packet::new(json!({"image": i}))).collect()))
///     })
///     .step("resize", |ctx| async move {
///         println!("resizing {}", ctx.input()["image"]);
///         Ok(StepOutput::none())
///     });
/// assert_eq!(format!("{pipeline:?}"), r#"Pipeline { name: "thumbnails", steps: ["list", "resize"] }"#);
/// ```
#[derive(Clone)]
pub struct Pipeline {
    pub(crate) name: String,
    pub(crate) steps: Vec<Step>,
    pub(crate) max_attempts: u32,
    pub(crate) priority: i32,
    pub(crate) chunk_size: Option<i32>,
    pub(crate) children_in_chunk: Option<usize>,
    pub(crate) chunk_lanes: u32,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field(
                "steps",
                &self.steps.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Pipeline {
    /// An empty pipeline named `name`; add steps with [`Pipeline::step`].
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            steps: Vec::new(),
            max_attempts: 3,
            priority: crate::action::DEFAULT_PRIORITY,
            chunk_size: None,
            children_in_chunk: None,
            chunk_lanes: 1,
        }
    }

    /// Appends a step.
    pub fn step<F, Fut>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = StepResult> + Send + 'static,
    {
        self.steps.push(Step {
            name: name.into(),
            run: Arc::new(move |ctx| Box::pin(f(ctx))),
            inline: false,
            scope: None,
            completion: CompletionConfig::default(),
            claim_ttl: DEFAULT_CLAIM_TTL,
        });
        self
    }

    /// The last added step passes several packets inline to the next step (no fan-out).
    pub fn inline(mut self) -> Self {
        if let Some(s) = self.steps.last_mut() {
            s.inline = true;
        }
        self
    }

    /// The last added step claims items in `scope` (e.g. `shared:feed`) instead of its own.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        if let Some(s) = self.steps.last_mut() {
            s.scope = Some(scope.into());
        }
        self
    }

    /// The last added step's claims complete with `config`.
    pub fn completion(mut self, config: CompletionConfig) -> Self {
        if let Some(s) = self.steps.last_mut() {
            s.completion = config;
        }
        self
    }

    /// The last added step's claims hold for `ttl` before another owner may take them over
    /// (default [`DEFAULT_CLAIM_TTL`], 30 minutes). While the job lives, maintenance renews
    /// them once half the TTL has passed, so the TTL bounds how long a dead owner keeps an
    /// item, not how long a live job may work on it; keep it well above the maintenance
    /// `claim_renew_interval`. Must be positive (checked when the runtime is built).
    pub fn claim_ttl(mut self, ttl: std::time::Duration) -> Self {
        if let Some(s) = self.steps.last_mut() {
            s.claim_ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        }
        self
    }

    /// Attempts per step before the job fails `retry_exhausted` (J6). Default 3.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Worklist rows turned into child jobs per chunk action when a step fans out (default 100).
    pub fn chunk_size(mut self, n: u32) -> Self {
        self.chunk_size = Some(i32::try_from(n.max(1)).unwrap_or(i32::MAX));
        self
    }

    /// Runs a fan-out's children on the runner of the chunk action that creates them, up to
    /// `max_concurrent` at once, instead of leaving each child's step action to be claimed:
    /// the chunk creates a chunk's children with their step actions already leased to its
    /// runner (one transaction), runs their steps itself, and their starts and finishes go to
    /// the store in chunk-sized groups. Each child is still a job with its own step action,
    /// attempts, claims and terminal bridge: a failed step is written back as the runner would
    /// write it (retried later by any runner, with its attempt counted), and a chunk run that
    /// dies leaves its children's leases to lapse, after which the reaper hands them to the
    /// runners. The chunk's own slot is the only one the children use, so this suits many
    /// small children (the default spreads children over every runner's slots). Step actions
    /// in a paused or limited group are left to the runners. Off by default.
    pub fn children_in_chunk(mut self, max_concurrent: usize) -> Self {
        self.children_in_chunk = Some(max_concurrent.max(1));
        self
    }

    /// Chunk actions of one fan-out that may run at once (default 1: each chunk schedules the
    /// next when it has created its children). With `n` lanes the first chunk also schedules
    /// chunks for lanes 2..=n while rows are still ready, and each lane then schedules its own
    /// next chunk (offsets `n` chunks apart, each named and unique per parent and offset as
    /// with one lane); chunk runs lease disjoint rows, and the fence is set by the run that
    /// finds no row ready or leased. More lanes keep more of a batch's work in flight where one
    /// chain of chunks waits on round trips; each lane holds a runner slot while it runs
    /// (with [`Pipeline::children_in_chunk`], for its children's steps too). `n` is taken
    /// within 1..=64 (0 is one lane).
    pub fn chunk_lanes(mut self, n: u32) -> Self {
        self.chunk_lanes = n.clamp(1, 64);
        self
    }

    /// Priority of the pipeline's step actions.
    pub fn priority(mut self, p: i32) -> Self {
        self.priority = p;
        self
    }

    /// Checks the definition.
    pub(crate) fn validate(&self) -> Result<()> {
        crate::action::validate_name("pipeline", &self.name, false)?;
        if self.steps.is_empty() {
            return Err(Error::invalid(
                "pipeline",
                format!("`{}` has no steps", self.name),
            ));
        }
        for s in &self.steps {
            crate::action::validate_name("step", &s.name, false)?;
            if let Some(scope) = &s.scope {
                crate::action::validate_name("scope", scope, false)?;
            }
            if s.claim_ttl <= chrono::Duration::zero() {
                return Err(Error::invalid(
                    "claim_ttl",
                    format!(
                        "step `{}` of pipeline `{}`: must be positive",
                        s.name, self.name
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn step_action(&self) -> super::StepAction {
        super::StepAction {
            priority: self.priority,
            max_attempts: i32::try_from(self.max_attempts).unwrap_or(i32::MAX),
            group: Some(super::StepAction::group_for(&self.name)),
        }
    }
}

/// Pipelines by name.
#[derive(Clone, Default, Debug)]
pub(crate) struct PipelineRegistry {
    pub(crate) pipelines: HashMap<String, Arc<Pipeline>>,
}

/// What a step sees: its job, its input packets, and the job's claims and engine data.
#[derive(Clone)]
pub struct StepContext {
    /// The job.
    pub job_id: i64,
    /// The pipeline.
    pub pipeline: String,
    /// The step's name.
    pub step: String,
    /// The step's position.
    pub step_index: i32,
    /// This attempt (1-based).
    pub attempt: i32,
    /// The input packets' data.
    pub inputs: Vec<Value>,
    pub(crate) scope: String,
    pub(crate) completion: CompletionConfig,
    pub(crate) claim_ttl: chrono::Duration,
    /// This run of the step (its action lease): recorded on the claims it takes.
    pub(crate) run: ClaimRun,
    pub(crate) engine: Arc<Engine>,
}

impl std::fmt::Debug for StepContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepContext")
            .field("job_id", &self.job_id)
            .field("step", &self.step_id())
            .finish()
    }
}

impl StepContext {
    /// The executing step's id, `pipeline/step` (what the reprocess callback is told, J7).
    pub fn step_id(&self) -> String {
        format!("{}/{}", self.pipeline, self.step)
    }

    /// The first input, or `null`.
    pub fn input(&self) -> &Value {
        self.inputs.first().unwrap_or(&Value::Null)
    }

    /// Claims an item in this step's scope for this job, with the step's completion config and
    /// claim TTL. `None` when someone else holds it, it was processed and the reprocess
    /// callback said no, or the job is no longer live at this step (finished, or moved on
    /// while this run ran). An [`crate::Error::LeaseLost`] error when this run lost its lease
    /// (a newer run of the step took over): stop; the newer run's output is the one that
    /// counts.
    pub async fn claim(&self, source_type: &str, item_id: &str) -> Result<Option<Descriptor>> {
        let identity = Identity::new(self.scope.clone(), source_type, item_id)?;
        self.engine
            .claim_for_step(self, identity, self.completion.clone())
            .await
    }

    /// Claims an item in another scope (e.g. `shared:feed`) with a given completion config.
    pub async fn claim_in(
        &self,
        scope: &str,
        source_type: &str,
        item_id: &str,
        completion: CompletionConfig,
    ) -> Result<Option<Descriptor>> {
        let identity = Identity::new(scope, source_type, item_id)?;
        self.engine.claim_for_step(self, identity, completion).await
    }

    /// [`Self::claim`] for many items of one source type in this step's scope, in one store
    /// call (one transaction: the job and this run checked once, not per item); see
    /// [`Self::claim_many_in`].
    pub async fn claim_many<I, S>(
        &self,
        source_type: &str,
        item_ids: I,
    ) -> Result<Vec<Option<Descriptor>>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let scope = self.scope.clone();
        self.claim_many_in(&scope, source_type, item_ids, self.completion.clone())
            .await
    }

    /// [`Self::claim_in`] for many items, in one store call ([`crate::Store::claim_items`]):
    /// one result per item id, in order, `None` exactly where `claim_in` would give `None`.
    /// Items already processed are put to the reprocess callback one by one, and the ones it
    /// takes again are claimed in a second call. Much faster than a `claim_in` per item (one
    /// transaction per call instead of per item); claim a long list in chunks of a few
    /// hundred to a few thousand, so each transaction stays short. A repeated id gets what
    /// its first occurrence got (this job holds it). [`crate::Error::LeaseLost`] when this run
    /// lost its lease: nothing of the call was claimed.
    ///
    /// ```no_run
    /// use dockhand::{CompletionConfig, Packet, Pipeline, StepOutput};
    /// use serde_json::json;
    ///
    /// let pipeline = Pipeline::new("import").step("claim", |ctx| async move {
    ///     let ids: Vec<String> = (0..10_000).map(|i| format!("row-{i}")).collect();
    ///     let mut packets = Vec::new();
    ///     for chunk in ids.chunks(500) {
    ///         let claimed = ctx
    ///             .claim_many_in("shared:rows", "csv", chunk, CompletionConfig::default())
    ///             .await
    ///             .map_err(dockhand::HandlerError::retry)?;
    ///         for (id, d) in chunk.iter().zip(claimed) {
    ///             if let Some(d) = d {
    ///                 packets.push(Packet::new(json!({ "id": id })).with_claim(d));
    ///             }
    ///         }
    ///     }
    ///     Ok(StepOutput::Packets(packets))
    /// });
    /// # let _ = pipeline;
    /// ```
    pub async fn claim_many_in<I, S>(
        &self,
        scope: &str,
        source_type: &str,
        item_ids: I,
        completion: CompletionConfig,
    ) -> Result<Vec<Option<Descriptor>>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let identities = item_ids
            .into_iter()
            .map(|id| Identity::new(scope, source_type, id.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        self.engine
            .claim_many_for_step(self, identities, completion)
            .await
    }

    /// Legacy job-owned claim without a descriptor (C6): true when this job now owns it.
    pub async fn claim_item(&self, scope: &str, source_type: &str, item_id: &str) -> Result<bool> {
        Ok(self
            .claim_in(scope, source_type, item_id, CompletionConfig::default())
            .await?
            .is_some())
    }

    /// The job's engine data.
    pub async fn engine_data(&self) -> Result<Value> {
        self.engine.jobs().engine_data(self.job_id).await
    }

    /// Changes the job's engine data by compare-and-swap (E1).
    pub async fn mutate_engine_data<F>(&self, f: F) -> Result<Value>
    where
        F: Fn(&mut Value) + Send + Sync,
    {
        self.engine.jobs().mutate(self.job_id, f).await
    }
}
