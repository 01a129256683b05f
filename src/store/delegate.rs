//! One list of the [`super::Store`] methods for wrapper stores ([`super::traced`],
//! [`super::faulty`]): each wrapper says what to do around a call, and the macro writes the
//! delegation for every method, so a method added to the trait is added to every wrapper.

/// Expands to `impl Store for $ty` for a wrapper with an `inner: DynStore` field, wrapping
/// each call as `$around!(self, "method", future)` (`backend`, `wakeups` and `close` pass
/// straight through). The caller's imports name the trait's types.
macro_rules! delegate_store {
    ($ty:ty, $around:ident) => {
        #[async_trait::async_trait]
        impl Store for $ty {
            fn backend(&self) -> Backend {
                self.inner.backend()
            }
            fn wakeups(&self) -> watch::Receiver<u64> {
                self.inner.wakeups()
            }
            async fn close(&self) {
                self.inner.close().await
            }
            async fn migrate(&self) -> Result<()> {
                $around!(self, "migrate", self.inner.migrate())
            }
            async fn enqueue(
                &self,
                action: &PreparedAction,
                now: DateTime<Utc>,
            ) -> Result<Enqueued> {
                $around!(self, "enqueue", self.inner.enqueue(action, now))
            }
            async fn enqueue_bulk(
                &self,
                actions: &[PreparedAction],
                now: DateTime<Utc>,
            ) -> Result<Vec<Enqueued>> {
                $around!(self, "enqueue_bulk", self.inner.enqueue_bulk(actions, now))
            }
            async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedAction>> {
                $around!(self, "claim", self.inner.claim(req))
            }
            async fn heartbeat(
                &self,
                owner: &str,
                leases: &[Lease],
                until: DateTime<Utc>,
            ) -> Result<u64> {
                $around!(
                    self,
                    "heartbeat",
                    self.inner.heartbeat(owner, leases, until)
                )
            }
            async fn finish(
                &self,
                lease: Lease,
                outcome: &Finish,
                now: DateTime<Utc>,
            ) -> Result<FinishResult> {
                $around!(self, "finish", self.inner.finish(lease, outcome, now))
            }
            async fn finish_many(
                &self,
                items: &[(Lease, Finish)],
                now: DateTime<Utc>,
            ) -> Result<Vec<FinishResult>> {
                $around!(self, "finish_many", self.inner.finish_many(items, now))
            }
            async fn finish_and_claim(
                &self,
                items: &[(Lease, Finish)],
                req: &ClaimRequest<'_>,
                now: DateTime<Utc>,
            ) -> Result<FinishAndClaim> {
                $around!(
                    self,
                    "finish_and_claim",
                    self.inner.finish_and_claim(items, req, now)
                )
            }
            async fn cancel(&self, id: i64, now: DateTime<Utc>) -> Result<bool> {
                $around!(self, "cancel", self.inner.cancel(id, now))
            }
            async fn retry(&self, id: i64, now: DateTime<Utc>) -> Result<bool> {
                $around!(self, "retry", self.inner.retry(id, now))
            }
            async fn unschedule(&self, filter: &ActionFilter, now: DateTime<Utc>) -> Result<u64> {
                $around!(self, "unschedule", self.inner.unschedule(filter, now))
            }
            async fn next_scheduled(&self, filter: &ActionFilter) -> Result<Option<DateTime<Utc>>> {
                $around!(self, "next_scheduled", self.inner.next_scheduled(filter))
            }
            async fn query(&self, query: &ActionQuery) -> Result<Vec<Action>> {
                $around!(self, "query", self.inner.query(query))
            }
            async fn get(&self, id: i64) -> Result<Option<Action>> {
                $around!(self, "get", self.inner.get(id))
            }
            async fn logs(&self, id: i64) -> Result<Vec<ActionLog>> {
                $around!(self, "logs", self.inner.logs(id))
            }
            async fn stats(&self, now: DateTime<Utc>) -> Result<QueueStats> {
                $around!(self, "stats", self.inner.stats(now))
            }
            async fn upsert_schedule(
                &self,
                s: &PreparedSchedule,
                now: DateTime<Utc>,
            ) -> Result<i64> {
                $around!(self, "upsert_schedule", self.inner.upsert_schedule(s, now))
            }
            async fn schedules(&self) -> Result<Vec<Schedule>> {
                $around!(self, "schedules", self.inner.schedules())
            }
            async fn due_schedules(
                &self,
                horizon: DateTime<Utc>,
                limit: i64,
            ) -> Result<Vec<Schedule>> {
                $around!(
                    self,
                    "due_schedules",
                    self.inner.due_schedules(horizon, limit)
                )
            }
            async fn materialise(
                &self,
                schedule: &Schedule,
                occurrence: DateTime<Utc>,
                next: Option<DateTime<Utc>>,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "materialise",
                    self.inner.materialise(schedule, occurrence, next, now)
                )
            }
            async fn rearm_fixed_delay(&self, now: DateTime<Utc>) -> Result<u64> {
                $around!(self, "rearm_fixed_delay", self.inner.rearm_fixed_delay(now))
            }
            async fn set_schedule_enabled(&self, id: i64, enabled: bool) -> Result<bool> {
                $around!(
                    self,
                    "set_schedule_enabled",
                    self.inner.set_schedule_enabled(id, enabled)
                )
            }
            async fn reap_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<ReapReport> {
                $around!(self, "reap_expired", self.inner.reap_expired(now, limit))
            }
            async fn prune(&self, cutoffs: &PruneCutoffs) -> Result<u64> {
                $around!(self, "prune", self.inner.prune(cutoffs))
            }
            async fn prune_jobs(&self, cutoffs: &PruneCutoffs) -> Result<JobPrune> {
                $around!(self, "prune_jobs", self.inner.prune_jobs(cutoffs))
            }
            async fn prune_packets(&self, used_before: DateTime<Utc>, limit: i64) -> Result<u64> {
                $around!(
                    self,
                    "prune_packets",
                    self.inner.prune_packets(used_before, limit)
                )
            }
            async fn try_maintenance_lease(
                &self,
                task: &str,
                owner: &str,
                until: DateTime<Utc>,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "try_maintenance_lease",
                    self.inner.try_maintenance_lease(task, owner, until, now)
                )
            }
            async fn maintenance_lease_held(&self, task: &str, now: DateTime<Utc>) -> Result<bool> {
                $around!(
                    self,
                    "maintenance_lease_held",
                    self.inner.maintenance_lease_held(task, now)
                )
            }
            async fn create_job(&self, job: &NewJob, now: DateTime<Utc>) -> Result<i64> {
                $around!(self, "create_job", self.inner.create_job(job, now))
            }

            async fn start_scheduled_job(
                &self,
                job: &NewJob,
                guard: ScheduleGuard<'_>,
                now: DateTime<Utc>,
            ) -> Result<JobCreated> {
                $around!(
                    self,
                    "start_scheduled_job",
                    self.inner.start_scheduled_job(job, guard, now)
                )
            }
            async fn get_job(&self, id: i64) -> Result<Option<Job>> {
                $around!(self, "get_job", self.inner.get_job(id))
            }
            async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
                $around!(self, "list_jobs", self.inner.list_jobs(filter))
            }
            async fn start_step(
                &self,
                job_id: i64,
                step: i32,
                now: DateTime<Utc>,
            ) -> Result<$crate::jobs::StepStart> {
                $around!(self, "start_step", self.inner.start_step(job_id, step, now))
            }
            async fn start_steps(
                &self,
                reqs: &[(i64, i32)],
                now: DateTime<Utc>,
            ) -> Result<Vec<$crate::jobs::StepStart>> {
                $around!(self, "start_steps", self.inner.start_steps(reqs, now))
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
                $around!(
                    self,
                    "advance_job",
                    self.inner
                        .advance_job(job_id, fence, steps, input_refs, step, now)
                )
            }
            async fn park_job(
                &self,
                job_id: i64,
                fence: Option<Lease>,
                steps: (i32, i32),
                input_refs: &[String],
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "park_job",
                    self.inner.park_job(job_id, fence, steps, input_refs, now)
                )
            }
            async fn resume_job(
                &self,
                job_id: i64,
                step: &StepAction,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(self, "resume_job", self.inner.resume_job(job_id, step, now))
            }
            async fn finish_job(
                &self,
                job_id: i64,
                status: JobStatus,
                reason: Option<&str>,
                completions: &CompletionRegistry,
                now: DateTime<Utc>,
            ) -> Result<BridgeOutcome> {
                $around!(
                    self,
                    "finish_job",
                    self.inner
                        .finish_job(job_id, status, reason, completions, now)
                )
            }
            async fn finish_jobs(
                &self,
                reqs: &[$crate::jobs::FinishRequest],
                completions: &CompletionRegistry,
                now: DateTime<Utc>,
            ) -> Result<$crate::jobs::GroupFinished> {
                $around!(
                    self,
                    "finish_jobs",
                    self.inner.finish_jobs(reqs, completions, now)
                )
            }
            async fn engine_data(&self, job_id: i64) -> Result<Option<(Value, i64)>> {
                $around!(self, "engine_data", self.inner.engine_data(job_id))
            }
            async fn cas_engine_data(
                &self,
                job_id: i64,
                expected_version: i64,
                data: &Value,
            ) -> Result<bool> {
                $around!(
                    self,
                    "cas_engine_data",
                    self.inner.cas_engine_data(job_id, expected_version, data)
                )
            }
            async fn undelivered_events(&self, limit: i64) -> Result<Vec<JobEvent>> {
                $around!(
                    self,
                    "undelivered_events",
                    self.inner.undelivered_events(limit)
                )
            }
            async fn mark_events_unheard(
                &self,
                event_ids: &[i64],
                now: DateTime<Utc>,
            ) -> Result<u64> {
                $around!(
                    self,
                    "mark_events_unheard",
                    self.inner.mark_events_unheard(event_ids, now)
                )
            }
            async fn mark_event_delivered(
                &self,
                event_id: i64,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "mark_event_delivered",
                    self.inner.mark_event_delivered(event_id, now)
                )
            }
            async fn put_packets(
                &self,
                packets: &[EncodedPacket],
                now: DateTime<Utc>,
            ) -> Result<()> {
                $around!(self, "put_packets", self.inner.put_packets(packets, now))
            }
            async fn packet_body(&self, hash: &str) -> Result<Option<String>> {
                $around!(self, "packet_body", self.inner.packet_body(hash))
            }
            async fn packet_bodies(
                &self,
                hashes: &[&str],
            ) -> Result<std::collections::HashMap<String, String>> {
                $around!(self, "packet_bodies", self.inner.packet_bodies(hashes))
            }
            async fn claim_item(
                &self,
                req: &ClaimItemRequest,
                now: DateTime<Utc>,
            ) -> Result<ClaimOutcome> {
                $around!(self, "claim_item", self.inner.claim_item(req, now))
            }
            async fn claim_items(
                &self,
                reqs: &[ClaimItemRequest],
                now: DateTime<Utc>,
            ) -> Result<Vec<ClaimOutcome>> {
                $around!(self, "claim_items", self.inner.claim_items(reqs, now))
            }
            async fn renew_claims(&self, now: DateTime<Utc>, limit: i64) -> Result<u64> {
                $around!(self, "renew_claims", self.inner.renew_claims(now, limit))
            }
            async fn release_superseded_claims(
                &self,
                job_id: i64,
                run: ClaimRun,
                keep_tokens: &[String],
            ) -> Result<u64> {
                $around!(
                    self,
                    "release_superseded_claims",
                    self.inner
                        .release_superseded_claims(job_id, run, keep_tokens)
                )
            }
            async fn get_claim(&self, identity: &Identity) -> Result<Option<ItemClaim>> {
                $around!(self, "get_claim", self.inner.get_claim(identity))
            }
            async fn complete_claim(
                &self,
                descriptor: &Descriptor,
                handler: Option<Arc<dyn CompletionHandler>>,
                now: DateTime<Utc>,
            ) -> Result<CompleteOutcome> {
                $around!(
                    self,
                    "complete_claim",
                    self.inner.complete_claim(descriptor, handler, now)
                )
            }
            async fn release_claim(
                &self,
                descriptor: &Descriptor,
                defer: bool,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "release_claim",
                    self.inner.release_claim(descriptor, defer, now)
                )
            }
            async fn list_claims(&self, filter: &ClaimFilter) -> Result<Vec<ItemClaim>> {
                $around!(self, "list_claims", self.inner.list_claims(filter))
            }
            async fn tracked_item(
                &self,
                namespace: &str,
                item_id: &str,
            ) -> Result<Option<TrackedItem>> {
                $around!(
                    self,
                    "tracked_item",
                    self.inner.tracked_item(namespace, item_id)
                )
            }
            async fn listen(&self) -> Result<()> {
                $around!(self, "listen", self.inner.listen())
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
                $around!(
                    self,
                    "fan_out",
                    self.inner
                        .fan_out(parent, fence, items, layout, contract, now)
                )
            }
            async fn schedule_chunk(
                &self,
                parent: i64,
                offset: i64,
                priority: i32,
                now: DateTime<Utc>,
            ) -> Result<()> {
                $around!(
                    self,
                    "schedule_chunk",
                    self.inner.schedule_chunk(parent, offset, priority, now)
                )
            }
            async fn lease_work(
                &self,
                parent: i64,
                limit: i64,
                chunk: Lease,
                lease_until: DateTime<Utc>,
                now: DateTime<Utc>,
            ) -> Result<Vec<WorkRow>> {
                $around!(
                    self,
                    "lease_work",
                    self.inner
                        .lease_work(parent, limit, chunk, lease_until, now)
                )
            }
            async fn create_child(
                &self,
                child: &ChildSpec,
                chunk: Lease,
                now: DateTime<Utc>,
            ) -> Result<ChildOutcome> {
                $around!(
                    self,
                    "create_child",
                    self.inner.create_child(child, chunk, now)
                )
            }
            async fn create_children(
                &self,
                children: &[ChildSpec],
                chunk: Lease,
                now: DateTime<Utc>,
            ) -> Result<Vec<ChildOutcome>> {
                $around!(
                    self,
                    "create_children",
                    self.inner.create_children(children, chunk, now)
                )
            }
            async fn settle_work(
                &self,
                parent: i64,
                idx: i32,
                chunk: Lease,
                settle: &RowSettle,
                now: DateTime<Utc>,
            ) -> Result<()> {
                $around!(
                    self,
                    "settle_work",
                    self.inner.settle_work(parent, idx, chunk, settle, now)
                )
            }
            async fn fence_batch(&self, parent: i64, now: DateTime<Utc>) -> Result<FenceOutcome> {
                $around!(self, "fence_batch", self.inner.fence_batch(parent, now))
            }
            async fn abort_batch(
                &self,
                parent: i64,
                why: BatchAbort,
                now: DateTime<Utc>,
            ) -> Result<BatchState> {
                $around!(
                    self,
                    "abort_batch",
                    self.inner.abort_batch(parent, why, now)
                )
            }
            async fn batch_state(&self, parent: i64) -> Result<Option<BatchState>> {
                $around!(self, "batch_state", self.inner.batch_state(parent))
            }
            async fn worklist_pending(
                &self,
                parent: i64,
            ) -> Result<Option<$crate::batch::WorklistPending>> {
                $around!(
                    self,
                    "worklist_pending",
                    self.inner.worklist_pending(parent)
                )
            }
            async fn batch_head(&self, parent: i64) -> Result<Option<$crate::batch::BatchHead>> {
                $around!(self, "batch_head", self.inner.batch_head(parent))
            }
            async fn create_rerun_job(
                &self,
                job: &NewJob,
                parent: i64,
                parent_version: i64,
                parent_data: &Value,
                now: DateTime<Utc>,
            ) -> Result<Option<i64>> {
                $around!(
                    self,
                    "create_rerun_job",
                    self.inner
                        .create_rerun_job(job, parent, parent_version, parent_data, now)
                )
            }
            async fn failed_children(
                &self,
                parent: i64,
                after_id: i64,
                limit: i64,
            ) -> Result<Vec<FailedChild>> {
                $around!(
                    self,
                    "failed_children",
                    self.inner.failed_children(parent, after_id, limit)
                )
            }
            async fn cleanup_worklist(&self, parent: i64) -> Result<u64> {
                $around!(
                    self,
                    "cleanup_worklist",
                    self.inner.cleanup_worklist(parent)
                )
            }
            async fn job_liveness(
                &self,
                older_than: DateTime<Utc>,
                limit: i64,
            ) -> Result<Vec<JobLiveness>> {
                $around!(
                    self,
                    "job_liveness",
                    self.inner.job_liveness(older_than, limit)
                )
            }
            async fn audit(
                &self,
                now: DateTime<Utc>,
                grace: chrono::Duration,
            ) -> Result<Vec<Violation>> {
                $around!(self, "audit", self.inner.audit(now, grace))
            }
            async fn database_now(&self) -> Result<DateTime<Utc>> {
                $around!(self, "database_now", self.inner.database_now())
            }
            async fn search_actions(
                &self,
                search: &$crate::search::ActionSearch,
            ) -> Result<$crate::search::ActionPage> {
                $around!(self, "search_actions", self.inner.search_actions(search))
            }
            async fn count_actions(
                &self,
                search: &$crate::search::ActionSearch,
                cap: i64,
            ) -> Result<$crate::store::Capped> {
                $around!(self, "count_actions", self.inner.count_actions(search, cap))
            }
            async fn throughput(
                &self,
                since: DateTime<Utc>,
                until: DateTime<Utc>,
                bucket: chrono::Duration,
            ) -> Result<Vec<$crate::store::ThroughputBucket>> {
                $around!(
                    self,
                    "throughput",
                    self.inner.throughput(since, until, bucket)
                )
            }
            async fn metrics_gauges(
                &self,
                now: DateTime<Utc>,
            ) -> Result<$crate::store::MetricsGauges> {
                $around!(self, "metrics_gauges", self.inner.metrics_gauges(now))
            }
            async fn logs_tail(&self, id: i64, limit: i64) -> Result<Vec<ActionLog>> {
                $around!(self, "logs_tail", self.inner.logs_tail(id, limit))
            }
            async fn schema_version(&self) -> Result<i64> {
                $around!(self, "schema_version", self.inner.schema_version())
            }
            async fn cancel_many(
                &self,
                ids: &[i64],
                actor: &str,
                now: DateTime<Utc>,
            ) -> Result<$crate::store::BulkOutcome> {
                $around!(self, "cancel_many", self.inner.cancel_many(ids, actor, now))
            }
            async fn retry_many(
                &self,
                ids: &[i64],
                actor: &str,
                now: DateTime<Utc>,
            ) -> Result<$crate::store::BulkOutcome> {
                $around!(self, "retry_many", self.inner.retry_many(ids, actor, now))
            }
            async fn run_now(
                &self,
                ids: &[i64],
                actor: &str,
                now: DateTime<Utc>,
            ) -> Result<$crate::store::BulkOutcome> {
                $around!(self, "run_now", self.inner.run_now(ids, actor, now))
            }
            async fn delete_actions(&self, ids: &[i64]) -> Result<$crate::store::BulkOutcome> {
                $around!(self, "delete_actions", self.inner.delete_actions(ids))
            }
            async fn group_overview(
                &self,
                now: DateTime<Utc>,
                cap: i64,
                max_groups: i64,
            ) -> Result<Vec<$crate::search::GroupStat>> {
                $around!(
                    self,
                    "group_overview",
                    self.inner.group_overview(now, cap, max_groups)
                )
            }
            async fn set_group_paused(
                &self,
                group: &str,
                paused: bool,
                actor: &str,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "set_group_paused",
                    self.inner.set_group_paused(group, paused, actor, now)
                )
            }
            async fn paused_groups(&self) -> Result<Vec<$crate::search::GroupPause>> {
                $around!(self, "paused_groups", self.inner.paused_groups())
            }
            async fn set_group_limit(
                &self,
                group: &str,
                limit: &$crate::limits::GroupLimit,
                actor: &str,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                $around!(
                    self,
                    "set_group_limit",
                    self.inner.set_group_limit(group, limit, actor, now)
                )
            }
            async fn clear_group_limit(&self, group: &str) -> Result<bool> {
                $around!(
                    self,
                    "clear_group_limit",
                    self.inner.clear_group_limit(group)
                )
            }
            async fn group_limits(
                &self,
                now: DateTime<Utc>,
            ) -> Result<Vec<$crate::limits::GroupLimitInfo>> {
                $around!(self, "group_limits", self.inner.group_limits(now))
            }
            async fn search_jobs(
                &self,
                search: &$crate::search::JobSearch,
            ) -> Result<$crate::search::JobPage> {
                $around!(self, "search_jobs", self.inner.search_jobs(search))
            }
            async fn job_actions(
                &self,
                job_id: i64,
                limit: i64,
            ) -> Result<Vec<$crate::search::ActionSummary>> {
                $around!(self, "job_actions", self.inner.job_actions(job_id, limit))
            }
            async fn search_claims(
                &self,
                search: &$crate::search::ClaimSearch,
            ) -> Result<$crate::search::ClaimPage> {
                $around!(self, "search_claims", self.inner.search_claims(search))
            }
            async fn claim_scopes(
                &self,
                now: DateTime<Utc>,
                cap: i64,
                max_scopes: i64,
            ) -> Result<Vec<$crate::search::ScopeStat>> {
                $around!(
                    self,
                    "claim_scopes",
                    self.inner.claim_scopes(now, cap, max_scopes)
                )
            }
        }
    };
}

pub(crate) use delegate_store;
