//! The SQLite backend: the embedded default.
//!
//! Layout (the same in every backend): `connect` opens the database and holds the inherent API
//! (pool accessor, transactional enqueue, the `BEGIN IMMEDIATE` helper, time conversion);
//! `mod.rs` defines [`SqliteStore`] and implements [`Store`] by delegating to `enqueue`,
//! `claim`, `finish`, `query`, `schedule` and `maintenance` (actions), `jobs` (jobs, engine
//! data, events, packets), `bridge` (the terminal bridge's transaction), `claims` (item
//! claims), `claim_upkeep` (renewing claims of live jobs, releasing claims of superseded step
//! runs, the step-run fence), `ledger` (the tracked-items handler's rows), `batch` (fan-out, the worklist and
//! child creation), `fence` (fence, aborts, batch state and the children's counters) and
//! `recovery` (job liveness and the invariant audit).
//!
//! SQLite has one writer at a time. This store keeps one write connection outside any pool
//! (`writer`: writers queue fairly for it instead of spinning in SQLite's busy handler, and no
//! pool pings it between writes) and a reader pool; every write transaction starts with
//! `BEGIN IMMEDIATE`, so a read-then-write never fails to upgrade. The hottest writes (single
//! and grouped enqueues, claims, completions and a runner's round of both; `hot`) run on a
//! second connection lent with the same slot, rusqlite's, inline or on a thread of its own
//! (`direct`): sqlx sends every statement to its connection's worker thread and back.
//! Files are opened in WAL mode with `synchronous = NORMAL` (durable across a process crash) and a
//! busy timeout for other processes; the pragmas are read back and startup fails if they did not
//! take. Times are stored as integer milliseconds since the epoch.

mod args_match;
mod batch;
#[cfg(test)]
mod batch_tests;
mod bridge;
#[cfg(test)]
mod cancel_tests;
mod children;
mod claim;
mod claim_many;
mod claim_upkeep;
mod claims;
mod connect;
mod direct;
#[cfg(test)]
mod direct_tests;
mod enqueue;
mod events;
mod fence;
#[cfg(test)]
mod fence_tests;
mod finish;
mod finish_set;
mod gauges;
mod grouped;
mod hot;
mod jobs;
mod lease_fence;
pub mod ledger;
mod limits;
mod maintenance;
mod one_row;
mod packets;
#[cfg(test)]
mod plan_tests;
mod query;
mod recovery;
#[cfg(test)]
mod recovery_tests;
mod retention;
mod round;
mod schedule;
#[cfg(test)]
mod tests;
mod ui;
mod views;
mod writer;

pub(crate) use connect::{from_ms, ms};

use super::group_commit::GroupCommit;
use super::{
    Backend, BulkOutcome, Capped, ClaimRequest, ClaimedAction, Enqueued, Finish, FinishAndClaim,
    FinishResult, JobPrune, Lease, PruneCutoffs, QueueStats, ReapReport, Store, ThroughputBucket,
    Wakeup,
};
use crate::action::{Action, ActionFilter, ActionLog, ActionQuery, PreparedAction};
use crate::batch::{
    BatchAbort, BatchState, ChildOutcome, ChildSpec, FailedChild, FanOutOutcome, FenceOutcome,
    JobLiveness, RowSettle, Violation, WorkItem, WorkRow, WorklistPending,
};
use crate::claims::ledger::TrackedItem;
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimRun, CompleteOutcome, CompletionHandler,
    CompletionRegistry, Descriptor, Identity, ItemClaim,
};
use crate::error::Result;
use crate::jobs::packets::EncodedPacket;
use crate::jobs::{
    BridgeOutcome, Job, JobCreated, JobEvent, JobFilter, NewJob, ScheduleGuard, StepAction,
};
use crate::schedule::{PreparedSchedule, Schedule};
use crate::search::{
    ActionPage, ActionSearch, ActionSummary, ClaimPage, ClaimSearch, GroupStat, JobPage, JobSearch,
    ScopeStat,
};
use crate::state::JobStatus;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::SqlitePool;
use std::sync::Arc;
use tokio::sync::watch;

/// A [`Store`] on SQLite.
#[derive(Debug)]
pub struct SqliteStore {
    /// The one write connection (see `writer`).
    writer: writer::Writer,
    /// Migrations and callers' own transactions.
    pool: SqlitePool,
    reader: SqlitePool,
    wake: Wakeup,
    /// Single enqueues waiting to share a commit.
    enqueues: GroupCommit<(PreparedAction, DateTime<Utc>), Enqueued>,
    /// Whether the last claim saw group limits: claims then take the limited path
    /// ([`limits`]); the ordinary claim statement leaves limited groups out and says whether
    /// any exist, so this is only ever late by one claim, and never unsafe.
    limits_seen: std::sync::atomic::AtomicBool,
    /// Whether the last claim took fewer actions than it asked for: the runner's hot path
    /// then runs inline, else on the enqueue connection's thread (see `hot::write`).
    queue_shallow: std::sync::atomic::AtomicBool,
    /// The background WAL checkpointer (file databases).
    _checkpointer: Option<connect::Checkpointer>,
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn migrate(&self) -> Result<()> {
        connect::MIGRATOR.run(&self.pool).await?;
        enqueue::warm_bulk_statements(self).await;
        Ok(())
    }

    async fn enqueue(&self, action: &PreparedAction, now: DateTime<Utc>) -> Result<Enqueued> {
        let r = enqueue::enqueue(self, action, now).await?;
        if action.scheduled_at <= now {
            self.wake.notify();
        }
        Ok(r)
    }

    async fn enqueue_bulk(
        &self,
        actions: &[PreparedAction],
        now: DateTime<Utc>,
    ) -> Result<Vec<Enqueued>> {
        let r = enqueue::enqueue_bulk(self, actions, now).await?;
        if actions.iter().any(|a| a.scheduled_at <= now) {
            self.wake.notify();
        }
        Ok(r)
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedAction>> {
        claim::claim(self, req).await
    }

    async fn heartbeat(&self, owner: &str, leases: &[Lease], until: DateTime<Utc>) -> Result<u64> {
        claim::heartbeat(self, owner, leases, until).await
    }

    async fn finish(
        &self,
        lease: Lease,
        outcome: &Finish,
        now: DateTime<Utc>,
    ) -> Result<FinishResult> {
        let r = finish::finish(self, lease, outcome, now).await?;
        if matches!(outcome, Finish::Release) {
            self.wake.notify();
        }
        Ok(r)
    }

    async fn finish_many(
        &self,
        items: &[(Lease, Finish)],
        now: DateTime<Utc>,
    ) -> Result<Vec<FinishResult>> {
        let r = finish::finish_many(self, items, now).await?;
        if items.iter().any(|(_, o)| matches!(o, Finish::Release)) {
            self.wake.notify();
        }
        Ok(r)
    }

    async fn finish_and_claim(
        &self,
        items: &[(Lease, Finish)],
        req: &ClaimRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<FinishAndClaim> {
        // Only completions take the combined path; other outcomes go through `finish_many`,
        // which wakes runners for releases and failed step actions.
        round::finish_and_claim(self, items, req, now).await
    }

    async fn cancel(&self, id: i64, now: DateTime<Utc>) -> Result<bool> {
        finish::cancel(self, id, now).await
    }

    async fn retry(&self, id: i64, now: DateTime<Utc>) -> Result<bool> {
        let r = finish::retry(self, id, now).await?;
        self.wake.notify();
        Ok(r)
    }

    async fn unschedule(&self, filter: &ActionFilter, now: DateTime<Utc>) -> Result<u64> {
        query::unschedule(self, filter, now).await
    }

    async fn next_scheduled(&self, filter: &ActionFilter) -> Result<Option<DateTime<Utc>>> {
        query::next_scheduled(self, filter).await
    }

    async fn query(&self, q: &ActionQuery) -> Result<Vec<Action>> {
        query::query(self, q).await
    }

    async fn get(&self, id: i64) -> Result<Option<Action>> {
        query::get(self, id).await
    }

    async fn logs(&self, id: i64) -> Result<Vec<ActionLog>> {
        query::logs(self, id).await
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<QueueStats> {
        query::stats(self, now).await
    }

    async fn upsert_schedule(&self, s: &PreparedSchedule, now: DateTime<Utc>) -> Result<i64> {
        schedule::upsert(self, s, now).await
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        schedule::list(self, None, i64::MAX).await
    }

    async fn due_schedules(&self, horizon: DateTime<Utc>, limit: i64) -> Result<Vec<Schedule>> {
        schedule::list(self, Some(horizon), limit).await
    }

    async fn materialise(
        &self,
        s: &Schedule,
        occurrence: DateTime<Utc>,
        next: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let done = schedule::materialise(self, s, occurrence, next, now).await?;
        if done && occurrence <= now {
            self.wake.notify();
        }
        Ok(done)
    }

    async fn rearm_fixed_delay(&self, now: DateTime<Utc>) -> Result<u64> {
        schedule::rearm_fixed_delay(self, now).await
    }

    async fn set_schedule_enabled(&self, id: i64, enabled: bool) -> Result<bool> {
        schedule::set_enabled(self, id, enabled).await
    }

    async fn reap_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<ReapReport> {
        let r = maintenance::reap_expired(self, now, limit).await?;
        if r.requeued > 0 {
            self.wake.notify();
        }
        Ok(r)
    }

    async fn prune(&self, cutoffs: &PruneCutoffs) -> Result<u64> {
        maintenance::prune(self, cutoffs).await
    }

    async fn prune_jobs(&self, cutoffs: &PruneCutoffs) -> Result<JobPrune> {
        retention::prune_jobs(self, cutoffs).await
    }

    async fn prune_packets(&self, used_before: DateTime<Utc>, limit: i64) -> Result<u64> {
        retention::prune_packets(self, used_before, limit).await
    }

    async fn try_maintenance_lease(
        &self,
        task: &str,
        owner: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        maintenance::try_lease(self, task, owner, until, now).await
    }

    async fn maintenance_lease_held(&self, task: &str, now: DateTime<Utc>) -> Result<bool> {
        maintenance::lease_held(self, task, now).await
    }

    async fn create_job(&self, job: &NewJob, now: DateTime<Utc>) -> Result<i64> {
        jobs::create_job(self, job, now).await
    }

    async fn start_scheduled_job(
        &self,
        job: &NewJob,
        guard: ScheduleGuard<'_>,
        now: DateTime<Utc>,
    ) -> Result<JobCreated> {
        jobs::start_scheduled_job(self, job, guard, now).await
    }

    async fn get_job(&self, id: i64) -> Result<Option<Job>> {
        jobs::get_job(self, id).await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        jobs::list_jobs(self, filter).await
    }

    async fn start_step(
        &self,
        job_id: i64,
        step: i32,
        now: DateTime<Utc>,
    ) -> Result<crate::jobs::StepStart> {
        jobs::start_step(self, job_id, step, now).await
    }

    async fn start_steps(
        &self,
        reqs: &[(i64, i32)],
        now: DateTime<Utc>,
    ) -> Result<Vec<crate::jobs::StepStart>> {
        grouped::start_steps(self, reqs, now).await
    }

    async fn advance_job(
        &self,
        job_id: i64,
        fence: Option<Lease>,
        steps: (i32, i32),
        input_refs: &[String],
        step: &StepAction,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        jobs::advance_job(self, job_id, fence, steps, input_refs, step, now).await
    }

    async fn park_job(
        &self,
        job_id: i64,
        fence: Option<Lease>,
        steps: (i32, i32),
        input_refs: &[String],
        now: DateTime<Utc>,
    ) -> Result<bool> {
        jobs::park_job(self, job_id, fence, steps, input_refs, now).await
    }

    async fn resume_job(&self, job_id: i64, step: &StepAction, now: DateTime<Utc>) -> Result<bool> {
        jobs::resume_job(self, job_id, step, now).await
    }

    async fn finish_job(
        &self,
        job_id: i64,
        status: JobStatus,
        reason: Option<&str>,
        completions: &CompletionRegistry,
        now: DateTime<Utc>,
    ) -> Result<BridgeOutcome> {
        bridge::finish_job(self, job_id, status, reason, completions, now).await
    }

    async fn finish_jobs(
        &self,
        reqs: &[crate::jobs::FinishRequest],
        completions: &CompletionRegistry,
        now: DateTime<Utc>,
    ) -> Result<crate::jobs::GroupFinished> {
        grouped::finish_jobs(self, reqs, completions, now).await
    }

    async fn engine_data(&self, job_id: i64) -> Result<Option<(Value, i64)>> {
        jobs::engine_data(self, job_id).await
    }

    async fn cas_engine_data(
        &self,
        job_id: i64,
        expected_version: i64,
        data: &Value,
    ) -> Result<bool> {
        jobs::cas_engine_data(self, job_id, expected_version, data).await
    }

    async fn undelivered_events(&self, limit: i64) -> Result<Vec<JobEvent>> {
        events::undelivered_events(self, limit).await
    }

    async fn mark_event_delivered(&self, event_id: i64, now: DateTime<Utc>) -> Result<bool> {
        events::mark_event_delivered(self, event_id, now).await
    }

    async fn mark_events_unheard(&self, event_ids: &[i64], now: DateTime<Utc>) -> Result<u64> {
        events::mark_events_unheard(self, event_ids, now).await
    }

    async fn put_packets(&self, packets: &[EncodedPacket], now: DateTime<Utc>) -> Result<()> {
        packets::put_packets(self, packets, now).await
    }

    async fn packet_body(&self, hash: &str) -> Result<Option<String>> {
        packets::packet_body(self, hash).await
    }
    async fn packet_bodies(
        &self,
        hashes: &[&str],
    ) -> Result<std::collections::HashMap<String, String>> {
        packets::packet_bodies(self, hashes).await
    }

    async fn claim_item(&self, req: &ClaimItemRequest, now: DateTime<Utc>) -> Result<ClaimOutcome> {
        claims::claim_item(self, req, now).await
    }
    async fn claim_items(
        &self,
        reqs: &[ClaimItemRequest],
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimOutcome>> {
        claim_many::claim_items(self, reqs, now).await
    }

    async fn get_claim(&self, identity: &Identity) -> Result<Option<ItemClaim>> {
        claims::get_claim(self, identity).await
    }

    async fn complete_claim(
        &self,
        descriptor: &Descriptor,
        handler: Option<Arc<dyn CompletionHandler>>,
        now: DateTime<Utc>,
    ) -> Result<CompleteOutcome> {
        claims::complete_claim(self, descriptor, handler, now).await
    }

    async fn release_claim(
        &self,
        descriptor: &Descriptor,
        defer: bool,
        _now: DateTime<Utc>,
    ) -> Result<bool> {
        claims::release_claim(self, descriptor, defer).await
    }

    async fn list_claims(&self, filter: &ClaimFilter) -> Result<Vec<ItemClaim>> {
        claims::list_claims(self, filter).await
    }

    async fn tracked_item(&self, namespace: &str, item_id: &str) -> Result<Option<TrackedItem>> {
        claims::tracked_item(self, namespace, item_id).await
    }

    async fn renew_claims(&self, now: DateTime<Utc>, limit: i64) -> Result<u64> {
        claim_upkeep::renew_claims(self, now, limit).await
    }

    async fn release_superseded_claims(
        &self,
        job_id: i64,
        run: ClaimRun,
        keep_tokens: &[String],
    ) -> Result<u64> {
        claim_upkeep::release_superseded_claims(self, job_id, run, keep_tokens).await
    }

    async fn fan_out(
        &self,
        parent: i64,
        fence: Option<Lease>,
        items: &[WorkItem],
        layout: (i32, i32),
        contract: &str,
        now: DateTime<Utc>,
    ) -> Result<FanOutOutcome> {
        batch::fan_out(self, parent, fence, items, layout, contract, now).await
    }

    async fn schedule_chunk(
        &self,
        parent: i64,
        offset: i64,
        priority: i32,
        now: DateTime<Utc>,
    ) -> Result<()> {
        batch::schedule_chunk(self, parent, offset, priority, now).await
    }

    async fn lease_work(
        &self,
        parent: i64,
        limit: i64,
        chunk: Lease,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkRow>> {
        batch::lease_work(self, parent, limit, chunk, lease_until, now).await
    }

    async fn create_child(
        &self,
        child: &ChildSpec,
        chunk: Lease,
        now: DateTime<Utc>,
    ) -> Result<ChildOutcome> {
        batch::create_child(self, child, chunk, now).await
    }

    async fn create_children(
        &self,
        children: &[ChildSpec],
        chunk: Lease,
        now: DateTime<Utc>,
    ) -> Result<Vec<ChildOutcome>> {
        children::create_children(self, children, chunk, now).await
    }

    async fn settle_work(
        &self,
        parent: i64,
        idx: i32,
        chunk: Lease,
        settle: &RowSettle,
        _now: DateTime<Utc>,
    ) -> Result<()> {
        batch::settle_work(self, parent, idx, chunk, settle).await
    }

    async fn fence_batch(&self, parent: i64, now: DateTime<Utc>) -> Result<FenceOutcome> {
        fence::fence_batch(self, parent, now).await
    }

    async fn abort_batch(
        &self,
        parent: i64,
        why: BatchAbort,
        now: DateTime<Utc>,
    ) -> Result<BatchState> {
        fence::abort_batch(self, parent, &why, now).await
    }

    async fn batch_state(&self, parent: i64) -> Result<Option<BatchState>> {
        fence::batch_state(self, parent).await
    }

    async fn worklist_pending(&self, parent: i64) -> Result<Option<WorklistPending>> {
        fence::worklist_pending(self, parent).await
    }
    async fn batch_head(&self, parent: i64) -> Result<Option<crate::batch::BatchHead>> {
        fence::batch_head(self, parent).await
    }

    async fn create_rerun_job(
        &self,
        job: &NewJob,
        parent: i64,
        parent_version: i64,
        parent_data: &Value,
        now: DateTime<Utc>,
    ) -> Result<Option<i64>> {
        jobs::create_job_marking(self, job, Some((parent, parent_version, parent_data)), now).await
    }

    async fn failed_children(
        &self,
        parent: i64,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<FailedChild>> {
        fence::failed_children(self, parent, after_id, limit).await
    }

    async fn cleanup_worklist(&self, parent: i64) -> Result<u64> {
        fence::cleanup_worklist(self, parent).await
    }

    async fn job_liveness(
        &self,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<JobLiveness>> {
        recovery::job_liveness(self, older_than, limit).await
    }

    async fn audit(&self, now: DateTime<Utc>, grace: chrono::Duration) -> Result<Vec<Violation>> {
        recovery::audit(self, now, grace).await
    }

    async fn database_now(&self) -> Result<DateTime<Utc>> {
        query::database_now(self).await
    }

    async fn search_actions(&self, search: &ActionSearch) -> Result<ActionPage> {
        ui::search_actions(self, search).await
    }

    async fn count_actions(&self, search: &ActionSearch, cap: i64) -> Result<Capped> {
        ui::count_actions(self, search, cap).await
    }

    async fn metrics_gauges(&self, now: DateTime<Utc>) -> Result<crate::store::MetricsGauges> {
        gauges::metrics_gauges(self, now).await
    }

    async fn throughput(
        &self,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        bucket: chrono::Duration,
    ) -> Result<Vec<ThroughputBucket>> {
        ui::throughput(self, since, until, bucket).await
    }

    async fn logs_tail(&self, id: i64, limit: i64) -> Result<Vec<ActionLog>> {
        ui::logs_tail(self, id, limit).await
    }

    async fn schema_version(&self) -> Result<i64> {
        ui::schema_version(self).await
    }

    async fn cancel_many(
        &self,
        ids: &[i64],
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<BulkOutcome> {
        ui::cancel_many(self, ids, actor, now).await
    }

    async fn retry_many(
        &self,
        ids: &[i64],
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<BulkOutcome> {
        ui::retry_many(self, ids, actor, now).await
    }

    async fn run_now(&self, ids: &[i64], actor: &str, now: DateTime<Utc>) -> Result<BulkOutcome> {
        ui::run_now(self, ids, actor, now).await
    }

    async fn delete_actions(&self, ids: &[i64]) -> Result<BulkOutcome> {
        ui::delete_actions(self, ids).await
    }

    async fn group_overview(
        &self,
        now: DateTime<Utc>,
        cap: i64,
        max_groups: i64,
    ) -> Result<Vec<GroupStat>> {
        views::group_overview(self, now, cap, max_groups).await
    }

    async fn set_group_paused(
        &self,
        group: &str,
        paused: bool,
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        views::set_group_paused(self, group, paused, actor, now).await
    }

    async fn paused_groups(&self) -> Result<Vec<crate::search::GroupPause>> {
        views::paused_groups(self).await
    }

    async fn set_group_limit(
        &self,
        group: &str,
        limit: &crate::limits::GroupLimit,
        actor: &str,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        limits::set_group_limit(self, group, limit, actor, now).await
    }

    async fn clear_group_limit(&self, group: &str) -> Result<bool> {
        limits::clear_group_limit(self, group).await
    }

    async fn group_limits(&self, now: DateTime<Utc>) -> Result<Vec<crate::limits::GroupLimitInfo>> {
        limits::group_limits(self, now).await
    }

    async fn search_jobs(&self, search: &JobSearch) -> Result<JobPage> {
        views::search_jobs(self, search).await
    }

    async fn job_actions(&self, job_id: i64, limit: i64) -> Result<Vec<ActionSummary>> {
        views::job_actions(self, job_id, limit).await
    }

    async fn search_claims(&self, search: &ClaimSearch) -> Result<ClaimPage> {
        views::search_claims(self, search).await
    }

    async fn claim_scopes(
        &self,
        now: DateTime<Utc>,
        cap: i64,
        max_scopes: i64,
    ) -> Result<Vec<ScopeStat>> {
        views::claim_scopes(self, now, cap, max_scopes).await
    }

    fn wakeups(&self) -> watch::Receiver<u64> {
        self.wake.subscribe()
    }

    async fn listen(&self) -> Result<()> {
        Ok(())
    }

    async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
        self.reader.close().await;
    }
}
