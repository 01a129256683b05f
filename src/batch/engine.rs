//! The batch engine (B1–B8): fan-out of a step's packets into a worklist, the chunk action that
//! turns rows into child jobs, the finalize action that finishes the parent from its children's
//! counters, cancellation, and the failure routes of B3–B5 and B7.
//!
//! Every "not yet" leaves a durable wake-up: an active child (its terminal transaction enqueues
//! finalize once the parent is fenced and complete), a pending chunk or finalize action (a
//! failed store call makes the action retry), or — after a crash between two store calls —
//! `recover-stuck`, which re-arms the chunk action of any stranded parent.

use super::{
    BatchAbort, ChildOutcome, ChildSpec, FanOutOutcome, FenceOutcome, RowSettle, WorkItem,
    DEFAULT_CHUNK_SIZE, MAX_CHILD_ATTEMPTS,
};
use crate::claims::{hex, DEFAULT_CLAIM_TTL};
use crate::error::{Error, Result};
use crate::handler::{ActionContext, HandlerError, HandlerResult};
use crate::jobs::engine::{unless_lease_lost, Engine};
use crate::jobs::packets;
use crate::jobs::pipeline::{Packet, Pipeline};
use crate::jobs::Job;
use crate::store::Lease;
use backon::{ExponentialBuilder, Retryable};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// How long a chunk holds the rows it is turning into children.
const ROW_LEASE: chrono::Duration = chrono::Duration::minutes(5);
/// How long a chunk action waits before re-checking rows another chunk action holds.
const LEASED_ROWS_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

fn arg(ctx: &ActionContext, name: &str) -> std::result::Result<i64, HandlerError> {
    ctx.args.get(name).and_then(|v| v.as_i64()).ok_or_else(|| {
        HandlerError::fatal(format!(
            "action {}: `{name}` missing from args {}",
            ctx.action_id, ctx.args
        ))
    })
}

fn retry(e: Error) -> HandlerError {
    HandlerError::retry(e)
}

impl Engine {
    /// B1: writes the worklist for `packets_out` and schedules the first chunk. An exact retry
    /// adopts the existing worklist; a different one is refused and leaves it intact.
    pub(crate) async fn fan_out(
        &self,
        job: &Job,
        step: i32,
        packets_out: &[Packet],
        pipeline: &Pipeline,
        fence: Lease,
    ) -> HandlerResult {
        let now = self.clock.now();
        let encoded = packets_out
            .iter()
            .map(|p| packets::encode(&p.data))
            .collect::<Result<Vec<_>>>()
            .map_err(HandlerError::fatal)?;
        self.store.put_packets(&encoded, now).await.map_err(retry)?;
        // The sidecar is captured from the packets before they are content-addressed (C7).
        let items: Vec<WorkItem> = encoded
            .iter()
            .zip(packets_out)
            .map(|(e, p)| WorkItem {
                payload_ref: e.reference.clone(),
                sidecar: p.descriptors.clone(),
            })
            .collect();
        let chunk_size = pipeline.chunk_size.unwrap_or(DEFAULT_CHUNK_SIZE).max(1);
        self.fan_out_items(
            job.id,
            Some(fence),
            &items,
            chunk_size,
            step + 1,
            pipeline.priority,
        )
        .await
    }

    /// B1 for prepared items: writes the worklist of `job_id` (children at `child_step`) and
    /// schedules the first chunk. The contract hashes the job, child step, chunk size, every
    /// payload ref and claim token: an exact retry adopts, a different one is refused. With
    /// `fence` (the lease of the step run that fans out), a run that lost it writes nothing.
    pub(crate) async fn fan_out_items(
        &self,
        job_id: i64,
        fence: Option<Lease>,
        items: &[WorkItem],
        chunk_size: i32,
        child_step: i32,
        priority: i32,
    ) -> HandlerResult {
        let mut h = Sha256::new();
        h.update(format!("{job_id}:{child_step}:{chunk_size}"));
        for item in items {
            h.update(item.payload_ref.as_bytes());
            for d in &item.sidecar {
                h.update(d.token.as_bytes());
            }
        }
        let contract = hex(&h.finalize());
        let now = self.clock.now();
        let written = self
            .store
            .fan_out(
                job_id,
                fence,
                items,
                (chunk_size, child_step),
                &contract,
                now,
            )
            .await;
        match unless_lease_lost(written, job_id, "fan-out")? {
            None => return Ok(()),
            Some(FanOutOutcome::Created | FanOutOutcome::Adopted) => {}
            Some(FanOutOutcome::Rejected { existing }) => {
                return Err(HandlerError::fatal(format!(
                    "job {job_id}: a batch with another contract ({existing}) exists; the original is kept"
                )))
            }
        }
        if let Err(e) = self.schedule_chunk(job_id, 0, priority).await {
            tracing::warn!(job_id, error = %e, "first chunk could not be scheduled");
            self.batch_schedule_failed(job_id).await.map_err(retry)?;
        }
        Ok(())
    }

    /// A step action delivered to a job that already fanned out (recognised by its batch row:
    /// a re-delivery after a lost finish, or an operator's retry of the step action, which
    /// resets its attempt count): the step's output is the committed worklist, so the step
    /// does not run again (a re-run could not claim the items the first children hold, and
    /// its smaller fan-out would be refused as another contract). Instead it makes sure the
    /// batch has a way forward (B7): the parent is finished if due; the first chunk is
    /// scheduled if scheduling has not ended (an earlier delivery may have died before
    /// scheduling it, as an adopted fan-out does); rows still leased with no child active get
    /// a chunk action to settle them. Active children are their own wake-up.
    pub(crate) async fn resume_fanned_out(&self, job: &Job, step: i32) -> HandlerResult {
        let job_id = job.id;
        let Some(st) = self.store.batch_state(job_id).await.map_err(retry)? else {
            return Ok(());
        };
        tracing::info!(
            job_id,
            step,
            "step delivered again after its fan-out committed; the batch carries on"
        );
        let priority = self.priority_of(&job.pipeline);
        if st.decision().is_some() {
            return self.finalize_if_due(job_id, &st).await.map_err(retry);
        }
        if !st.fenced && st.outcome.is_none() {
            if let Err(e) = self.schedule_chunk(job_id, 0, priority).await {
                tracing::warn!(job_id, error = %e, "first chunk could not be scheduled");
                self.batch_schedule_failed(job_id).await.map_err(retry)?;
            }
        } else if st.active_children() == 0 {
            // Fenced or stopped, not due: only leased rows are left, held by a chunk run that
            // may have died. A chunk action past the worklist settles them once free.
            self.schedule_chunk(job_id, st.items_total, priority)
                .await
                .map_err(retry)?;
        }
        Ok(())
    }

    /// The chunk priority of a pipeline, or the default when this runtime does not know it.
    fn priority_of(&self, pipeline: &str) -> i32 {
        self.pipelines
            .pipelines
            .get(pipeline)
            .map_or(crate::action::DEFAULT_PRIORITY, |p| p.priority)
    }

    /// B3: stop scheduling, discard unscheduled rows (their claims released), and finish the
    /// parent `failed / batch_schedule_failed` now if no child is active (else the last child's
    /// terminal transaction enqueues finalize, which decides it).
    pub(crate) async fn batch_schedule_failed(&self, parent: i64) -> Result<()> {
        let st = self
            .store
            .abort_batch(parent, BatchAbort::ScheduleFailed, self.clock.now())
            .await?;
        self.finalize_if_due(parent, &st).await
    }

    /// Enqueues the chunk action at `offset`, retrying transient database errors (busy,
    /// deadlock, lost connection) a few times in-process, so that only a persistent failure
    /// becomes B3's `batch_schedule_failed`. The chunk action is unique per (parent, offset):
    /// a retry after a commit whose acknowledgement was lost adds nothing.
    async fn schedule_chunk(&self, parent: i64, offset: i64, priority: i32) -> Result<()> {
        let call = || async {
            self.store
                .schedule_chunk(parent, offset, priority, self.clock.now())
                .await
        };
        call.retry(
            ExponentialBuilder::default()
                .with_min_delay(std::time::Duration::from_millis(20))
                .with_max_times(4),
        )
        .when(|e: &Error| e.is_transient())
        .notify(|e, _| {
            metrics::counter!(crate::telemetry::STORE_RETRIES, "op" => "schedule_chunk")
                .increment(1);
            tracing::debug!(parent, offset, error = %e, "retrying the chunk enqueue");
        })
        .await
    }

    pub(crate) async fn finalize_if_due(&self, parent: i64, st: &super::BatchState) -> Result<()> {
        if let Some((status, why)) = st.decision() {
            self.bridge(parent, status, why).await?;
            if let Err(e) = self.store.cleanup_worklist(parent).await {
                tracing::warn!(parent, error = %e, "worklist cleanup deferred");
            }
        }
        Ok(())
    }

    /// B2: the `dockhand.batch.chunk {parent, offset}` action.
    pub(crate) async fn run_chunk(self: Arc<Self>, ctx: ActionContext) -> HandlerResult {
        let parent = arg(&ctx, "parent")?;
        let offset = arg(&ctx, "offset")?;
        let Some(job) = self.store.get_job(parent).await.map_err(retry)? else {
            return Err(HandlerError::fatal(format!(
                "batch parent {parent} does not exist"
            )));
        };
        if job.status.is_final() {
            let _ = self.store.cleanup_worklist(parent).await;
            return Ok(());
        }
        // The parent row's batch fields only: the worklist's counts would make every chunk
        // O(items); what follows the chunk is decided from `worklist_pending`'s probes.
        let Some(st) = self.store.batch_head(parent).await.map_err(retry)? else {
            return Err(HandlerError::fatal(format!(
                "job {parent} is not a batch parent"
            )));
        };
        let Some(pipeline) = self.pipelines.pipelines.get(&job.pipeline).cloned() else {
            return Err(HandlerError::fatal(format!(
                "unknown pipeline `{}`",
                job.pipeline
            )));
        };
        let now = self.clock.now();
        // Children run here (`Pipeline::children_in_chunk`) when the runner running this
        // chunk said who it is; the inline testing helpers leave them to the runners.
        let in_chunk = pipeline
            .children_in_chunk
            .zip(ctx.run.runner().cloned())
            .filter(|_| st.outcome.is_none());
        let run_by = in_chunk.as_ref().map(|(_, facts)| super::RunBy {
            owner: facts.owner.clone(),
            lease_until: now + facts.lease,
        });
        // Every delivery of this chunk action leases rows under one owner, so a re-delivery
        // after its predecessor died takes that predecessor's rows back at once instead of
        // waiting out the row lease. A predecessor that was only paused is fenced out by its
        // lease token: the store refuses its leases and settles (`LeaseLost`), and child
        // creation is idempotent per row, so it cannot create a second child.
        let chunk = Lease {
            id: ctx.action_id,
            token: ctx.token,
        };
        if st.outcome.is_some() {
            // Aborted (schedule failure or cancel): nothing more to schedule. Rows still leased
            // by a chunk whose worker died are discarded (claims released) once their lease
            // expires, so the parent can finish.
            let orphans = self
                .store
                .lease_work(
                    parent,
                    i64::from(st.chunk_size),
                    chunk,
                    now + ROW_LEASE,
                    now,
                )
                .await
                .map_err(retry)?;
            for row in orphans {
                let discard = RowSettle::Discard {
                    reason: "batch stopped while the row was in flight".into(),
                };
                self.store
                    .settle_work(parent, row.idx, chunk, &discard, now)
                    .await
                    .map_err(retry)?;
            }
            let Some(st) = self.store.batch_state(parent).await.map_err(retry)? else {
                return Err(HandlerError::fatal(format!(
                    "job {parent} is not a batch parent"
                )));
            };
            if st.leased > 0 && st.active_children() == 0 {
                // Another chunk run holds rows: stay as the wake-up until they come free.
                return Err(HandlerError::snooze(LEASED_ROWS_RECHECK));
            }
            return self.finalize_if_due(parent, &st).await.map_err(retry);
        }
        let rows = self
            .store
            .lease_work(
                parent,
                i64::from(st.chunk_size),
                chunk,
                now + ROW_LEASE,
                now,
            )
            .await
            .map_err(retry)?;
        // The packets of the rows that can become children, in one read; each body verified
        // is kept in the engine's cache for the child's step run.
        let hashes: Vec<&str> = rows
            .iter()
            .filter(|row| row.sidecar_error.is_none())
            .filter_map(|row| packets::parse_ref(&row.payload_ref).ok())
            .collect();
        let bodies = if hashes.is_empty() {
            Default::default()
        } else {
            self.store.packet_bodies(&hashes).await.map_err(retry)?
        };
        // Rows whose packet cannot be read are settled; the rest become children together.
        let mut specs = Vec::with_capacity(rows.len());
        for row in &rows {
            let settle = match (&row.sidecar_error, packets::parse_ref(&row.payload_ref)) {
                (Some(e), _) => RowSettle::Discard {
                    reason: format!("corrupt sidecar: {e}"),
                },
                (None, Err(e)) => RowSettle::Discard {
                    reason: format!("hydration failed: {e}"),
                },
                (None, Ok(hash)) => {
                    let body = bodies.get(hash);
                    match packets::verify(&row.payload_ref, body.cloned()) {
                        Err(e) => RowSettle::Discard {
                            reason: format!("hydration failed: {e}"),
                        },
                        Ok(_) => {
                            if let Some(body) = body {
                                self.packet_cache.put(hash, body);
                            }
                            specs.push(ChildSpec {
                                parent_id: parent,
                                idx: row.idx,
                                pipeline: job.pipeline.clone(),
                                step_index: st.child_step,
                                input_refs: vec![row.payload_ref.clone()],
                                // The claims the parent holds move to the child; a descriptor
                                // of another owner is not the parent's to hand over.
                                claim_tokens: row
                                    .sidecar
                                    .iter()
                                    .filter(|d| d.job_id == Some(parent))
                                    .map(|d| d.token.clone())
                                    .collect(),
                                claim_ttl: DEFAULT_CLAIM_TTL,
                                step: pipeline.step_action(),
                                run_by: run_by.clone(),
                            });
                            continue;
                        }
                    }
                }
            };
            self.settle_row(parent, row.idx, chunk, settle).await?;
        }
        let leased = self.create_children(parent, &specs, chunk).await?;
        // The next chunk is scheduled (or the fence set) before this one's children run, so
        // chunks overlap on other slots; a child's terminal transaction enqueues finalize
        // when it finds the parent fenced and every child terminal.
        let after = self
            .after_chunk(parent, offset, st.chunk_size, &pipeline)
            .await;
        if let Some((max_concurrent, facts)) = in_chunk {
            if !leased.is_empty() {
                self.run_children_in_chunk(&ctx, &facts, leased, max_concurrent)
                    .await;
            }
        }
        after
    }

    /// Turns the specs of one chunk into children: all at once ([`crate::Store::create_children`],
    /// one transaction), or row by row when that fails (so one bad row cannot fail its
    /// neighbours: each row's failure is settled on its own, B4). A lost chunk lease ends the
    /// run (a newer delivery owns the rows).
    async fn create_children(
        &self,
        parent: i64,
        specs: &[ChildSpec],
        chunk: Lease,
    ) -> std::result::Result<Vec<super::in_chunk::LeasedChild>, HandlerError> {
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let created_at = self.clock.now();
        let outcomes = match self.store.create_children(specs, chunk, created_at).await {
            Ok(o) if o.len() == specs.len() => o.into_iter().map(Ok).collect(),
            Err(e @ Error::LeaseLost { .. }) => return Err(retry(e)),
            other => {
                if let Err(e) = other {
                    tracing::debug!(parent, error = %e, "creating the chunk's children together failed; one by one");
                }
                let mut each = Vec::with_capacity(specs.len());
                for spec in specs {
                    each.push(self.store.create_child(spec, chunk, self.clock.now()).await);
                }
                each
            }
        };
        let mut leased = Vec::new();
        for (spec, outcome) in specs.iter().zip(outcomes) {
            let settle = match outcome {
                Ok(ChildOutcome::Created(_) | ChildOutcome::Adopted(_)) => continue,
                Ok(ChildOutcome::Leased { child, step_action }) => {
                    leased.push(super::in_chunk::LeasedChild {
                        // Started by the creating transaction (`ChildOutcome::Leased`).
                        job: crate::jobs::Job {
                            id: child,
                            pipeline: spec.pipeline.clone(),
                            status: crate::JobStatus::Processing,
                            reason: None,
                            step_index: spec.step_index,
                            input_refs: spec.input_refs.clone(),
                            engine_version: 0,
                            parent_id: Some(parent),
                            created_at,
                            updated_at: created_at,
                            finished_at: None,
                        },
                        lease: step_action,
                        max_attempts: spec.step.max_attempts,
                        group: spec.step.group.clone(),
                    });
                    continue;
                }
                Ok(ChildOutcome::Discarded(cause)) => {
                    tracing::warn!(
                        parent,
                        idx = spec.idx,
                        ?cause,
                        "worklist row discarded instead of becoming a child"
                    );
                    continue;
                }
                // A stale run: a newer attempt of this chunk owns its rows.
                Err(e @ Error::LeaseLost { .. }) => return Err(retry(e)),
                Err(e) => RowSettle::Retry {
                    error: e.to_string(),
                    max_attempts: MAX_CHILD_ATTEMPTS,
                },
            };
            self.settle_row(parent, spec.idx, chunk, settle).await?;
        }
        Ok(leased)
    }

    /// Settles a leased row that did not become a child.
    async fn settle_row(
        &self,
        parent: i64,
        idx: i32,
        chunk: Lease,
        settle: RowSettle,
    ) -> std::result::Result<(), HandlerError> {
        tracing::warn!(parent, idx, ?settle, "worklist row not turned into a child");
        self.store
            .settle_work(parent, idx, chunk, &settle, self.clock.now())
            .await
            .map_err(retry)
    }

    /// Schedules the next chunk (of this chunk's lane: [`crate::Pipeline::chunk_lanes`]; the
    /// first chunk also starts the other lanes), or sets the fence when nothing is outstanding.
    async fn after_chunk(
        &self,
        parent: i64,
        offset: i64,
        chunk: i32,
        pipeline: &crate::Pipeline,
    ) -> HandlerResult {
        let priority = pipeline.priority;
        let lanes = i64::from(pipeline.chunk_lanes.max(1));
        let st = self
            .store
            .worklist_pending(parent)
            .await
            .map_err(retry)?
            .ok_or_else(|| HandlerError::fatal(format!("job {parent} is not a batch parent")))?;
        let next = offset + lanes * i64::from(chunk);
        if st.ready {
            crate::failpoint::crash("batch.before_chunk");
            // The first chunk starts the other lanes (each unique per offset: a re-delivery
            // adopts the ones still pending or running).
            let others = if offset == 0 { 1..lanes } else { 0..0 };
            let offsets = others.map(|lane| lane * i64::from(chunk)).chain([next]);
            for at in offsets {
                if let Err(e) = self.schedule_chunk(parent, at, priority).await {
                    tracing::warn!(parent, offset = at, error = %e, "next chunk could not be scheduled");
                    self.batch_schedule_failed(parent).await.map_err(retry)?;
                    return Ok(());
                }
            }
            return Ok(());
        }
        if st.leased {
            // Another chunk action holds rows. It settles them and fences if it lives; if it
            // died, its rows come free when it is re-delivered or their lease ends. Either
            // way this action stays as the wake-up that re-checks (B-rules: a durable
            // wake-up must remain until the fence is set).
            return Err(HandlerError::snooze(LEASED_ROWS_RECHECK));
        }
        match self
            .store
            .fence_batch(parent, self.clock.now())
            .await
            .map_err(retry)?
        {
            FenceOutcome::Fenced { .. } => Ok(()),
            FenceOutcome::Outstanding { .. } => self
                .schedule_chunk(parent, next, priority)
                .await
                .map_err(retry),
        }
    }

    /// B6, B7: the `dockhand.batch.finalize {parent}` action. Decides from the database; when
    /// not due, leaves a wake-up (re-arms the chunk action if the fence is missing).
    pub(crate) async fn run_finalize(self: Arc<Self>, ctx: ActionContext) -> HandlerResult {
        let parent = arg(&ctx, "parent")?;
        let Some(job) = self.store.get_job(parent).await.map_err(retry)? else {
            return Ok(());
        };
        if job.status.is_final() {
            let _ = self.store.cleanup_worklist(parent).await;
            return Ok(());
        }
        let Some(st) = self.store.batch_state(parent).await.map_err(retry)? else {
            return Err(HandlerError::fatal(format!(
                "job {parent} is not a batch parent"
            )));
        };
        if st.decision().is_some() {
            return self.finalize_if_due(parent, &st).await.map_err(retry);
        }
        if !st.fenced {
            let priority = self.priority_of(&job.pipeline);
            self.schedule_chunk(parent, st.items_total, priority)
                .await
                .map_err(retry)?;
        } else if st.leased > 0 && st.active_children() == 0 {
            // Rows an in-flight (or dead) chunk run holds: re-check until they are settled.
            return Err(HandlerError::snooze(LEASED_ROWS_RECHECK));
        }
        Ok(())
    }
}
