//! Storage: the one [`Store`] trait with every database action the runtime needs, and one
//! module per backend laid out the same way (`enqueue`, `claim`, `finish`, `query`, `schedule`,
//! `maintenance`). No SQL exists outside this module. Every state change that needs several
//! statements is one store method that opens and commits its own transaction.
//!
//! Owner safety: every finishing UPDATE is guarded by action id + fencing token + status
//! `running`; zero rows is reported as [`FinishResult::LeaseLost`], never as success.

use crate::action::{Action, ActionFilter, ActionLog, ActionQuery, PreparedAction};
use crate::error::{Error, Result};
use crate::schedule::{PreparedSchedule, Schedule};
use crate::state::ActionStatus;
use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

pub mod postgres;
pub mod sqlite;
pub mod traced;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Embedded SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        })
    }
}

/// The result of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    /// The action's id (the existing one for a unique duplicate).
    pub id: i64,
    /// False when a unique duplicate was found and nothing was inserted.
    pub inserted: bool,
}

/// A runner's request for due actions.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The runner's owner id, stamped on the lease.
    pub owner: &'a str,
    /// How many actions at most (the runner's free slots).
    pub limit: i64,
    /// The current time: actions due at or before it are claimable.
    pub now: DateTime<Utc>,
    /// Lease expiry to stamp.
    pub lease_until: DateTime<Utc>,
    /// Claim only actions with these hooks (`None`: any hook; an action whose hook has no
    /// handler then fails with an "unknown hook" error, as in Action Scheduler).
    pub hooks: Option<&'a [String]>,
}

/// An action handed to a runner with its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedAction {
    /// Action id.
    pub id: i64,
    /// Hook name.
    pub hook: String,
    /// JSON args.
    pub args: Value,
    /// Group label.
    pub group: Option<String>,
    /// When it was due.
    pub scheduled_at: DateTime<Utc>,
    /// This attempt's number (1 for the first run).
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Per-run timeout, ms.
    pub timeout_ms: Option<i64>,
    /// The fencing token of this claim.
    pub token: i64,
}

impl ClaimedAction {
    /// The lease that guards finishing this claim.
    pub fn lease(&self) -> Lease {
        Lease {
            id: self.id,
            token: self.token,
        }
    }
}

/// What identifies one claim of one action: only its holder may finish it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Action id.
    pub id: i64,
    /// Fencing token.
    pub token: i64,
}

/// How a run ended, as written by [`Store::finish`].
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// Success: running → complete.
    Complete,
    /// Retryable failure with attempts left: running → pending at `at`.
    Retry {
        /// Next run time.
        at: DateTime<Utc>,
        /// The error text kept as `last_error`.
        error: String,
    },
    /// Fatal failure or attempts exhausted: running → failed.
    Fail {
        /// The error text kept as `last_error`.
        error: String,
    },
    /// Run later without using an attempt: running → pending at `at`.
    Snooze {
        /// Next run time.
        at: DateTime<Utc>,
    },
    /// Graceful shutdown gives the lease back, attempt uncounted: running → pending now.
    Release,
}

impl Finish {
    /// The status this finish writes.
    pub fn target(&self) -> ActionStatus {
        match self {
            Finish::Complete => ActionStatus::Complete,
            Finish::Fail { .. } => ActionStatus::Failed,
            _ => ActionStatus::Pending,
        }
    }

    /// (event, detail) for the action log.
    pub(crate) fn log_entry(&self) -> (&'static str, Option<String>) {
        match self {
            Finish::Complete => ("completed", None),
            Finish::Retry { at, error } => (
                "retry",
                Some(format!(
                    "{error} (next run {})",
                    at.to_rfc3339_opts(SecondsFormat::Millis, true)
                )),
            ),
            Finish::Fail { error } => ("failed", Some(error.clone())),
            Finish::Snooze { at } => (
                "snoozed",
                Some(format!(
                    "until {}",
                    at.to_rfc3339_opts(SecondsFormat::Millis, true)
                )),
            ),
            Finish::Release => ("released", Some("shutdown".into())),
        }
    }
}

/// Whether a guarded finish took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum FinishResult {
    /// The write happened.
    Applied,
    /// The lease was no longer ours (expired and reclaimed, canceled, or already finished):
    /// nothing was written except a `lease_lost` log entry.
    LeaseLost,
}

/// What the lease reaper did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReapReport {
    /// Expired leases put back to pending (attempt counted).
    pub requeued: u64,
    /// Expired leases with no attempts left, marked failed.
    pub failed: u64,
}

/// Age limits for retention.
#[derive(Debug, Clone, Copy)]
pub struct PruneCutoffs {
    /// Delete complete and canceled actions finished before this.
    pub finished_before: DateTime<Utc>,
    /// Delete failed actions finished before this.
    pub failed_before: DateTime<Utc>,
    /// At most this many actions per batch (one transaction per batch).
    pub batch: i64,
}

/// Queue statistics (`dockhand stats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueStats {
    /// Count per status.
    pub by_status: BTreeMap<String, i64>,
    /// Count per (group, status); the empty string stands for "no group".
    pub by_group: BTreeMap<String, BTreeMap<String, i64>>,
    /// Pending actions that are due now.
    pub past_due: i64,
    /// How late the oldest due pending action is, in milliseconds.
    pub oldest_due_lag_ms: Option<i64>,
}

/// Every database action the runtime needs. Implemented by [`sqlite::SqliteStore`] and
/// [`postgres::PgStore`]; tests wrap it to inject faults. All times come from the caller's clock.
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
    /// owner, a new fencing token and the lease expiry, and counting an attempt.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedAction>>;

    /// Extends the leases still held by `owner` with these tokens; returns how many were.
    async fn heartbeat(&self, owner: &str, leases: &[Lease], until: DateTime<Utc>) -> Result<u64>;

    /// Finishes a run, guarded by id + token + status running.
    async fn finish(
        &self,
        lease: Lease,
        outcome: &Finish,
        now: DateTime<Utc>,
    ) -> Result<FinishResult>;

    /// Cancels a pending or running action; false if it was neither.
    async fn cancel(&self, id: i64, now: DateTime<Utc>) -> Result<bool>;

    /// Puts a failed or canceled action back to pending with its attempts reset.
    async fn retry(&self, id: i64, now: DateTime<Utc>) -> Result<bool>;

    /// Cancels pending actions matching the filter (running ones finish) and disables matching
    /// schedules, so a recurring series stops; returns the number of actions canceled.
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

    /// Running actions whose lease expired: back to pending, or failed when out of attempts.
    async fn reap_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<ReapReport>;

    /// Deletes one batch of old finished actions and their logs; returns actions deleted.
    async fn prune(&self, cutoffs: &PruneCutoffs) -> Result<u64>;

    /// Takes (or renews) the cluster-wide lease of a maintenance task until `until`; false
    /// while another owner holds it.
    async fn try_maintenance_lease(
        &self,
        task: &str,
        owner: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool>;

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

/// Opens the store a URL names: `sqlite:…` (file or `sqlite::memory:`) or `postgres://…`.
/// Does not migrate.
pub async fn connect(url: &str) -> Result<DynStore> {
    if url.starts_with("sqlite:") {
        Ok(traced::Traced::wrap(Arc::new(
            sqlite::SqliteStore::connect(url).await?,
        )))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(traced::Traced::wrap(Arc::new(
            postgres::PgStore::connect(url).await?,
        )))
    } else {
        Err(Error::invalid(
            "database_url",
            format!(
                "unsupported scheme in `{}`; use sqlite:PATH, sqlite::memory: or postgres://",
                redact_url(url)
            ),
        ))
    }
}

/// The URL with any password replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((creds, host)) = rest.rsplit_once('@') {
            if let Some((user, _)) = creds.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    url.to_string()
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

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_shown() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("sqlite:x.db"), "sqlite:x.db");
    }
}
