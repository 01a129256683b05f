//! The enqueue and query API (Action Scheduler parity, Q10), usable without starting workers.

use crate::action::{Action, ActionFilter, ActionLog, ActionQuery, ActionSpec};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::limits::{GroupLimit, GroupLimitInfo};
use crate::schedule::{Schedule, ScheduleSpec};
use crate::state::ActionStatus;
use crate::store::operator::{owning_job, JOB_OWNED_HOOKS};
use crate::store::{DynStore, Enqueued, QueueStats};
use crate::telemetry;
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// How many of the next pending matches [`Queue::unschedule_one`] reads to find one no job
/// owns.
pub const UNSCHEDULE_ONE_LOOKAHEAD: i64 = 100;

/// A handle on the queue: enqueue, unschedule, query. Cheap to clone.
///
/// Usable without workers (a web handler that only enqueues):
///
/// ```no_run
/// use dockhand::{ActionSpec, Queue, Recurrence, ScheduleSpec};
/// use serde_json::json;
///
/// # async fn demo() -> dockhand::Result<()> {
/// let queue = Queue::new(dockhand::connect("sqlite:dockhand.db").await?);
/// // once, in ten minutes, in its own group, at most one pending copy of these args
/// let id = queue
///     .enqueue(
///         ActionSpec::new("report.build", json!({"day": "2026-12-03"}))
///             .after(chrono::Duration::minutes(10))
///             .group("reports")
///             .unique(),
///     )
///     .await?;
/// // every weekday at 06:00 Berlin time
/// queue
///     .schedule(
///         ScheduleSpec::new("report.mail", json!({}), Recurrence::cron("0 6 * * 1-5", "Europe/Berlin")?)
///             .name("weekday-mail"),
///     )
///     .await?;
/// println!("{:?}", queue.get(id).await?.status);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Queue {
    store: DynStore,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("backend", &self.store.backend())
            .finish()
    }
}

impl Queue {
    /// A queue over `store` using the system clock.
    pub fn new(store: DynStore) -> Self {
        Self::with_clock(store, Arc::new(SystemClock))
    }

    /// A queue over `store` using `clock` for every "now".
    pub fn with_clock(store: DynStore, clock: Arc<dyn Clock>) -> Self {
        Self { store, clock }
    }

    /// The store behind this queue.
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// The clock behind this queue.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Enqueues one action and returns its id (the existing id for a unique duplicate).
    pub async fn enqueue(&self, spec: ActionSpec) -> Result<i64> {
        Ok(self.enqueue_detailed(spec).await?.id)
    }

    /// Enqueues one action and tells whether a row was inserted.
    pub async fn enqueue_detailed(&self, spec: ActionSpec) -> Result<Enqueued> {
        let now = self.clock.now();
        let prepared = spec.prepare(now)?;
        let r = self.store.enqueue(&prepared, now).await?;
        if r.inserted {
            metrics::counter!(telemetry::ENQUEUED, "hook" => prepared.hook.clone()).increment(1);
        }
        Ok(r)
    }

    /// Enqueues many actions in one transaction; ids in input order. Every spec is validated
    /// before anything is written.
    pub async fn enqueue_bulk(&self, specs: Vec<ActionSpec>) -> Result<Vec<i64>> {
        let now = self.clock.now();
        let prepared = specs
            .iter()
            .map(|s| s.prepare(now))
            .collect::<Result<Vec<_>>>()?;
        let r = self.store.enqueue_bulk(&prepared, now).await?;
        metrics::counter!(telemetry::ENQUEUED, "hook" => "bulk")
            .increment(r.iter().filter(|e| e.inserted).count() as u64);
        Ok(r.into_iter().map(|e| e.id).collect())
    }

    /// Creates or updates a recurring schedule (interval or cron) and returns its id.
    pub async fn schedule(&self, spec: ScheduleSpec) -> Result<i64> {
        let now = self.clock.now();
        let prepared = spec.prepare(now)?;
        self.store.upsert_schedule(&prepared, now).await
    }

    /// All schedules.
    pub async fn schedules(&self) -> Result<Vec<Schedule>> {
        self.store.schedules().await
    }

    /// Cancels the next pending action matching the filter (`as_unschedule_action`), passing
    /// over the actions a job owns (see [`Queue::cancel`]; those are never canceled here).
    /// Returns its id, or `None` when nothing matched (among the next
    /// [`UNSCHEDULE_ONE_LOOKAHEAD`] pending matches).
    pub async fn unschedule_one(&self, filter: &ActionFilter) -> Result<Option<i64>> {
        let next = self
            .query(&ActionQuery {
                filter: filter.clone(),
                statuses: vec![ActionStatus::Pending],
                limit: UNSCHEDULE_ONE_LOOKAHEAD,
                ..ActionQuery::default()
            })
            .await?;
        match next
            .iter()
            .find(|a| !JOB_OWNED_HOOKS.contains(&a.hook.as_str()))
        {
            Some(a) if self.store.cancel(a.id, self.clock.now()).await? => Ok(Some(a.id)),
            _ => Ok(None),
        }
    }

    /// Cancels every pending action matching the filter and disables matching schedules
    /// (`as_unschedule_all_actions`); running actions finish. Returns the number canceled.
    /// Actions a job owns (see [`Queue::cancel`]) are never canceled here.
    pub async fn unschedule_all(&self, filter: &ActionFilter) -> Result<u64> {
        self.store.unschedule(filter, self.clock.now()).await
    }

    /// When the next matching action or schedule occurrence runs (`as_next_scheduled_action`).
    pub async fn next_scheduled(&self, filter: &ActionFilter) -> Result<Option<DateTime<Utc>>> {
        self.store.next_scheduled(filter).await
    }

    /// Whether a matching action is pending or a matching schedule is enabled
    /// (`as_has_scheduled_action`).
    pub async fn has_scheduled(&self, filter: &ActionFilter) -> Result<bool> {
        Ok(self.next_scheduled(filter).await?.is_some())
    }

    /// Lists actions (`as_get_scheduled_actions`).
    pub async fn query(&self, q: &ActionQuery) -> Result<Vec<Action>> {
        if q.limit < 0 || q.offset < 0 {
            return Err(Error::invalid(
                "limit",
                "limit and offset must not be negative",
            ));
        }
        self.store.query(q).await
    }

    /// One action.
    pub async fn get(&self, id: i64) -> Result<Action> {
        self.store
            .get(id)
            .await?
            .ok_or(Error::NotFound { what: "action", id })
    }

    /// An action's log.
    pub async fn logs(&self, id: i64) -> Result<Vec<ActionLog>> {
        self.store.logs(id).await
    }

    /// Cancels a pending or running action; false if it was already final. A pending or
    /// running action a job owns (its step, finish, chunk or finalize action) is refused with
    /// [`Error::OwnedByJob`] naming the job: cancel the job instead ([`crate::Jobs::cancel`]);
    /// one whose args name no job (foreign or corrupt data) with [`Error::Corrupt`]. The
    /// refusal is the store's ([`crate::Store::cancel`]); only when it changed nothing is the
    /// action read, to say why.
    pub async fn cancel(&self, id: i64) -> Result<bool> {
        if self.store.cancel(id, self.clock.now()).await? {
            return Ok(true);
        }
        match self.store.get(id).await? {
            Some(a) if matches!(a.status, ActionStatus::Pending | ActionStatus::Running) => {
                match owning_job(&a.hook, &a.args) {
                    Some(job_id) => Err(Error::OwnedByJob {
                        action_id: id,
                        hook: a.hook,
                        job_id,
                    }),
                    // The store refused a job-owned hook whose args do not say whose it is.
                    None if JOB_OWNED_HOOKS.contains(&a.hook.as_str()) => Err(Error::Corrupt {
                        what: "action",
                        id,
                        message: format!(
                            "`{}` is a job's own action, so it is not canceled, but its args \
                             name no job ({}): cancel its job instead",
                            a.hook, a.args
                        ),
                    }),
                    None => Ok(false),
                }
            }
            _ => Ok(false),
        }
    }

    /// Puts a failed or canceled action back to pending with fresh attempts.
    pub async fn retry(&self, id: i64) -> Result<bool> {
        self.store.retry(id, self.clock.now()).await
    }

    /// Counts by status and group, past-due count, oldest lag.
    pub async fn stats(&self) -> Result<QueueStats> {
        self.store.stats(self.clock.now()).await
    }

    /// Sets (replaces) the limits of action group `group`, cluster-wide: at most
    /// `limit.concurrency` of its actions running at once and at most `limit.rate` starts per
    /// period, enforced inside every runner's claim (see [`crate::limits`]). Recorded as set by
    /// `api`. True when the group had no limits before. Errors name the bad field
    /// (`concurrency`, `rate`, `limit`, `group`).
    ///
    /// ```no_run
    /// use dockhand::{GroupLimit, Queue, RateLimit};
    /// use std::time::Duration;
    ///
    /// # async fn demo(queue: Queue) -> dockhand::Result<()> {
    /// // at most 2 calls to the mail API at once, and 10 per second
    /// queue
    ///     .set_group_limit(
    ///         "mail",
    ///         GroupLimit {
    ///             concurrency: Some(2),
    ///             rate: Some(RateLimit::new(10, Duration::from_secs(1))),
    ///         },
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_group_limit(&self, group: &str, limit: GroupLimit) -> Result<bool> {
        self.store
            .set_group_limit(group, &limit, "api", self.clock.now())
            .await
    }

    /// Removes the limits of action group `group`; its waiting actions become claimable at
    /// once. True when it had limits.
    pub async fn clear_group_limit(&self, group: &str) -> Result<bool> {
        self.store.clear_group_limit(group).await
    }

    /// The limited groups by name, with their running actions and recent starts.
    pub async fn group_limits(&self) -> Result<Vec<GroupLimitInfo>> {
        self.store.group_limits(self.clock.now()).await
    }
}
