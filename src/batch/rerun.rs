//! Re-running a finished batch's failed children (`Jobs::rerun_failed`, the dashboard's
//! "Re-run failed children").
//!
//! A failed child is final (J3, J4): its final event is in the outbox and its parent's counters
//! count it, and the parent itself is usually final, decided once (B6). Nothing of that is
//! reopened. A re-run is a **new batch parent** of the same pipeline, created in one
//! transaction with the mark on the batch it re-runs (a batch is re-run once; what fails in the
//! re-run is re-run from the re-run). Its first step is the re-run step instead of the
//! pipeline's own: for each failed child it claims the child's items again (from the sidecar
//! the child kept, migration 0007) and fans the packet its worklist row gave it (also kept) out
//! to the same child step (B1–B8 from there). An item that another job holds, or that was
//! processed since, is left out, so an item is never run by two jobs at once. The re-run has
//! its own counters, events and final status.

use super::{FailedChild, WorkItem, DEFAULT_CHUNK_SIZE};
use crate::claims::{ClaimItemRequest, ClaimOutcome, Descriptor, DEFAULT_CLAIM_TTL};
use crate::error::{Error, Result};
use crate::handler::{HandlerError, HandlerResult};
use crate::jobs::engine::Engine;
use crate::jobs::pipeline::Pipeline;
use crate::jobs::{Job, NewJob};
use crate::state::JobStatus;
use crate::store::Lease;
use serde_json::{json, Value};

/// The engine-data key that marks a re-run and names the batch it re-runs.
pub const RERUN_OF: &str = "dockhand_rerun_of";

/// The engine-data key a re-run batch gets: the job that re-runs it.
pub const RERUN_BY: &str = "dockhand_rerun_by";

/// The batch a job's engine data says it re-runs, if it is a re-run.
pub fn rerun_of(engine_data: &Value) -> Option<i64> {
    engine_data.get(RERUN_OF).and_then(Value::as_i64)
}

/// The job that re-runs a batch, from the batch's engine data.
pub fn rerun_by(engine_data: &Value) -> Option<i64> {
    engine_data.get(RERUN_BY).and_then(Value::as_i64)
}

/// A batch's engine data marked as re-run by job `by` (a document that is not an object is
/// kept under `"data"`, never dropped).
pub(crate) fn mark_rerun_by(engine_data: &Value, by: i64) -> Value {
    let mut marked = match engine_data {
        Value::Object(_) => engine_data.clone(),
        Value::Null => json!({}),
        other => json!({ "data": other }),
    };
    if let Some(map) = marked.as_object_mut() {
        map.insert(RERUN_BY.to_string(), json!(by));
    }
    marked
}

/// Failed children read per store call.
const PAGE: i64 = 500;

impl Engine {
    /// Starts a re-run of `parent`'s failed children; returns the new job's id. Refused while
    /// the parent is not final, when it is not a batch parent, has no failed child, its
    /// pipeline is not registered here, or it was re-run already.
    ///
    /// A batch is re-run once: re-running it again would run again what its re-run already
    /// ran (items whose claims were deleted on completion, or that have none); what failed in
    /// the re-run is re-run from the re-run. The new job and the parent's mark
    /// (`dockhand_rerun_by`, compare-and-swap on its engine version) are written in one
    /// transaction, so of two requests at the same moment one creates nothing.
    pub(crate) async fn start_rerun(&self, parent: i64) -> Result<i64> {
        let job = self.store.get_job(parent).await?.ok_or(Error::NotFound {
            what: "job",
            id: parent,
        })?;
        if self.store.batch_state(parent).await?.is_none() {
            return Err(Error::invalid(
                "job",
                format!("job {parent} is not a batch parent: it has no children to re-run"),
            ));
        }
        if !job.status.is_final() {
            return Err(Error::invalid(
                "job",
                format!(
                    "batch {parent} is {}: its failed children can be re-run once it is final",
                    job.status
                ),
            ));
        }
        let (data, version) = self
            .store
            .engine_data(parent)
            .await?
            .ok_or(Error::NotFound {
                what: "job",
                id: parent,
            })?;
        if let Some(by) = rerun_by(&data) {
            return Err(Error::invalid(
                "job",
                format!(
                    "batch {parent} was re-run already by job {by}: re-run that job's failed children instead"
                ),
            ));
        }
        if self.store.failed_children(parent, 0, 1).await?.is_empty() {
            return Err(Error::invalid(
                "job",
                format!("batch {parent} has no failed children"),
            ));
        }
        let pipeline = self.pipelines.pipelines.get(&job.pipeline).ok_or_else(|| {
            Error::invalid(
                "pipeline",
                format!(
                    "batch {parent} ran pipeline `{}`, which is not registered here",
                    job.pipeline
                ),
            )
        })?;
        let rerun = NewJob {
            pipeline: job.pipeline.clone(),
            input_refs: Vec::new(),
            engine_data: json!({ RERUN_OF: parent }),
            step: pipeline.step_action(),
            idempotency_key: None,
        };
        let created = self
            .store
            .create_rerun_job(&rerun, parent, version, &data, self.clock.now())
            .await?;
        let Some(id) = created else {
            return Err(Error::invalid(
                "job",
                format!("batch {parent} was re-run by another request at the same moment"),
            ));
        };
        tracing::info!(
            job_id = id,
            parent,
            "re-run of a batch's failed children started"
        );
        Ok(id)
    }

    /// The batch that `job` re-runs, when `step` is its first step and it is a re-run. Only a
    /// job without input packets at step 0 is looked at, so ordinary steps read nothing more.
    pub(crate) async fn rerun_source(&self, job: &Job, step: i32) -> Result<Option<i64>> {
        if step != 0 || !job.input_refs.is_empty() {
            return Ok(None);
        }
        let data = self.store.engine_data(job.id).await?;
        Ok(data.and_then(|(d, _)| rerun_of(&d)))
    }

    /// The re-run step of `job`: claims the items of `source`'s failed children for `job` and
    /// fans their packets out to the child step. A retry before the fan-out committed claims
    /// the same items again (a job's own claim keeps its token); after it, the step does not
    /// run again ([`Engine::resume_fanned_out`]).
    pub(crate) async fn run_rerun(
        &self,
        job: &Job,
        source: i64,
        pipeline: &Pipeline,
        fence: Lease,
    ) -> HandlerResult {
        let st = self
            .store
            .batch_state(source)
            .await
            .map_err(HandlerError::retry)?
            .ok_or_else(|| HandlerError::fatal(format!("job {source} is not a batch parent")))?;
        let (mut items, mut left_out, mut after) = (Vec::new(), 0usize, 0);
        loop {
            let page = self
                .store
                .failed_children(source, after, PAGE)
                .await
                .map_err(HandlerError::retry)?;
            for child in &page {
                match self.rerun_item(job.id, child, st.child_step).await? {
                    Some(item) => items.push(item),
                    None => left_out += 1,
                }
            }
            match page.last() {
                Some(last) if i64::try_from(page.len()).unwrap_or(PAGE) >= PAGE => {
                    after = last.job.id;
                }
                _ => break,
            }
        }
        tracing::info!(
            job_id = job.id,
            source,
            items = items.len(),
            left_out,
            "re-run of failed children"
        );
        if items.is_empty() {
            return self
                .bridge(job.id, JobStatus::CompletedNoItems, None)
                .await
                .map(|_| ())
                .map_err(HandlerError::retry);
        }
        let chunk = pipeline.chunk_size.unwrap_or(DEFAULT_CHUNK_SIZE).max(1);
        self.fan_out_items(
            job.id,
            Some(fence),
            &items,
            chunk,
            st.child_step,
            pipeline.priority,
        )
        .await
    }

    /// One failed child as a worklist item of `owner`, its items claimed again; `None` when it
    /// cannot run now (what it claimed is given back): an item held by another job or
    /// processed since, a sidecar that cannot be read, or (a child from before migration 0007)
    /// no record of the packet its child step was given.
    async fn rerun_item(
        &self,
        owner: i64,
        child: &FailedChild,
        child_step: i32,
    ) -> std::result::Result<Option<WorkItem>, HandlerError> {
        let id = child.job.id;
        // The child's own input_refs move on with its steps: only the worklist's ref (or, from
        // before 0007, input_refs while still at the child step) is the child step's input.
        let payload_ref = match (&child.item_ref, child.job.input_refs.as_slice()) {
            (Some(r), _) => r,
            (None, [r]) if child.job.step_index == child_step => r,
            _ => {
                tracing::warn!(
                    child = id,
                    "left out of the re-run: its child-step input is not recorded"
                );
                return Ok(None);
            }
        };
        if let Some(e) = &child.sidecar_error {
            tracing::warn!(child = id, error = %e, "left out of the re-run: unreadable sidecar");
            return Ok(None);
        }
        let mut claimed: Vec<Descriptor> = Vec::with_capacity(child.sidecar.len());
        for d in &child.sidecar {
            let req = ClaimItemRequest {
                identity: d.identity.clone(),
                job_id: Some(owner),
                ttl: DEFAULT_CLAIM_TTL,
                completion: d.completion.clone(),
                reprocess: false,
                run: None,
            };
            let now = self.clock.now();
            match self.store.claim_item(&req, now).await {
                Ok(ClaimOutcome::Claimed(nd)) => claimed.push(nd),
                Ok(other) => {
                    tracing::info!(child = id, item = %d.identity.item_id, outcome = ?other, "left out of the re-run");
                    self.give_back(&claimed).await?;
                    return Ok(None);
                }
                Err(e) => {
                    self.give_back(&claimed).await?;
                    return Err(HandlerError::retry(e));
                }
            }
        }
        Ok(Some(WorkItem {
            payload_ref: payload_ref.clone(),
            sidecar: claimed,
        }))
    }

    async fn give_back(&self, claimed: &[Descriptor]) -> std::result::Result<(), HandlerError> {
        for d in claimed {
            self.store
                .release_claim(d, false, self.clock.now())
                .await
                .map_err(HandlerError::retry)?;
        }
        Ok(())
    }
}
