//! Storage: the one [`Store`] trait with every database action the runtime needs, and one
//! module per backend laid out the same way (`enqueue`, `claim`, `finish`, `query`, `schedule`,
//! `maintenance`). No SQL exists outside this module. Every state change that needs several
//! statements is one store method that opens and commits its own transaction.
//!
//! Owner safety: every finishing UPDATE is guarded by action id + fencing token + status
//! `running`; zero rows is reported as [`FinishResult::LeaseLost`], never as success.

use crate::action::{Action, ActionFilter, ActionLog, ActionQuery, PreparedAction};
use crate::batch::{
    BatchAbort, BatchHead, BatchState, ChildOutcome, ChildSpec, FailedChild, FanOutOutcome,
    FenceOutcome, JobLiveness, RowSettle, Violation, WorkItem, WorkRow, WorklistPending,
};
use crate::claims::ledger::TrackedItem;
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimRun, CompleteOutcome, CompletionHandler,
    CompletionRegistry, Descriptor, Identity, ItemClaim,
};
use crate::error::{Error, Result};
use crate::jobs::packets::EncodedPacket;
use crate::jobs::{
    BridgeOutcome, FinishRequest, GroupFinished, Job, JobCreated, JobEvent, JobFilter, NewJob,
    ScheduleGuard, StepAction, StepStart,
};
use crate::limits::{GroupLimit, GroupLimitInfo};
use crate::schedule::{PreparedSchedule, Schedule};
use crate::search::{
    ActionPage, ActionSearch, ActionSummary, ClaimPage, ClaimSearch, GroupPause, GroupStat,
    JobPage, JobSearch, ScopeStat,
};
use crate::state::JobStatus;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::watch;

pub mod chaos;
mod claim_rules;
mod delegate;
pub mod faulty;
mod finish_group;
pub(crate) mod group_commit;
pub mod mysql;
pub mod operator;
pub(crate) mod pool;
pub mod postgres;
mod reach;
mod redact;
mod rerun;
pub mod sqlite;
#[cfg(test)]
pub(crate) mod test_lease;
pub mod timed;
pub mod traced;
mod types;

pub use reach::{probe, DEFAULT_CONNECT_TIMEOUT};
pub use redact::{redact_text, redact_url};

pub use types::{
    Backend, BulkOutcome, Capped, ClaimRequest, ClaimedAction, Enqueued, Finish, FinishAndClaim,
    FinishResult, GroupGauges, JobPrune, Lease, MetricsGauges, PruneCutoffs, QueueStats,
    ReapReport, Routing, ThroughputBucket,
};

/// Every database action the runtime needs. Implemented by [`sqlite::SqliteStore`],
/// [`postgres::PgStore`] and [`mysql::MySqlStore`]; tests wrap it to inject faults. All times come from the caller's clock.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// Applies pending schema migrations.
    async fn migrate(&self) -> Result<()>;

    /// Inserts one action; a unique duplicate returns the existing active action's id.
    async fn enqueue(&self, action: &PreparedAction, now: DateTime<Utc>) -> Result<Enqueued>;

    /// Inserts many actions in one transaction (multi-row statements, chunked), results in
    /// input order.
    async fn enqueue_bulk(
        &self,
        actions: &[PreparedAction],
        now: DateTime<Utc>,
    ) -> Result<Vec<Enqueued>>;

    /// Claims up to `limit` due pending actions in (priority, scheduled_at, id) order, stamping
    /// owner, a new fencing token and the lease expiry, and counting an attempt. Only actions
    /// `req.hooks` and `req.routing` allow (each a filter on the ordered scan).
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedAction>>;

    /// Extends the leases still held by `owner` with these tokens; returns how many were.
    async fn heartbeat(&self, owner: &str, leases: &[Lease], until: DateTime<Utc>) -> Result<u64>;

    /// Finishes a run, guarded by id + token + status running. A `Fail` of a step action
    /// (`dockhand.job.step`) also enqueues its job's finish action
    /// ([`crate::jobs::finish::followup`]) in the same transaction.
    async fn finish(
        &self,
        lease: Lease,
        outcome: &Finish,
        now: DateTime<Utc>,
    ) -> Result<FinishResult>;

    /// Finishes several runs at once (batched acknowledgements), each guarded exactly like
    /// [`Store::finish`]; results in input order. Backends write them in one transaction; the
    /// default finishes them one by one. An error means none of them is known to be written.
    async fn finish_many(
        &self,
        items: &[(Lease, Finish)],
        now: DateTime<Utc>,
    ) -> Result<Vec<FinishResult>> {
        let mut out = Vec::with_capacity(items.len());
        for (lease, outcome) in items {
            out.push(self.finish(*lease, outcome, now).await?);
        }
        Ok(out)
    }

    /// A runner's round: finishes `items` exactly as [`Store::finish_many`] does, then claims
    /// as [`Store::claim`] does, in one round trip where the backend can (one transaction or
    /// statement: the acknowledgements ride with the next claim). An error means none of the
    /// finishes is known to be written; a claim failure after the finishes were written is
    /// reported in [`FinishAndClaim::claimed`]. The default makes the two calls.
    async fn finish_and_claim(
        &self,
        items: &[(Lease, Finish)],
        req: &ClaimRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<FinishAndClaim> {
        let finished = self.finish_many(items, now).await?;
        let claimed = self.claim(req).await;
        Ok(FinishAndClaim { finished, claimed })
    }

    /// Cancels a pending or running action; false if it was neither, or if a job owns it
    /// ([`operator::JOB_OWNED_HOOKS`]: canceling it would strand the job).
    async fn cancel(&self, id: i64, now: DateTime<Utc>) -> Result<bool>;

    /// Puts a failed or canceled action back to pending with its attempts reset.
    async fn retry(&self, id: i64, now: DateTime<Utc>) -> Result<bool>;

    /// Cancels pending actions matching the filter (running ones finish) and disables matching
    /// schedules, so a recurring series stops; returns the number of actions canceled. Actions
    /// a job owns ([`operator::JOB_OWNED_HOOKS`]) are left pending.
    async fn unschedule(&self, filter: &ActionFilter, now: DateTime<Utc>) -> Result<u64>;

    /// The earliest time a matching pending action or enabled schedule will run.
    async fn next_scheduled(&self, filter: &ActionFilter) -> Result<Option<DateTime<Utc>>>;

    /// Lists actions.
    async fn query(&self, query: &ActionQuery) -> Result<Vec<Action>>;

    /// One action by id.
    async fn get(&self, id: i64) -> Result<Option<Action>>;

    /// An action's log, oldest first.
    async fn logs(&self, id: i64) -> Result<Vec<ActionLog>>;

    /// Counts by status and group, past-due count and oldest lag.
    async fn stats(&self, now: DateTime<Utc>) -> Result<QueueStats>;

    /// Creates a schedule, or updates the one with the same name (keeping its `next_run_at`
    /// when the recurrence is unchanged). Returns its id.
    async fn upsert_schedule(&self, s: &PreparedSchedule, now: DateTime<Utc>) -> Result<i64>;

    /// All schedules.
    async fn schedules(&self) -> Result<Vec<Schedule>>;

    /// Enabled schedules whose `next_run_at` is at or before `horizon`.
    async fn due_schedules(&self, horizon: DateTime<Utc>, limit: i64) -> Result<Vec<Schedule>>;

    /// In one transaction: compare-and-swap the schedule's `next_run_at` from `occurrence` to
    /// `next`, and insert the occurrence's action (unique per occurrence). False when another
    /// scheduler already moved it (nothing written).
    async fn materialise(
        &self,
        schedule: &Schedule,
        occurrence: DateTime<Utc>,
        next: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Re-arms fixed-delay schedules whose outstanding occurrence has finished:
    /// `next_run_at = finished_at + every`. Returns how many were re-armed.
    async fn rearm_fixed_delay(&self, now: DateTime<Utc>) -> Result<u64>;

    /// Enables or disables a schedule by id.
    async fn set_schedule_enabled(&self, id: i64, enabled: bool) -> Result<bool>;

    /// Running actions whose lease expired: back to pending, or failed when out of attempts
    /// (a failed step action enqueues its job's finish action in the same transaction, as
    /// [`Store::finish`] does).
    async fn reap_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<ReapReport>;

    /// Deletes one batch of old finished actions and their logs; returns actions deleted.
    async fn prune(&self, cutoffs: &PruneCutoffs) -> Result<u64>;

    /// Q11: deletes one batch (at most `cutoffs.batch`) of final jobs that finished before
    /// their status's cutoff (completed, completed_no_items, skipped and cancelled:
    /// `finished_before`; failed: `failed_before`), with their lifecycle events and worklist
    /// rows, in one transaction. Kept: a job with an undelivered lifecycle event (J5 delivers it
    /// first), and a batch child whose parent is still stored (the parent's counters count it;
    /// once the parent is deleted its children follow in later batches). Item claims and the
    /// tracked-items ledger are not touched: they are the record of what was processed.
    async fn prune_jobs(&self, cutoffs: &PruneCutoffs) -> Result<JobPrune>;

    /// Q11/B8: deletes at most `limit` packets last written before `used_before` that no
    /// stored job (its input refs or worklist packet) and no worklist row references; returns
    /// how many. The reference check and the delete are one statement, so a packet a start or
    /// step writes again (which bumps its time) is never deleted from under it.
    async fn prune_packets(&self, used_before: DateTime<Utc>, limit: i64) -> Result<u64>;

    /// Takes (or renews) the cluster-wide lease of a maintenance task until `until`; false
    /// while another owner holds it.
    async fn try_maintenance_lease(
        &self,
        task: &str,
        owner: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Whether some owner holds the lease of task `task` at `now` (taken and not expired; see
    /// [`Store::try_maintenance_lease`]). A read: it takes nothing.
    async fn maintenance_lease_held(&self, task: &str, now: DateTime<Utc>) -> Result<bool>;

    // ----- jobs (J1–J7) ---------------------------------------------------------------

    /// In one transaction: inserts the job (`pending`) and enqueues its first step action
    /// (`job.step.action(id, 0, now)`). Returns the job id.
    async fn create_job(&self, job: &NewJob, now: DateTime<Utc>) -> Result<i64>;

    /// [`Store::create_job`] for an occurrence of a schedule, in one transaction that locks the
    /// schedule's row: nothing when the schedule is gone ([`JobCreated::ScheduleGone`]), the
    /// holder when the job's idempotency key (one per occurrence) is held
    /// ([`JobCreated::Existing`]), nothing with `no_overlap` while a job the schedule started
    /// is not final ([`JobCreated::Overlapping`]); otherwise the job, recorded as the
    /// schedule's ([`JobCreated::New`]).
    async fn start_scheduled_job(
        &self,
        job: &NewJob,
        guard: ScheduleGuard<'_>,
        now: DateTime<Utc>,
    ) -> Result<JobCreated>;

    /// One job.
    async fn get_job(&self, id: i64) -> Result<Option<Job>>;

    /// Jobs by filter, newest first.
    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>>;

    /// The step boundary, one transaction locking the job row (a batch child's parent in
    /// share mode): [`crate::state::step_gate`] on the job's status and step, whether it has a
    /// batch, and its parent's status and outcome; `pending → processing` on `Start`.
    async fn start_step(&self, job_id: i64, step: i32, now: DateTime<Utc>) -> Result<StepStart>;

    /// [`Store::start_step`] for each `(job, step)` of `reqs`, all in ONE transaction (the
    /// engine's group commit of concurrently started step runs): one decision per request, in
    /// request order, each the one `start_step` would have made had the requests run one
    /// after another in that order. Backends lock the job rows in job-id order, so concurrent
    /// groups cannot deadlock on each other. The default runs `start_step` per request (one
    /// transaction each).
    async fn start_steps(&self, reqs: &[(i64, i32)], now: DateTime<Utc>) -> Result<Vec<StepStart>> {
        let mut out = Vec::with_capacity(reqs.len());
        for &(job, step) in reqs {
            out.push(self.start_step(job, step, now).await?);
        }
        Ok(out)
    }

    /// In one transaction: compare-and-swap `step_index` from `steps.0` to `steps.1` (status
    /// must be `processing`), store `input_refs`, and enqueue `step.action(job, steps.1, now)`.
    /// False (nothing written) when the job moved on or is no longer processing. With
    /// `fence` (the lease of the step run whose output this is), nothing is written unless
    /// that run still holds it: [`crate::Error::LeaseLost`] otherwise, so a stale run never
    /// moves the job on with its output.
    async fn advance_job(
        &self,
        job_id: i64,
        fence: Option<Lease>,
        steps: (i32, i32),
        input_refs: &[String],
        step: &StepAction,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Parks a job: `processing → waiting` at `steps.1` with `input_refs`, guarded by
    /// `steps.0` (the step it must be at). False when it moved on. `fence` as in [`Store::advance_job`].
    async fn park_job(
        &self,
        job_id: i64,
        fence: Option<Lease>,
        steps: (i32, i32),
        input_refs: &[String],
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Resumes a parked job: `waiting → processing` and enqueue the step action for its
    /// `step_index`, in one transaction. False when it was not waiting.
    async fn resume_job(&self, job_id: i64, step: &StepAction, now: DateTime<Utc>) -> Result<bool>;

    /// The terminal bridge's transaction (J4). Locks the job row. If it is final already:
    /// `AlreadyFinal`. Otherwise, for a success status (completed, completed_no_items,
    /// skipped): completes every claim the job owns (status `claimed`, `job_id` = job),
    /// running its completion handler (resolved from `completions` by the config stored on the
    /// claim row) inside this transaction and marking it processed or deleting it per
    /// `retain_processed`; a permanent handler failure (or panic) rolls everything back and
    /// returns `ClaimCompletionFailed`; a transient one re-runs the whole transaction and, if
    /// it persists, is returned as [`Error::TransientCompletion`] (never a final verdict).
    /// For failed/cancelled: deletes every claim the job owns that is still `claimed`. Then
    /// writes status, reason and `finished_at` with a compare-and-swap on the status read,
    /// inserts the lifecycle event into `dockhand_job_events`, and — when the
    /// job is a batch child — bumps the parent's counters (`children_terminal` and one of
    /// `children_completed` (completed) / `children_failed` (failed, cancelled) /
    /// `children_skipped` (skipped, completed_no_items)) and, if the parent is fenced, now has
    /// every child terminal and is not final, enqueues `batch::finalize_action` (in the
    /// parent's pipeline group), all in the same transaction; then commits.
    async fn finish_job(
        &self,
        job_id: i64,
        status: JobStatus,
        reason: Option<&str>,
        completions: &CompletionRegistry,
        now: DateTime<Utc>,
    ) -> Result<BridgeOutcome>;

    /// Several terminal bridge transitions in ONE transaction (the engine's group commit of
    /// concurrently finishing step runs). Per request exactly what [`Store::finish_job`] does
    /// (claims completed or released, the status compare-and-swap, the outbox event), except
    /// that a batch parent's counters are updated once per parent with the summed deltas of
    /// its children in the group, and its finalize action is enqueued once if that makes it
    /// due. A request carrying a [`FinishRequest::lease`] is finished only while that action
    /// is still `running` with that token; otherwise its outcome is
    /// [`BridgeOutcome::LeaseLost`] and nothing is written for it (the others go on).
    ///
    /// If completing a claim fails for any job (permanently, or transiently: no re-run here),
    /// the whole group is rolled back and [`GroupFinished::RolledBack`] names the job; the
    /// caller then finishes each job alone with [`Store::finish_job`] (which re-runs
    /// transient failures and downgrades a permanent one to
    /// `failed / item_claim_completion_failed`). A job that does not exist is an error for
    /// the whole group (nothing written). The default runs `finish_job` per request (one
    /// transaction each) and refuses leased requests (it has no way to guard them).
    async fn finish_jobs(
        &self,
        reqs: &[FinishRequest],
        completions: &CompletionRegistry,
        now: DateTime<Utc>,
    ) -> Result<GroupFinished> {
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            if r.lease.is_some() {
                return Err(Error::invalid(
                    "finish request",
                    format!(
                        "job {}: this store cannot guard a finish by lease",
                        r.job_id
                    ),
                ));
            }
            match self
                .finish_job(r.job_id, r.status, r.reason.as_deref(), completions, now)
                .await?
            {
                BridgeOutcome::ClaimCompletionFailed { error } => {
                    return Ok(GroupFinished::RolledBack {
                        job_id: r.job_id,
                        error,
                    })
                }
                o => out.push(o),
            }
        }
        Ok(GroupFinished::Committed(out))
    }

    /// A job's engine data and its version (E1).
    async fn engine_data(&self, job_id: i64) -> Result<Option<(Value, i64)>>;

    /// Writes engine data only if the version is still `expected_version` (then bumps it).
    /// False on conflict.
    async fn cas_engine_data(
        &self,
        job_id: i64,
        expected_version: i64,
        data: &Value,
    ) -> Result<bool>;

    /// Lifecycle events not yet delivered, oldest first.
    async fn undelivered_events(&self, limit: i64) -> Result<Vec<JobEvent>>;

    /// Marks an event delivered; false if it already was.
    async fn mark_event_delivered(&self, event_id: i64, now: DateTime<Utc>) -> Result<bool>;

    /// Marks events delivered unheard, for a runtime with no lifecycle hook while no runtime
    /// listens ([`crate::jobs::listeners`]): in one statement, and only while no runtime holds
    /// the listeners' lease ([`crate::jobs::listeners::LISTENERS_TASK`]) at `now`, read in
    /// that statement (a runtime's own view of the lease can be a maintenance tick old).
    /// Returns how many were marked (0 when someone listens).
    async fn mark_events_unheard(&self, event_ids: &[i64], now: DateTime<Utc>) -> Result<u64>;

    // ----- packets (E3) -----------------------------------------------------------------

    /// Stores packet bodies under their hashes (insert-if-absent).
    async fn put_packets(&self, packets: &[EncodedPacket], now: DateTime<Utc>) -> Result<()>;

    /// A stored packet body by hash (unverified; see `jobs::packets::verify`).
    async fn packet_body(&self, hash: &str) -> Result<Option<String>>;

    /// The stored bodies of many packets by hash, in one read (one statement on each backend;
    /// MySQL splits a very long list under its placeholder limit): a map from each hash that is
    /// stored to its body (unverified, as [`Store::packet_body`]). A hash with no stored packet
    /// is absent from the map; repeated hashes are read once; an empty list reads nothing.
    /// The chunk action hydrates its rows with it.
    async fn packet_bodies(
        &self,
        hashes: &[&str],
    ) -> Result<std::collections::HashMap<String, String>> {
        let mut found = std::collections::HashMap::with_capacity(hashes.len());
        for &hash in hashes {
            if found.contains_key(hash) {
                continue;
            }
            if let Some(body) = self.packet_body(hash).await? {
                found.insert(hash.to_string(), body);
            }
        }
        Ok(found)
    }

    // ----- item claims (C1–C8) ------------------------------------------------------------

    /// One atomic statement or transaction (C2): absent, deferred, expired (takeover) or —
    /// when `req.reprocess` — processed rows become `claimed` by a new token with
    /// `job_id`/`completion` from the request and `expires_at = now + ttl`; an active claim by
    /// someone else is `HeldByOther`; a claim already held by the requesting job is returned
    /// with its existing token and a renewed expiry; a processed row without `reprocess` is
    /// `AlreadyProcessed`, neither raising nor logging a database error. The identity's parts
    /// are compared in full, not only its hash. A claimed row is expired when
    /// `expires_at <= now` (at `now == expires_at` it may be taken over).
    ///
    /// With `req.job_id`, the same transaction first locks that job's row for share (PostgreSQL
    /// `FOR SHARE`, MariaDB `LOCK IN SHARE MODE`, SQLite under `BEGIN IMMEDIATE`) and refuses
    /// with `JobNotLive` (nothing written) when the job is final, so a claim can never commit
    /// after the terminal bridge settled the job's claims; a job id with no job row is a
    /// free-standing owner and is not checked. With `req.run` it also locks the step action's
    /// row for share and returns [`Error::LeaseLost`] unless the action runs under that token,
    /// and refuses with `JobNotLive` unless the job is `processing` at `run.step`; the row
    /// records the run (`run_step`, `run_action`, `run_token`). Every claim stores its TTL
    /// (`ttl_ms`) for [`Store::renew_claims`].
    async fn claim_item(&self, req: &ClaimItemRequest, now: DateTime<Utc>) -> Result<ClaimOutcome>;

    /// [`Store::claim_item`] for many requests in one transaction: each request gets, in
    /// order, the outcome `claim_item` would give it had the requests been made one after
    /// another (a repeated identity sees the claim an earlier request of the call took: the
    /// same job gets it again with the same token, another owner `HeldByOther`). Each distinct
    /// step run is fenced and each distinct job row locked for share and checked once, before
    /// any claim row, as `claim_item` does; a lost lease fails the whole call with
    /// [`Error::LeaseLost`] and writes nothing, and any error means nothing was written.
    /// Backends override it set-based; the default calls `claim_item` per request (separate
    /// transactions: an error may follow the claims of the requests before it).
    async fn claim_items(
        &self,
        reqs: &[ClaimItemRequest],
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimOutcome>> {
        let mut out = Vec::with_capacity(reqs.len());
        for req in reqs {
            out.push(self.claim_item(req, now).await?);
        }
        Ok(out)
    }

    /// The stored row for an identity.
    async fn get_claim(&self, identity: &Identity) -> Result<Option<ItemClaim>>;

    /// In one transaction (C4): lock the row where the hash/parts match, the token matches and
    /// the status is `claimed` (none: `Lost`, nothing runs); run `handler` on this transaction;
    /// mark processed (or delete when `retain_processed` is false); commit. A handler error
    /// rolls back its writes and the transition together and is returned as an error: a
    /// permanent one (or a panic, caught) as [`Error::InvalidInput`] naming the item; a
    /// transient one re-runs the whole transaction a bounded number of times and, if it
    /// persists, is returned as [`Error::TransientCompletion`]. An expired claim nobody took
    /// over may still be completed by its token.
    async fn complete_claim(
        &self,
        descriptor: &Descriptor,
        handler: Option<Arc<dyn CompletionHandler>>,
        now: DateTime<Utc>,
    ) -> Result<CompleteOutcome>;

    /// Deletes the claim (or marks it `deferred`) only while the token still holds it (C5).
    async fn release_claim(
        &self,
        descriptor: &Descriptor,
        defer: bool,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Claims by filter.
    async fn list_claims(&self, filter: &ClaimFilter) -> Result<Vec<ItemClaim>>;

    /// Renews the claims of live jobs, one bounded set-based statement (or transaction): up to
    /// `limit` rows `claimed` by a job whose row exists and is not final (pending, processing,
    /// waiting), that have used at least half their TTL (`expires_at - ttl_ms / 2 <= now`,
    /// expired ones included: nobody took them over), soonest expiry first, get
    /// `expires_at = now + ttl_ms`. Claims of final jobs, of job ids with no row, free-standing
    /// claims and rows without a stored TTL are left to expire. Rows locked by a concurrent
    /// completion or takeover are skipped (the next pass sees them). Returns how many rows
    /// were renewed; maintenance calls it until fewer than `limit` come back.
    async fn renew_claims(&self, now: DateTime<Utc>, limit: i64) -> Result<u64>;

    /// Before a step run's output is written: releases (deletes) the claims that earlier runs
    /// of the same step of `job_id` took (`run_step = run.step` and a run other than
    /// `run.lease`), are still `claimed` by the job, and whose token is not in `keep_tokens`
    /// (the descriptors the output carries). Fenced like [`Store::lease_work`]: when any row is
    /// to be released, one transaction locks the step action's row for share, returns
    /// [`Error::LeaseLost`] (nothing changes) unless it runs under `run.lease`, then deletes
    /// them; when there is none, a read checks the lease alone. Returns how many were released.
    async fn release_superseded_claims(
        &self,
        job_id: i64,
        run: ClaimRun,
        keep_tokens: &[String],
    ) -> Result<u64>;

    /// A tracked-items ledger row (C8).
    async fn tracked_item(&self, namespace: &str, item_id: &str) -> Result<Option<TrackedItem>>;

    // ----- batches (B1–B8) and recovery (R2, R3, §11) -----------------------------------

    /// Fan-out (B1), one transaction: lock the parent; if it has no batch yet, write the
    /// worklist (one `ready` row per item, idx 0..n, with its sidecar), and the parent's batch
    /// fields (`batch_state = 'scheduling'`, contract, `layout` = (chunk size, child step),
    /// items_total) →
    /// `Created`. The same contract again → `Adopted` (nothing written); another → `Rejected`.
    /// Does not enqueue the first chunk (see `schedule_chunk`). `fence` as in
    /// [`Store::advance_job`] (the lease of the step run that fans out).
    async fn fan_out(
        &self,
        parent: i64,
        fence: Option<Lease>,
        items: &[WorkItem],
        layout: (i32, i32),
        contract: &str,
        now: DateTime<Utc>,
    ) -> Result<FanOutOutcome>;

    /// Enqueues `batch::chunk_action` in the parent's pipeline group (unique per parent and
    /// offset; a duplicate is not an error).
    async fn schedule_chunk(
        &self,
        parent: i64,
        offset: i64,
        priority: i32,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// Leases up to `limit` rows of the parent that are `ready`, or `leased` with an expired
    /// lease or by this same chunk action (a re-delivery takes its predecessor's rows back), in
    /// idx order: state `leased`, owner [`crate::batch::chunk_owner`]`(chunk.id)`,
    /// `lease_until`. Fenced by the chunk action's lease: unless action `chunk.id` is `running`
    /// with `lease_token = chunk.token`, nothing is leased and the result is
    /// [`Error::LeaseLost`] (a stale attempt must not take rows).
    async fn lease_work(
        &self,
        parent: i64,
        limit: i64,
        chunk: Lease,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkRow>>;

    /// One transaction (B2), fenced by the chunk run's lease like [`Store::lease_work`].
    /// Locks the parent. (parent, idx) has a child: `Adopted`, only the row marked completed.
    /// The parent final or its batch stopped (an outcome), or a claim of `claim_tokens` no
    /// longer the parent's (token, `job_id`, `claimed`; locked): the row is discarded as by
    /// [`Store::settle_work`] → `Discarded`. Else: insert the child (`pending`, `parent_id`,
    /// `child_index`, `step_index`, `input_refs`), hand it the claims with `expires_at = now +
    /// claim_ttl`, mark the row `completed`, bump `children_total`, enqueue its step action.
    async fn create_child(
        &self,
        child: &ChildSpec,
        chunk: Lease,
        now: DateTime<Utc>,
    ) -> Result<ChildOutcome>;

    /// [`Store::create_child`] for several rows of one parent (a chunk), set-based where the
    /// backend can: every row gets the outcome `create_child` would give it, in order, under
    /// the same fence. An error means no row was changed, or (the default, one `create_child`
    /// per row) that the rows before the failing one were: the caller then goes on row by row
    /// with `create_child`, which adopts the children already created.
    async fn create_children(
        &self,
        children: &[ChildSpec],
        chunk: Lease,
        now: DateTime<Utc>,
    ) -> Result<Vec<ChildOutcome>> {
        let mut out = Vec::with_capacity(children.len());
        for c in children {
            out.push(self.create_child(c, chunk, now).await?);
        }
        Ok(out)
    }

    /// Settles a leased row that did not become a child (B4): back to `ready` with attempts+1,
    /// or `discarded` (error kept) with its sidecar claims released (deleted where token in
    /// the sidecar, `job_id = parent`, status `claimed`), in one transaction. A malformed
    /// sidecar (not a JSON array of descriptors) names no token: its claims are released by
    /// job id instead — every claim the parent still holds that the sidecar of no other
    /// `ready`/`leased` row names (the discarded item's claims, and any the parent's step took
    /// without handing them to an item). Fenced like
    /// [`Store::lease_work`]: a chunk action that lost its lease gets
    /// [`Error::LeaseLost`] and changes nothing.
    async fn settle_work(
        &self,
        parent: i64,
        idx: i32,
        chunk: Lease,
        settle: &RowSettle,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// One transaction (B2, B6): lock the parent; rows still ready/leased → `Outstanding`;
    /// else set `batch_state = 'fenced'` and, if `children_terminal = children_total`,
    /// enqueue `batch::finalize_action` → `Fenced { finalize_enqueued }`.
    async fn fence_batch(&self, parent: i64, now: DateTime<Utc>) -> Result<FenceOutcome>;

    /// Stops scheduling (B3, B5), one transaction: lock the parent; discard every `ready` row
    /// as [`Store::settle_work`] does; set `batch_outcome` (`batch_schedule_failed`, or
    /// `cancel_requested` with `batch_stop_status`/`_reason`; the first is kept) and the fence;
    /// if that leaves the parent due and not final, enqueue its finalize action (B7: the path
    /// to final commits with the mark). Returns the state after.
    async fn abort_batch(
        &self,
        parent: i64,
        why: BatchAbort,
        now: DateTime<Utc>,
    ) -> Result<BatchState>;

    /// The parent's batch fields and worklist counts; `None` when the job does not exist or is
    /// not a batch parent.
    async fn batch_state(&self, parent: i64) -> Result<Option<BatchState>>;

    /// Whether the parent's worklist still has a ready row and a leased row, without
    /// [`Store::batch_state`]'s counts of every row (what a chunk run reads to decide what
    /// follows it; counting made each chunk O(items)). `None` when the job does not exist or is
    /// not a batch parent.
    async fn worklist_pending(&self, parent: i64) -> Result<Option<WorklistPending>>;

    /// The parent's batch fields a chunk run starts from (outcome, chunk size, child step),
    /// without [`Store::batch_state`]'s counts of every worklist row (one read of the parent
    /// row: reading `batch_state` at each chunk's start made every chunk O(items)). `None`
    /// when the job does not exist or is not a batch parent.
    async fn batch_head(&self, parent: i64) -> Result<Option<BatchHead>>;

    /// Deletes the worklist of a parent (B8); an error while the parent is not final.
    async fn cleanup_worklist(&self, parent: i64) -> Result<u64>;

    /// In one transaction: [`Store::create_job`] and the re-run mark on `parent`: its engine
    /// data becomes `parent_data` with `dockhand_rerun_by` = the new job's id, compare-and-swap
    /// on `parent_version`. `None` (nothing written, no job) when the version moved: another
    /// request re-ran it first.
    async fn create_rerun_job(
        &self,
        job: &NewJob,
        parent: i64,
        parent_version: i64,
        parent_data: &Value,
        now: DateTime<Utc>,
    ) -> Result<Option<i64>>;

    /// The children of `parent` in status `failed` with id above `after_id`, in id order, at
    /// most `limit`, each with its stored sidecar (read-only; for `Jobs::rerun_failed`).
    async fn failed_children(
        &self,
        parent: i64,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<FailedChild>>;

    /// Jobs in `pending`/`processing` last changed before `older_than`, with what drives them
    /// (R2, R3): an active step/chunk/finalize action (by unique key `j:{id}:…`, `b:{id}:…`,
    /// `f:{id}`), active children, fence, and whether the current step's action failed.
    async fn job_liveness(&self, older_than: DateTime<Utc>, limit: i64)
        -> Result<Vec<JobLiveness>>;

    /// Audits the invariants of DESIGN §11 and returns every violation: a claim held by a
    /// final job; a processing job with no action and no active child; a fenced parent with
    /// all children terminal that is neither final nor has a pending action; a running action
    /// whose lease expired before `now - grace`; parent counters that differ from the counts
    /// of its children.
    async fn audit(&self, now: DateTime<Utc>, grace: chrono::Duration) -> Result<Vec<Violation>>;

    /// The database server's current time, to milliseconds (SQLite: the clock of the host
    /// the file lives on). [`crate::DatabaseClock`] corrects a runtime's clock by it, so every
    /// process sharing one database compares leases on one clock.
    async fn database_now(&self) -> Result<DateTime<Utc>>;

    // ---- Operator views and bulk changes (the dashboard, issue 8) ----

    /// One keyset page of actions (never OFFSET): the search is validated first, each sort
    /// walks its own index, args and errors come back cut to [`crate::search::HEAD_CHARS`].
    async fn search_actions(&self, search: &ActionSearch) -> Result<ActionPage>;

    /// How many actions match the search's filters (cursors and limit ignored), stopping at
    /// `cap`.
    async fn count_actions(&self, search: &ActionSearch, cap: i64) -> Result<Capped>;

    /// Actions that ended complete or failed per `bucket` in `[since, until)`, every bucket
    /// present (zeros included), oldest first; buckets start at multiples of `bucket` since
    /// the Unix epoch.
    async fn throughput(
        &self,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        bucket: chrono::Duration,
    ) -> Result<Vec<ThroughputBucket>>;

    /// The gauges Prometheus exports, in one query: per group, pending, due (at `now`),
    /// running and failed actions and the oldest due time; processing jobs, open batches and
    /// held item claims. Counts are exact (not capped): [`crate::prometheus::spawn_gauges`]
    /// calls it every few seconds, not per page view.
    async fn metrics_gauges(&self, now: DateTime<Utc>) -> Result<MetricsGauges>;

    /// The last `limit` log entries of an action, oldest first (a snoozing action can have
    /// 10^5 of them; [`Store::logs`] reads all).
    async fn logs_tail(&self, id: i64, limit: i64) -> Result<Vec<ActionLog>>;

    /// The highest schema migration applied (0 on an empty database).
    async fn schema_version(&self) -> Result<i64>;

    /// Cancels the pending or running actions among `ids` (at most
    /// [`crate::search::MAX_PAGE`]) in one transaction, logging `canceled` with `actor`;
    /// actions a job owns ([`operator::JOB_OWNED_HOOKS`]) are skipped.
    async fn cancel_many(
        &self,
        ids: &[i64],
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<BulkOutcome>;

    /// Puts the failed or canceled actions among `ids` back to pending, due `now`, with their
    /// attempts reset (one transaction); one whose unique key another active action holds is
    /// skipped.
    async fn retry_many(&self, ids: &[i64], actor: &str, now: DateTime<Utc>)
        -> Result<BulkOutcome>;

    /// Makes the pending actions among `ids` that are due later due `now` (RunNow), logging
    /// `run_now` with `actor`, and wakes the runners.
    async fn run_now(&self, ids: &[i64], actor: &str, now: DateTime<Utc>) -> Result<BulkOutcome>;

    /// Deletes the actions among `ids` that are not running, with their logs (one
    /// transaction); running ones are skipped (cancel them first), and so are pending ones a
    /// job owns ([`operator::JOB_OWNED_HOOKS`]).
    async fn delete_actions(&self, ids: &[i64]) -> Result<BulkOutcome>;

    /// Per action group (and the actions without one, `None`, first): capped pending, due and
    /// running counts and the oldest due time, for at most `max_groups` groups in name order.
    /// Groups are found by skipping through the group index, never by scanning actions.
    async fn group_overview(
        &self,
        now: DateTime<Utc>,
        cap: i64,
        max_groups: i64,
    ) -> Result<Vec<GroupStat>>;

    /// Pauses (`paused`) or resumes an action group, one statement: claims skip the pending
    /// actions of a paused group; running ones finish. True when the state changed.
    async fn set_group_paused(
        &self,
        group: &str,
        paused: bool,
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// The paused groups, by name.
    async fn paused_groups(&self) -> Result<Vec<GroupPause>>;

    /// Sets (replaces) the limits of an action group, one statement, after checking them
    /// ([`GroupLimit::validate`]); the group's record of recent starts is kept, so a changed
    /// rate still counts the starts already made. Claims enforce the limits from their next
    /// transaction on (see [`crate::limits`]). True when the group had no limits before.
    async fn set_group_limit(
        &self,
        group: &str,
        limit: &GroupLimit,
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Removes the limits of an action group, one statement, and wakes the runners: its
    /// waiting actions are claimable at once. True when it had limits.
    async fn clear_group_limit(&self, group: &str) -> Result<bool>;

    /// The limited groups by name, with their running actions and the starts in the rate
    /// window ending at `now`.
    async fn group_limits(&self, now: DateTime<Utc>) -> Result<Vec<GroupLimitInfo>>;

    /// One page of jobs, newest first (keyset on id).
    async fn search_jobs(&self, search: &JobSearch) -> Result<JobPage>;

    /// The actions that drive a job, newest first: its step actions (`j:{id}:…`) and, for a
    /// batch parent, its chunk (`b:{id}:…`) and finalize (`f:{id}`) actions.
    async fn job_actions(&self, job_id: i64, limit: i64) -> Result<Vec<ActionSummary>>;

    /// One page of item claims, newest first (keyset on id).
    async fn search_claims(&self, search: &ClaimSearch) -> Result<ClaimPage>;

    /// Per claim scope: capped counts per status and of stale claims (held, expired before
    /// `now`), for at most `max_scopes` scopes in name order.
    async fn claim_scopes(
        &self,
        now: DateTime<Utc>,
        cap: i64,
        max_scopes: i64,
    ) -> Result<Vec<ScopeStat>>;

    /// A receiver that changes whenever an action is enqueued in this process (and, on
    /// PostgreSQL once [`Store::listen`] runs, in any process).
    fn wakeups(&self) -> watch::Receiver<u64>;

    /// Starts forwarding cross-process enqueue notifications into [`Store::wakeups`] (PostgreSQL
    /// LISTEN); a no-op where the backend has none.
    async fn listen(&self) -> Result<()>;

    /// Closes the connection pool.
    async fn close(&self);
}

/// A shared, dynamically chosen store.
pub type DynStore = Arc<dyn Store>;

/// The URL schemes [`connect`] accepts, for messages.
pub const SUPPORTED_SCHEMES: &str =
    "sqlite:PATH, sqlite::memory:, postgres://, postgresql://, mysql:// or mariadb://";

/// Opens the store a URL names: `sqlite:…` (file or `sqlite::memory:`), `postgres://…` /
/// `postgresql://…`, or `mysql://…` / `mariadb://…` (MySQL 8 or MariaDB 10.6+). Does not
/// migrate. A server that refuses the connection, a host that does not resolve or no answer
/// within [`DEFAULT_CONNECT_TIMEOUT`] fail at once with [`Error::Connect`] (see
/// [`connect_timeout`]).
pub async fn connect(url: &str) -> Result<DynStore> {
    connect_timeout(url, DEFAULT_CONNECT_TIMEOUT).await
}

/// [`connect`] with an explicit bound on the first connection attempt ([`probe`]).
pub async fn connect_timeout(url: &str, timeout: std::time::Duration) -> Result<DynStore> {
    probe(url, timeout).await?;
    if url.starts_with("sqlite:") {
        Ok(traced::Traced::wrap(Arc::new(
            sqlite::SqliteStore::connect(url).await?,
        )))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(traced::Traced::wrap(Arc::new(
            postgres::PgStore::connect(url).await?,
        )))
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        Ok(traced::Traced::wrap(Arc::new(
            mysql::MySqlStore::connect(url).await?,
        )))
    } else {
        Err(Error::invalid(
            "database_url",
            format!(
                "unsupported scheme in `{}`; use {SUPPORTED_SCHEMES}",
                redact_url(url)
            ),
        ))
    }
}

/// The shared in-process wake-up signal each store owns.
#[derive(Debug)]
pub(crate) struct Wakeup {
    tx: watch::Sender<u64>,
}

impl Wakeup {
    pub(crate) fn new() -> Self {
        Self {
            tx: watch::channel(0).0,
        }
    }
    pub(crate) fn notify(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

/// Maps a unique-index violation during an operator retry to a clear input error.
pub(crate) fn unique_violation_as(e: sqlx::Error, op: &'static str, id: i64) -> Error {
    if let sqlx::Error::Database(db) = &e {
        if db.is_unique_violation() {
            return Error::invalid(
                "id",
                format!("action {id}: another pending or running action holds its unique key"),
            );
        }
    }
    Error::Database { op, source: e }
}
