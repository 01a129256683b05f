//! A [`Store`] wrapper that runs every store call inside a `dockhand.store` span (field `op`),
//! so traces show each database round trip of an action's life. [`crate::store::connect`] wraps
//! every store it opens; wrap a store you opened yourself with [`Traced::wrap`].

use super::{
    Backend, ClaimRequest, ClaimedAction, DynStore, Enqueued, Finish, FinishResult, Lease,
    PruneCutoffs, QueueStats, ReapReport, Store,
};
use crate::action::{Action, ActionFilter, ActionLog, ActionQuery, PreparedAction};
use crate::error::Result;
use crate::schedule::{PreparedSchedule, Schedule};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

/// Spans around an inner store.
pub struct Traced {
    inner: DynStore,
}

impl Traced {
    /// Wraps `inner`.
    pub fn wrap(inner: DynStore) -> DynStore {
        Arc::new(Traced { inner })
    }
}

macro_rules! span {
    ($op:literal, $call:expr) => {
        $call
            .instrument(tracing::debug_span!("dockhand.store", op = $op))
            .await
    };
}

#[async_trait]
impl Store for Traced {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    async fn migrate(&self) -> Result<()> {
        span!("migrate", self.inner.migrate())
    }
    async fn enqueue(&self, a: &PreparedAction, now: DateTime<Utc>) -> Result<Enqueued> {
        span!("enqueue", self.inner.enqueue(a, now))
    }
    async fn enqueue_bulk(
        &self,
        a: &[PreparedAction],
        now: DateTime<Utc>,
    ) -> Result<Vec<Enqueued>> {
        span!("enqueue_bulk", self.inner.enqueue_bulk(a, now))
    }
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedAction>> {
        span!("claim", self.inner.claim(req))
    }
    async fn heartbeat(&self, owner: &str, leases: &[Lease], until: DateTime<Utc>) -> Result<u64> {
        span!("heartbeat", self.inner.heartbeat(owner, leases, until))
    }
    async fn finish(&self, lease: Lease, o: &Finish, now: DateTime<Utc>) -> Result<FinishResult> {
        span!("finish", self.inner.finish(lease, o, now))
    }
    async fn cancel(&self, id: i64, now: DateTime<Utc>) -> Result<bool> {
        span!("cancel", self.inner.cancel(id, now))
    }
    async fn retry(&self, id: i64, now: DateTime<Utc>) -> Result<bool> {
        span!("retry", self.inner.retry(id, now))
    }
    async fn unschedule(&self, f: &ActionFilter, now: DateTime<Utc>) -> Result<u64> {
        span!("unschedule", self.inner.unschedule(f, now))
    }
    async fn next_scheduled(&self, f: &ActionFilter) -> Result<Option<DateTime<Utc>>> {
        span!("next_scheduled", self.inner.next_scheduled(f))
    }
    async fn query(&self, q: &ActionQuery) -> Result<Vec<Action>> {
        span!("query", self.inner.query(q))
    }
    async fn get(&self, id: i64) -> Result<Option<Action>> {
        span!("get", self.inner.get(id))
    }
    async fn logs(&self, id: i64) -> Result<Vec<ActionLog>> {
        span!("logs", self.inner.logs(id))
    }
    async fn stats(&self, now: DateTime<Utc>) -> Result<QueueStats> {
        span!("stats", self.inner.stats(now))
    }
    async fn upsert_schedule(&self, s: &PreparedSchedule, now: DateTime<Utc>) -> Result<i64> {
        span!("upsert_schedule", self.inner.upsert_schedule(s, now))
    }
    async fn schedules(&self) -> Result<Vec<Schedule>> {
        span!("schedules", self.inner.schedules())
    }
    async fn due_schedules(&self, horizon: DateTime<Utc>, limit: i64) -> Result<Vec<Schedule>> {
        span!("due_schedules", self.inner.due_schedules(horizon, limit))
    }
    async fn materialise(
        &self,
        s: &Schedule,
        occurrence: DateTime<Utc>,
        next: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        span!(
            "materialise",
            self.inner.materialise(s, occurrence, next, now)
        )
    }
    async fn rearm_fixed_delay(&self, now: DateTime<Utc>) -> Result<u64> {
        span!("rearm_fixed_delay", self.inner.rearm_fixed_delay(now))
    }
    async fn set_schedule_enabled(&self, id: i64, enabled: bool) -> Result<bool> {
        span!(
            "set_schedule_enabled",
            self.inner.set_schedule_enabled(id, enabled)
        )
    }
    async fn reap_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<ReapReport> {
        span!("reap_expired", self.inner.reap_expired(now, limit))
    }
    async fn prune(&self, c: &PruneCutoffs) -> Result<u64> {
        span!("prune", self.inner.prune(c))
    }
    async fn try_maintenance_lease(
        &self,
        task: &str,
        owner: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        span!(
            "maintenance_lease",
            self.inner.try_maintenance_lease(task, owner, until, now)
        )
    }
    fn wakeups(&self) -> watch::Receiver<u64> {
        self.inner.wakeups()
    }
    async fn listen(&self) -> Result<()> {
        span!("listen", self.inner.listen())
    }
    async fn close(&self) {
        self.inner.close().await
    }
}
