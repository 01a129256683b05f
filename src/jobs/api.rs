//! The job API: start pipeline runs, read jobs, fail/cancel/resume them, change engine data,
//! and take item claims outside a step.

use super::bridge::{reason, Finished};
use super::engine::Engine;
use super::{packets, Job, JobFilter, NewJob};
use crate::claims::{
    ClaimItemRequest, ClaimOutcome, CompleteOutcome, CompletionConfig, Descriptor, Identity,
    ItemClaim,
};
use crate::error::{Error, Result};
use crate::state::JobStatus;
use serde_json::Value;
use std::sync::Arc;

/// Longest idempotency key [`Jobs::start_with`] accepts, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 1024;

/// Options of [`Jobs::start_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Unique among the jobs of the pipeline: a start whose key a stored job holds returns
    /// that job's id and creates nothing (1 to [`MAX_IDEMPOTENCY_KEY`] bytes, no NUL).
    pub idempotency_key: Option<String>,
}

impl StartOptions {
    /// Options with this idempotency key.
    pub fn idempotency_key(key: impl Into<String>) -> Self {
        Self {
            idempotency_key: Some(key.into()),
        }
    }
}

/// A handle on jobs and item claims. Cheap to clone.
///
/// ```no_run
/// use dockhand::{Runtime, StartOptions};
/// use serde_json::json;
///
/// # async fn demo(runtime: Runtime) -> dockhand::Result<()> {
/// let jobs = runtime.jobs();
/// // a retried request with the same key gets the same job back, never a second job
/// let job = jobs
///     .start_with("import", json!({"feed": "news"}), &StartOptions::idempotency_key("import:news:2026-12-03"))
///     .await?;
/// let stored = jobs.get(job).await?;
/// println!("job {job} is {:?} at step {}", stored.status, stored.step_index);
/// jobs.cancel(job).await?; // batch-aware: a fanned-out job stops its children too
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Jobs {
    engine: Arc<Engine>,
}

impl Jobs {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The step names of a registered pipeline, in order (`None` when this handle does not
    /// know it, e.g. [`Jobs::without_pipelines`]); the dashboard labels a job's stepper with them.
    pub fn pipeline_steps(&self, pipeline: &str) -> Option<Vec<String>> {
        self.engine
            .pipelines
            .pipelines
            .get(pipeline)
            .map(|p| p.steps.iter().map(|s| s.name.clone()).collect())
    }

    /// Starts a run of `pipeline` with `input` as its first step's input packet; returns the
    /// job id. The job is created `pending` together with its first step action.
    pub async fn start(&self, pipeline: &str, input: Value) -> Result<i64> {
        self.start_with(pipeline, input, &StartOptions::default())
            .await
    }

    /// [`Jobs::start`] with options. With an idempotency key, a start whose key is already
    /// held by a job of the same pipeline creates nothing and returns that job's id, so a start
    /// retried after a lost acknowledgement (a timeout, a crash before the caller recorded the
    /// id) cannot run the pipeline twice. The key identifies the job: the input of a repeated
    /// start is not compared. It holds while the job is stored: once retention deletes the
    /// final job (`MaintenanceConfig::keep_finished` / `keep_failed`), the key is free again.
    pub async fn start_with(
        &self,
        pipeline: &str,
        input: Value,
        options: &StartOptions,
    ) -> Result<i64> {
        let now = self.engine.clock.now();
        let job = self.new_job(pipeline, input, options, now).await?;
        self.engine.store.create_job(&job, now).await
    }

    /// The job [`Jobs::start_with`] creates, its input packet stored: the pipeline must be
    /// registered here and the key well formed.
    pub(crate) async fn new_job(
        &self,
        pipeline: &str,
        input: Value,
        options: &StartOptions,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<NewJob> {
        let p = self
            .engine
            .pipelines
            .pipelines
            .get(pipeline)
            .ok_or_else(|| {
                Error::invalid(
                    "pipeline",
                    format!("no pipeline registered as `{pipeline}`"),
                )
            })?;
        if let Some(key) = &options.idempotency_key {
            if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY || key.contains('\0') {
                return Err(Error::invalid(
                    "idempotency_key",
                    format!(
                        "pipeline `{pipeline}`: the key must be 1 to {MAX_IDEMPOTENCY_KEY} bytes \
                         without NUL (got {} bytes)",
                        key.len()
                    ),
                ));
            }
        }
        let encoded = packets::encode(&input)?;
        self.engine
            .store
            .put_packets(std::slice::from_ref(&encoded), now)
            .await?;
        Ok(NewJob {
            pipeline: pipeline.to_string(),
            input_refs: vec![encoded.reference],
            engine_data: serde_json::json!({}),
            step: p.step_action(),
            idempotency_key: options.idempotency_key.clone(),
        })
    }

    /// Re-runs the failed children of the finished batch `parent`; returns the new job's id.
    ///
    /// A failed child stays final and counted in its parent. The re-run is a new batch parent
    /// of the same pipeline: its first step claims each failed child's items again (an item
    /// another job holds, or that was processed since, is left out) and fans the child's
    /// input packet out to the same child step, so only what failed runs again, through the
    /// same claims, chunks and terminal bridge. Refused (naming why) while `parent` is not
    /// final, when it is not a batch parent, has no failed child, or its pipeline is not
    /// registered.
    pub async fn rerun_failed(&self, parent: i64) -> Result<i64> {
        self.engine.start_rerun(parent).await
    }

    /// One job.
    pub async fn get(&self, id: i64) -> Result<Job> {
        self.engine
            .store
            .get_job(id)
            .await?
            .ok_or(Error::NotFound { what: "job", id })
    }

    /// Jobs by filter, newest first.
    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        self.engine.store.list_jobs(filter).await
    }

    /// Fails a job by hand through the terminal bridge (reason defaults to `manual`); its
    /// claims are released. A batch parent is stopped as [`Jobs::cancel`] stops it and
    /// finishes `failed` with this reason once no child is active; until then the result keeps
    /// its current status with reason `fail_requested`.
    pub async fn manual_fail(&self, id: i64, why: Option<&str>) -> Result<Finished> {
        self.engine
            .stop_job(id, JobStatus::Failed, Some(why.unwrap_or(reason::MANUAL)))
            .await
    }

    /// Cancels a job through the terminal bridge (reason `manual`); its claims are released.
    /// A batch parent (B5) stops at once: unscheduled items are discarded (their claims
    /// released), no further child is created, children not yet started are cancelled
    /// through the bridge, running children start no further step; it finishes `cancelled`
    /// when no child is active — at once if none is, else the result keeps its current status
    /// with reason `cancel_requested`. The same function serves the CLI's `cancel-job` and the
    /// dashboard, from the store alone.
    pub async fn cancel(&self, id: i64) -> Result<Finished> {
        self.engine
            .stop_job(id, JobStatus::Cancelled, Some(reason::MANUAL))
            .await
    }

    /// Finishes a job with any final status through the terminal bridge. `cancelled` and
    /// `failed` on a batch parent stop its batch as [`Jobs::cancel`] does; a success status
    /// on a live batch parent is refused (it finishes from its children).
    pub async fn finish(&self, id: i64, status: JobStatus, why: Option<&str>) -> Result<Finished> {
        if !status.is_final() {
            return Err(Error::invalid(
                "status",
                format!("{status} is not a final status"),
            ));
        }
        self.engine.stop_job(id, status, why).await
    }

    /// Resumes a parked (`waiting`) job; false when it was not waiting.
    pub async fn resume(&self, id: i64) -> Result<bool> {
        let job = self.get(id).await?;
        let p = self
            .engine
            .pipelines
            .pipelines
            .get(&job.pipeline)
            .ok_or_else(|| {
                Error::invalid(
                    "pipeline",
                    format!("no pipeline registered as `{}`", job.pipeline),
                )
            })?;
        self.engine
            .store
            .resume_job(id, &p.step_action(), self.engine.clock.now())
            .await
    }

    /// The job's engine data.
    pub async fn engine_data(&self, id: i64) -> Result<Value> {
        Ok(self
            .engine
            .store
            .engine_data(id)
            .await?
            .ok_or(Error::NotFound { what: "job", id })?
            .0)
    }

    /// Changes the job's engine data by compare-and-swap with bounded retries (E1).
    pub async fn mutate<F>(&self, id: i64, f: F) -> Result<Value>
    where
        F: Fn(&mut Value) + Send + Sync,
    {
        super::engine_data::mutate(&self.engine.store, id, f).await
    }

    /// Claims an item outside a step (C2): `None` when someone else actively holds it, it
    /// was processed already (pass `reprocess` to take a processed item again), or `job_id`
    /// names a job that is already final (checked under a lock on the job row, in the claim's
    /// transaction). The claim holds for `ttl`, renewed by maintenance while its job lives.
    pub async fn claim(
        &self,
        identity: Identity,
        job_id: Option<i64>,
        ttl: chrono::Duration,
        completion: CompletionConfig,
        reprocess: bool,
    ) -> Result<Option<Descriptor>> {
        identity.validate()?;
        if ttl <= chrono::Duration::zero() {
            return Err(Error::invalid("ttl", "must be positive"));
        }
        let req = ClaimItemRequest {
            identity,
            job_id,
            ttl,
            completion,
            reprocess,
            run: None,
        };
        match self
            .engine
            .store
            .claim_item(&req, self.engine.clock.now())
            .await?
        {
            ClaimOutcome::Claimed(d) => Ok(Some(d)),
            ClaimOutcome::HeldByOther | ClaimOutcome::AlreadyProcessed => Ok(None),
            ClaimOutcome::JobNotLive { job_id, status, .. } => {
                tracing::info!(job_id, %status, "claim refused: the job is already final");
                Ok(None)
            }
        }
    }

    /// Legacy job-owned claim (C6): true when `job_id` now owns the item.
    pub async fn claim_item(
        &self,
        scope: &str,
        source_type: &str,
        item_id: &str,
        job_id: i64,
    ) -> Result<bool> {
        let identity = Identity::new(scope, source_type, item_id)?;
        Ok(self
            .claim(
                identity,
                Some(job_id),
                crate::claims::DEFAULT_CLAIM_TTL,
                CompletionConfig::default(),
                false,
            )
            .await?
            .is_some())
    }

    /// Completes a claim with its completion handler in one transaction (C4). `Lost` when the
    /// token no longer holds the claim; an error when the handler fails or panics (nothing
    /// persists) or the descriptor names an unregistered handler. A handler's transient
    /// failure re-runs the transaction; if it persists the error is
    /// [`Error::TransientCompletion`] ([`Error::is_transient`]): try again later.
    pub async fn complete(&self, descriptor: &Descriptor) -> Result<CompleteOutcome> {
        descriptor.identity.validate()?;
        let handler = self.engine.completions.resolve(&descriptor.completion)?;
        self.engine
            .store
            .complete_claim(descriptor, handler, self.engine.clock.now())
            .await
    }

    /// Releases a claim (or defers it) while the token still holds it (C5).
    pub async fn release(&self, descriptor: &Descriptor, defer: bool) -> Result<bool> {
        self.engine
            .store
            .release_claim(descriptor, defer, self.engine.clock.now())
            .await
    }

    /// The stored claim of an item.
    pub async fn claim_state(&self, identity: &Identity) -> Result<Option<ItemClaim>> {
        self.engine.store.get_claim(identity).await
    }

    /// R2: finds stranded jobs and brings each forward (or reports it, in a dry run).
    pub async fn recover_stuck(
        &self,
        opts: &crate::batch::recovery::RecoverOptions,
    ) -> Result<crate::batch::recovery::RecoverReport> {
        self.engine.recover_stuck(opts).await
    }

    /// R3: every pending/processing job with what drives it.
    pub async fn liveness(&self, limit: i64) -> Result<Vec<crate::batch::JobLiveness>> {
        self.engine.liveness(limit).await
    }

    /// DESIGN §11: every broken invariant.
    pub async fn check(&self) -> Result<Vec<crate::batch::Violation>> {
        self.engine.check().await
    }

    /// A batch parent's fields and worklist counts.
    pub async fn batch_state(&self, parent: i64) -> Result<Option<crate::batch::BatchState>> {
        self.engine.store.batch_state(parent).await
    }

    /// A job handle over `store` without pipelines (operator tools: bridge finishes, recovery,
    /// audit, claims). Starting or resuming pipeline runs needs a runtime that registered them.
    /// It has only the built-in completion handlers and no lifecycle hooks: lifecycle events
    /// of the jobs it finishes stay in the outbox for a runtime's maintenance to deliver, and
    /// `recover_stuck` leaves jobs whose claims need other handlers for a runtime that has
    /// them.
    pub fn without_pipelines(store: crate::store::DynStore, clock: Arc<dyn crate::Clock>) -> Jobs {
        Jobs::new(Arc::new(Engine {
            store,
            clock,
            pipelines: Default::default(),
            completions: crate::claims::CompletionRegistry::with_builtins(),
            hooks: Default::default(),
            reprocess: None,
            delivers_events: false,
            listeners: super::listeners::Listeners::new(false),
            delivering: tokio::sync::Mutex::new(()),
            grouped: Default::default(),
            packet_cache: Default::default(),
        }))
    }

    /// Delivers undelivered lifecycle events now (the maintenance sweep does this too); a
    /// handle without hooks ([`Jobs::without_pipelines`]) delivers nothing.
    pub async fn deliver_events(&self) -> Result<usize> {
        self.engine.deliver_events().await
    }
}
