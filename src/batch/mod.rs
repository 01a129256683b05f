//! Batches (B1–B8): a parent job whose step emitted many packets turns them into child jobs
//! chunk by chunk, from a durable worklist, and finishes from its children's counters.
//!
//! The three named actions that drive a batch, each safe to deliver twice:
//! - `dockhand.batch.chunk {parent, offset}` — chunk scheduling (unique per parent and offset),
//!   also the finalize retry / re-arm;
//! - the child's `dockhand.job.step` — child fan-out (unique per child and step);
//! - `dockhand.batch.finalize {parent}` — enqueued in the transaction of the child that makes the
//!   parent due, or by the chunk that sets the fence when every child is already terminal.
//!
//! This module holds the shared types; the engine logic is in `engine`.

pub mod engine;
pub(crate) mod in_chunk;
pub mod recovery;
pub mod rerun;
pub mod stop;

use crate::action::PreparedAction;
use crate::claims::Descriptor;
use crate::jobs::StepAction;
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// The hook of the chunk-scheduling action.
pub const CHUNK_HOOK: &str = "dockhand.batch.chunk";
/// The hook of the finalize action.
pub const FINALIZE_HOOK: &str = "dockhand.batch.finalize";
/// The group chunk and finalize actions carried before they were routed by pipeline (and
/// still carry when their parent job row is gone): claimed by any runtime that has pipelines.
/// Today's carry their parent's pipeline group; see [`action_group`].
pub const GROUP: &str = "dockhand.batch";
/// Default number of worklist rows turned into children per chunk action.
pub const DEFAULT_CHUNK_SIZE: i32 = 100;
/// How many times creating one child may fail before its row is discarded (B4).
pub const MAX_CHILD_ATTEMPTS: i32 = 3;

/// Reason codes of batch parents.
pub mod reason {
    /// Scheduling a chunk failed; unscheduled items were discarded.
    pub const BATCH_SCHEDULE_FAILED: &str = "batch_schedule_failed";
    /// Every child failed.
    pub const ALL_CHILDREN_FAILED: &str = "all_children_failed";
}

/// The values of a parent's `batch_outcome` (why it stopped scheduling).
pub mod outcome {
    /// A chunk could not be enqueued (B3); the parent finishes `failed / batch_schedule_failed`.
    pub const SCHEDULE_FAILED: &str = "batch_schedule_failed";
    /// An operator stopped the batch (B5: a cancel or a manual fail); the parent finishes with
    /// the stop's status and reason ([`super::BatchState::stop_status`]).
    pub const STOPPED: &str = "cancel_requested";
}

/// The worklist `lease_owner` of the chunk action `chunk_action_id`. Every delivery of one
/// chunk action shares it, so a re-delivery takes back the rows its dead predecessor leased;
/// a stale delivery is kept out by the action's lease token, not by this name.
pub fn chunk_owner(chunk_action_id: i64) -> String {
    format!("chunk:{chunk_action_id}")
}

/// The group of a batch's chunk and finalize actions: the group of its parent's pipeline
/// (`pipeline:<name>`, [`StepAction::group_for`]), so they are routed like the parent's step
/// actions, to a runtime that has the pipeline (its children's steps run there too); the
/// legacy [`GROUP`] when the parent row is gone (`pipeline` is `None`).
pub fn action_group(pipeline: Option<&str>) -> String {
    pipeline.map_or_else(|| GROUP.to_string(), StepAction::group_for)
}

/// The chunk action for `parent` at `offset`, in `group` ([`action_group`]): unique per
/// (parent, offset).
pub fn chunk_action(
    parent: i64,
    offset: i64,
    priority: i32,
    group: String,
    now: DateTime<Utc>,
) -> PreparedAction {
    PreparedAction {
        hook: CHUNK_HOOK.to_string(),
        args_json: format!(r#"{{"offset":{offset},"parent":{parent}}}"#),
        group: Some(group),
        priority,
        scheduled_at: crate::clock::to_millis(now),
        max_attempts: 25,
        timeout_ms: None,
        unique_key: Some(format!("b:{parent}:{offset}")),
        schedule_id: None,
    }
}

/// The finalize action for `parent`, in `group` ([`action_group`]): unique per parent among
/// active actions.
pub fn finalize_action(parent: i64, group: String, now: DateTime<Utc>) -> PreparedAction {
    PreparedAction {
        hook: FINALIZE_HOOK.to_string(),
        args_json: format!(r#"{{"parent":{parent}}}"#),
        group: Some(group),
        priority: 0,
        scheduled_at: crate::clock::to_millis(now),
        max_attempts: 25,
        timeout_ms: None,
        unique_key: Some(format!("f:{parent}")),
        schedule_id: None,
    }
}

/// One item to fan out: its packet ref and the claims that travel with it (the cleanup
/// sidecar, captured before the packet was content-addressed).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    /// `v1:<hash>` of the item's packet.
    pub payload_ref: String,
    /// Claims to hand to the child (or release if the item is discarded).
    pub sidecar: Vec<Descriptor>,
}

/// What `fan_out` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FanOutOutcome {
    /// Worklist and batch fields written.
    Created,
    /// An exact retry: the existing worklist was adopted, nothing written.
    Adopted,
    /// A retry with a different contract: refused, the original left intact.
    Rejected {
        /// The contract already stored.
        existing: String,
    },
}

/// A failed child of a batch, with the claim descriptors it was handed (migration 0007 keeps
/// them on the child row): what [`crate::Jobs::rerun_failed`] re-runs.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedChild {
    /// The child job.
    pub job: crate::jobs::Job,
    /// The packet ref of its worklist row (the child step's input; `None` for a child created
    /// before 0007).
    pub item_ref: Option<String>,
    /// The descriptors of its worklist row's sidecar (empty for a child created before 0007).
    pub sidecar: Vec<Descriptor>,
    /// Why the stored sidecar could not be decoded, if it could not.
    pub sidecar_error: Option<String>,
}

/// Whether a stored sidecar (JSON text) is malformed: not a JSON array of descriptors. Its
/// claims cannot be released by token; see [`crate::Store::settle_work`].
pub(crate) fn sidecar_text_is_malformed(text: &str) -> bool {
    decode_sidecar_text(Some(text)).1.is_some()
}

/// [`sidecar_text_is_malformed`] for a sidecar stored as JSON (PostgreSQL).
pub(crate) fn sidecar_is_malformed(json: &serde_json::Value) -> bool {
    serde_json::from_value::<Vec<Descriptor>>(json.clone()).is_err()
}

/// Decodes a stored cleanup sidecar (a JSON array of descriptors); `None` (no sidecar stored)
/// is empty. An undecodable one is empty with the reason, never a store error.
pub(crate) fn decode_sidecar(json: Option<serde_json::Value>) -> (Vec<Descriptor>, Option<String>) {
    match json.map(serde_json::from_value::<Vec<Descriptor>>) {
        None => (Vec::new(), None),
        Some(Ok(d)) => (d, None),
        Some(Err(e)) => (Vec::new(), Some(e.to_string())),
    }
}

/// [`decode_sidecar`] for a sidecar stored as JSON text (SQLite, MySQL).
pub(crate) fn decode_sidecar_text(text: Option<&str>) -> (Vec<Descriptor>, Option<String>) {
    match text.map(serde_json::from_str::<serde_json::Value>) {
        None => decode_sidecar(None),
        Some(Ok(v)) => decode_sidecar(Some(v)),
        Some(Err(e)) => (Vec::new(), Some(e.to_string())),
    }
}

/// A leased worklist row.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkRow {
    /// The parent.
    pub parent_id: i64,
    /// Position in the worklist (the child's index).
    pub idx: i32,
    /// The packet ref.
    pub payload_ref: String,
    /// The cleanup sidecar (undecodable sidecars come back empty with `sidecar_error` set).
    pub sidecar: Vec<Descriptor>,
    /// Why the sidecar could not be decoded, if it could not.
    pub sidecar_error: Option<String>,
    /// Failed child-creation attempts so far.
    pub attempts: i32,
}

/// The child job to create for one worklist row.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// The parent.
    pub parent_id: i64,
    /// The row (and child) index.
    pub idx: i32,
    /// The pipeline (the parent's).
    pub pipeline: String,
    /// The step the child starts at.
    pub step_index: i32,
    /// The child's input refs.
    pub input_refs: Vec<String>,
    /// Tokens of the claims the child takes over from the parent (the row's sidecar
    /// descriptors owned by the parent). Every one must still be held by the parent (status
    /// `claimed`, same token, `job_id` = parent), or no child is created
    /// ([`ChildOutcome::Discarded`] with [`DiscardCause::ClaimLost`]).
    pub claim_tokens: Vec<String>,
    /// The claims move to the child renewed, `expires_at = now + ` the TTL each was taken with
    /// (its `ttl_ms`), or this one for a claim that has none (taken before migration 0010):
    /// the row may have waited in the worklist for a long time.
    pub claim_ttl: chrono::Duration,
    /// The child's step-action template.
    pub step: StepAction,
    /// When set, [`crate::Store::create_children`] inserts the new child started
    /// (`processing`) and its step action leased to this run, as a claim leaves one (running,
    /// token 1, attempt 1, its `started` log entry), in the same transaction, and reports
    /// [`ChildOutcome::Leased`]: the chunk run that created the child runs its step itself
    /// ([`crate::Pipeline::children_in_chunk`]). A step action in a paused or limited group is
    /// left pending for the runners (`Created`). The one-row path
    /// ([`crate::Store::create_child`]) ignores it.
    pub run_by: Option<RunBy>,
}

/// The chunk run that leases its children's step actions ([`ChildSpec::run_by`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunBy {
    /// The runner's owner id, stamped on the leases (its heartbeat extends them).
    pub owner: String,
    /// Until when the leases hold without a heartbeat.
    pub lease_until: DateTime<Utc>,
}

/// The run that leases the step actions of the children `create` names (spec positions): the
/// first one's [`ChildSpec::run_by`] (a chunk's children share one).
pub(crate) fn run_by_of<'a, T>(specs: &'a [ChildSpec], create: &[(usize, T)]) -> Option<&'a RunBy> {
    create
        .first()
        .and_then(|(at, _)| specs[*at].run_by.as_ref())
}

/// Whether a backend's `create_children` inserts child `c` started, its step action running
/// under `run_by`'s lease: there is such a run and the action's group is not among `held`
/// (the paused and limited groups, whose actions stay pending for the runners).
pub(crate) fn started_by_run(
    c: &ChildSpec,
    run_by: Option<&RunBy>,
    held: &std::collections::HashSet<String>,
) -> bool {
    run_by.is_some() && !c.step.group.as_ref().is_some_and(|g| held.contains(g))
}

/// The tail of a backend's `create_children` once it has leased the new step actions
/// (`leased`, by unique key) and started their children: each created child whose step action
/// was leased becomes [`ChildOutcome::Leased`]. True when one of `actions` is due at `now` and
/// was not leased (runners should be woken).
pub(crate) fn apply_leases<T>(
    specs: &[ChildSpec],
    create: &[(usize, T)],
    ids: &std::collections::HashMap<i32, i64>,
    leased: &std::collections::HashMap<String, crate::store::Lease>,
    outcomes: &mut [Option<ChildOutcome>],
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> bool {
    for (at, _) in create {
        let c = &specs[*at];
        let Some(&child) = ids.get(&c.idx) else {
            continue;
        };
        let key = crate::jobs::step_action_key(child, c.step_index);
        if let Some(&step_action) = leased.get(&key) {
            outcomes[*at] = Some(ChildOutcome::Leased { child, step_action });
        }
    }
    actions.iter().any(|a| {
        a.scheduled_at <= now
            && !a
                .unique_key
                .as_ref()
                .is_some_and(|k| leased.contains_key(k))
    })
}

/// What `create_child` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildOutcome {
    /// A new child.
    Created(i64),
    /// A new child whose step action was leased to the creating run ([`ChildSpec::run_by`]),
    /// and which the same transaction inserted started (`processing`, as `pending` →
    /// `processing` at the creation time would leave it): the step boundary [`crate::Store::start_steps`] would decide for a fresh
    /// child at its first step, decided under the parent's lock that also refused to create
    /// children of a stopped batch, so the creating run runs the step without a start call.
    Leased {
        /// The child.
        child: i64,
        /// Its step action's lease.
        step_action: crate::store::Lease,
    },
    /// The child existed already (a duplicate delivery); adopted.
    Adopted(i64),
    /// No child: in the same transaction the row was discarded and what the parent still held
    /// of its claims released.
    Discarded(DiscardCause),
}

/// Why `create_child` discarded a row instead of creating its child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardCause {
    /// The batch has an outcome (schedule failure or an operator's stop) or the parent is
    /// final: no new child (B3, B5).
    BatchStopped,
    /// A claim of the row is no longer held by the parent (it expired and another owner took
    /// it over, or it was released): the item is not the batch's to process.
    ClaimLost,
}

/// How a leased row that did not become a child is settled.
#[derive(Debug, Clone, PartialEq)]
pub enum RowSettle {
    /// Back to ready (attempts + 1), or discarded with its claims released once
    /// `attempts + 1 >= max_attempts` (B4).
    Retry {
        /// What failed.
        error: String,
        /// The bound.
        max_attempts: i32,
    },
    /// Discarded now, its sidecar claims released (B4 hydration failures).
    Discard {
        /// Why.
        reason: String,
    },
}

/// What `fence_batch` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// Rows are still ready or leased: no fence.
    Outstanding {
        /// Ready rows.
        ready: i64,
        /// Leased rows.
        leased: i64,
    },
    /// The fence is set (now or before).
    Fenced {
        /// Every child is terminal and the finalize action was enqueued in the same transaction.
        finalize_enqueued: bool,
    },
}

/// Why a batch stops scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchAbort {
    /// A chunk could not be enqueued (B3).
    ScheduleFailed,
    /// An operator stopped the batch (B5): the parent finishes with `status` (`cancelled` or
    /// `failed`) and `reason` once no child is active.
    Stop {
        /// `Cancelled` (a cancel) or `Failed` (a manual fail).
        status: JobStatus,
        /// The reason the parent finishes with.
        reason: String,
    },
}

impl BatchAbort {
    /// An operator's cancel (reason `manual`).
    pub fn cancel() -> Self {
        BatchAbort::Stop {
            status: JobStatus::Cancelled,
            reason: crate::jobs::bridge::reason::MANUAL.into(),
        }
    }
}

/// Whether a batch parent's worklist still has rows ready or leased
/// ([`crate::Store::worklist_pending`]): two index probes, however long the worklist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorklistPending {
    /// A row waits for a chunk.
    pub ready: bool,
    /// A chunk run holds a row.
    pub leased: bool,
}

/// What a chunk run reads of its parent before it leases rows ([`crate::Store::batch_head`]):
/// the parent row's batch fields alone, one primary-key read (no worklist counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchHead {
    /// Why it stopped scheduling, if it did: [`outcome::SCHEDULE_FAILED`] or
    /// [`outcome::STOPPED`].
    pub outcome: Option<String>,
    /// Rows per chunk.
    pub chunk_size: i32,
    /// The step children start at.
    pub child_step: i32,
}

/// A batch parent's fields and worklist counts, read from the database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BatchState {
    /// The parent's status.
    pub status: Option<JobStatus>,
    /// Every worklist item became a child or was discarded.
    pub fenced: bool,
    /// Why it stopped scheduling: [`outcome::SCHEDULE_FAILED`] or [`outcome::STOPPED`].
    pub outcome: Option<String>,
    /// An operator's stop: the status the parent finishes with (`None`: not stopped by an
    /// operator, or stopped before migration 0008, which finishes `cancelled`).
    pub stop_status: Option<JobStatus>,
    /// An operator's stop: the reason the parent finishes with (`None`: `manual`).
    pub stop_reason: Option<String>,
    /// Rows per chunk.
    pub chunk_size: i32,
    /// The step children start at.
    pub child_step: i32,
    /// Worklist size.
    pub items_total: i64,
    /// Children created.
    pub children_total: i64,
    /// Children final.
    pub children_terminal: i64,
    /// Children `completed`.
    pub children_completed: i64,
    /// Children `failed` or `cancelled`.
    pub children_failed: i64,
    /// Children `skipped` or `completed_no_items`.
    pub children_skipped: i64,
    /// Rows ready.
    pub ready: i64,
    /// Rows leased.
    pub leased: i64,
    /// Rows that became children.
    pub completed_rows: i64,
    /// Rows discarded.
    pub discarded_rows: i64,
}

impl BatchState {
    /// Children not yet final.
    pub fn active_children(&self) -> i64 {
        self.children_total - self.children_terminal
    }

    /// The parent's final status once fenced, with every child terminal and no row still
    /// leased by an in-flight chunk (B6):
    /// `batch_schedule_failed` wins; an operator's stop gives its status and reason
    /// (`cancelled / manual` by default); any completed child → completed; every child failed
    /// → failed (`all_children_failed`); otherwise completed_no_items. `None` while not due.
    pub fn decision(&self) -> Option<(JobStatus, Option<&str>)> {
        if !self.fenced || self.active_children() > 0 || self.leased > 0 {
            // Leased rows belong to an in-flight chunk, which settles them and then fences.
            return None;
        }
        Some(match self.outcome.as_deref() {
            Some(reason::BATCH_SCHEDULE_FAILED) => {
                (JobStatus::Failed, Some(reason::BATCH_SCHEDULE_FAILED))
            }
            Some(_) => (
                self.stop_status.unwrap_or(JobStatus::Cancelled),
                Some(
                    self.stop_reason
                        .as_deref()
                        .unwrap_or(crate::jobs::bridge::reason::MANUAL),
                ),
            ),
            None if self.children_completed > 0 => (JobStatus::Completed, None),
            None if self.children_total > 0 && self.children_failed == self.children_total => {
                (JobStatus::Failed, Some(reason::ALL_CHILDREN_FAILED))
            }
            None => (JobStatus::CompletedNoItems, None),
        })
    }
}

/// Where a processing job stands (R2, R3).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobLiveness {
    /// The job.
    pub job_id: i64,
    /// Its pipeline.
    pub pipeline: String,
    /// Its status.
    pub status: JobStatus,
    /// Its step.
    pub step_index: i32,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// A pending or running action drives it (step, chunk or finalize).
    pub has_action: bool,
    /// It is a batch parent.
    pub is_batch_parent: bool,
    /// Batch fence set.
    pub fenced: bool,
    /// Children not yet final.
    pub active_children: i64,
    /// A step action of its current step ended `failed`.
    pub step_failed: bool,
}

impl JobLiveness {
    /// No pending/running action and no active child: nothing will move it.
    pub fn stranded(&self) -> bool {
        !self.has_action && self.active_children == 0
    }
}

/// One broken invariant found by `dockhand check` (DESIGN §11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub invariant: &'static str,
    /// What it is about (`job 5`, `action 9`, `claim shared:feed/rss/x`).
    pub subject: String,
    /// What is wrong.
    pub detail: String,
}
