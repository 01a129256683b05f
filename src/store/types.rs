//! The request and result types of [`crate::store::Store`]'s action methods.

use crate::state::ActionStatus;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Embedded SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 or MariaDB 10.6+.
    Mysql,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
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
    /// Claim actions of routed hooks only from some groups (`None`: no routing). A runtime
    /// passes the job engine's hooks and the groups of the pipelines it has, so it never
    /// claims (and fails) a step of a pipeline it lacks.
    pub routing: Option<Routing<'a>>,
}

/// Which groups a runner takes the actions of routed hooks from: an action whose hook is in
/// `hooks` is claimable only when its group is in `groups`; other actions are unaffected.
///
/// The job engine routes its actions by pipeline: step and finish actions carry the group
/// `pipeline:<name>` ([`crate::jobs::StepAction::group_for`]), so several runtimes with
/// different pipeline sets can share one database. A filter on the claim scan, like `hooks`:
/// the claim still walks its (priority, scheduled_at, id) index in order (Q3).
#[derive(Debug, Clone, Copy)]
pub struct Routing<'a> {
    /// The routed hooks.
    pub hooks: &'a [String],
    /// The groups this runner takes routed actions from (empty: none).
    pub groups: &'a [String],
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

impl Lease {
    /// The error of a write refused because this run no longer holds its lease.
    pub fn lost(self) -> crate::Error {
        crate::Error::LeaseLost {
            action_id: self.id,
            token: self.token,
        }
    }
}

/// How a run ended, as written by [`crate::Store::finish`].
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

    /// (event, detail) for the action log when this finish was refused because the lease
    /// with `token` is no longer held.
    pub(crate) fn lease_lost_entry(&self, token: i64) -> (&'static str, String) {
        (
            "lease_lost",
            format!(
                "token {token} tried to record `{}`; the lease is no longer held",
                self.log_entry().0
            ),
        )
    }

    /// (event, detail) of the log row this finish writes; `None` for a completion, whose
    /// `completed` entry is read from the row's `finished_at` (migration 0017).
    pub(crate) fn stored_log_entry(&self) -> Option<(&'static str, Option<String>)> {
        match self {
            Finish::Complete => None,
            other => Some(other.log_entry()),
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

/// What [`crate::Store::finish_and_claim`] did.
#[derive(Debug)]
pub struct FinishAndClaim {
    /// One result per finish, in input order; all of them are written.
    pub finished: Vec<FinishResult>,
    /// The claimed actions in claim order, or why the claim failed. A backend writing both
    /// in one transaction fails the whole call instead, so this is then always `Ok`.
    pub claimed: crate::error::Result<Vec<ClaimedAction>>,
}

/// What the lease reaper did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReapReport {
    /// Expired leases put back to pending (attempt counted).
    pub requeued: u64,
    /// Expired leases with no attempts left, marked failed.
    pub failed: u64,
    /// The ids of the actions marked failed (the jobs of failed step actions follow through
    /// the finish actions enqueued with them, R1).
    pub failed_ids: Vec<i64>,
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

/// What one batch of job retention deleted ([`crate::Store::prune_jobs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobPrune {
    /// Final jobs deleted.
    pub jobs: u64,
    /// Their lifecycle events (delivered ones only: a job with an undelivered event is kept).
    pub events: u64,
    /// Worklist rows of deleted batch parents (finalize deletes them; these are leftovers).
    pub worklist_rows: u64,
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

/// A count that stops at a cap (`n == cap` and `capped` when there are more than `cap` rows), so
/// a dashboard never counts millions of rows to print "100,000+".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Capped {
    /// The count, at most the cap.
    pub n: i64,
    /// Whether the count stopped at the cap.
    pub capped: bool,
}

/// Actions that finished within one time bucket (`Store::throughput`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ThroughputBucket {
    /// Start of the bucket (inclusive).
    pub start: DateTime<Utc>,
    /// Actions that ended complete.
    pub completed: i64,
    /// Actions that ended failed.
    pub failed: i64,
}

/// The database gauges Prometheus exports (`Store::metrics_gauges`), read in one query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MetricsGauges {
    /// Per group with at least one pending, running or failed action, in no set order.
    pub groups: Vec<GroupGauges>,
    /// Jobs in status `processing`.
    pub jobs_processing: i64,
    /// Batch parents not final (`pending`, `processing` or `waiting`).
    pub batches_open: i64,
    /// Item claims in status `claimed`.
    pub claims_held: i64,
}

/// One group's actions in [`MetricsGauges`] (uncapped counts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GroupGauges {
    /// The group; `None` for actions without one.
    pub group: Option<String>,
    /// Pending actions.
    pub pending: i64,
    /// Pending actions due at the time asked.
    pub due: i64,
    /// Running actions.
    pub running: i64,
    /// Failed actions (still stored).
    pub failed: i64,
    /// When the oldest due pending action was due.
    pub oldest_due: Option<DateTime<Utc>>,
}

/// What a bulk operator operation did to the ids it was given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BulkOutcome {
    /// The ids it changed.
    pub changed: Vec<i64>,
    /// The ids it left alone: gone, in a status the operation does not apply to, or (retry) a
    /// unique key another active action holds.
    pub skipped: Vec<i64>,
}
