//! Telemetry names: every metric and span name dockhand emits is a constant here.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `dockhand_actions_enqueued_total` | counter | `hook` | actions inserted |
//! | `dockhand_actions_claimed_total` | counter | | actions claimed by a runner |
//! | `dockhand_actions_completed_total` | counter | `hook` | runs that completed |
//! | `dockhand_actions_failed_total` | counter | `hook` | runs that ended failed |
//! | `dockhand_actions_retried_total` | counter | `hook` | runs that will be retried |
//! | `dockhand_actions_snoozed_total` | counter | `hook` | runs that snoozed |
//! | `dockhand_actions_lease_lost_total` | counter | `hook` | late finishes fenced out |
//! | `dockhand_run_duration_seconds` | histogram | `hook` | handler run time |
//! | `dockhand_action_lag_seconds` | histogram | `hook` | start time minus scheduled time |
//! | `dockhand_reaped_total` | counter | `outcome` | expired leases requeued/failed |
//! | `dockhand_store_retries_total` | counter | `op` | transient store errors retried in-process |
//! | `dockhand_store_deadlock_retries_total` | counter | `backend`, `op` | store transactions re-run whole after a deadlock, lock wait timeout or serialization failure (MySQL: every multi-statement write), or a completion handler's transient error (all backends) |
//!
//! Spans: `dockhand.action.run` (fields `action_id`, `hook`, `attempt`), `dockhand.store`
//! (field `op`), `dockhand.maintenance` (field `task`).
//!
//! Log targets: `dockhand::ui::audit` ([`UI_AUDIT_TARGET`]): one `info` event per operator
//! action in the dashboard (`ui` feature), with fields `user`, `access`, `remote`, `op`,
//! `ids`, `dry_run`, `count`, `changed` and `skipped`.

/// Counter: actions inserted.
pub const ENQUEUED: &str = "dockhand_actions_enqueued_total";
/// Counter: actions claimed.
pub const CLAIMED: &str = "dockhand_actions_claimed_total";
/// Counter: completed runs.
pub const COMPLETED: &str = "dockhand_actions_completed_total";
/// Counter: failed runs (final).
pub const FAILED: &str = "dockhand_actions_failed_total";
/// Counter: retried runs.
pub const RETRIED: &str = "dockhand_actions_retried_total";
/// Counter: snoozed runs.
pub const SNOOZED: &str = "dockhand_actions_snoozed_total";
/// Counter: finishes refused because the lease was lost.
pub const LEASE_LOST: &str = "dockhand_actions_lease_lost_total";
/// Histogram: handler run time in seconds.
pub const RUN_DURATION: &str = "dockhand_run_duration_seconds";
/// Histogram: seconds between scheduled time and start.
pub const LAG: &str = "dockhand_action_lag_seconds";
/// Counter: expired leases handled by the reaper.
pub const REAPED: &str = "dockhand_reaped_total";
/// Counter: transient store errors retried in-process.
pub const STORE_RETRIES: &str = "dockhand_store_retries_total";
/// Counter: store transactions re-run inside the store after a deadlock, lock wait timeout or
/// serialization failure, or a completion handler's transient error.
pub const STORE_DEADLOCK_RETRIES: &str = "dockhand_store_deadlock_retries_total";

/// Span name for one action run.
pub const SPAN_RUN: &str = "dockhand.action.run";
/// Span name for one store call.
pub const SPAN_STORE: &str = "dockhand.store";
/// Span name for one maintenance task tick.
pub const SPAN_MAINTENANCE: &str = "dockhand.maintenance";

/// Log target of the dashboard's audit events (one per operator POST).
pub const UI_AUDIT_TARGET: &str = "dockhand::ui::audit";
