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
//! | `dockhand_claim_duration_seconds` | histogram | `op` | a runner's claim round trip to the store: `claim`, or `finish_and_claim` (finishes written and actions claimed in one round) |
//! | `dockhand_finish_duration_seconds` | histogram | | a run's finish write as the run sees it: from the handler's end to the write acknowledged (batching wait and in-process retries included) |
//! | `dockhand_actions` | gauge | `group`, `status` | actions stored now, by group and status (`pending`, `running`, `failed`) |
//! | `dockhand_actions_due` | gauge | `group` | pending actions already due |
//! | `dockhand_oldest_due_lag_seconds` | gauge | `group` | how late the oldest due pending action is (0 when none is due) |
//! | `dockhand_jobs_processing` | gauge | | jobs in status `processing` |
//! | `dockhand_batches_open` | gauge | | batch parents not final |
//! | `dockhand_item_claims_held` | gauge | | item claims held (status `claimed`) |
//!
//! Histograms are in seconds with the buckets [`crate::prometheus::BUCKETS`] (1 ms to 10 min).
//! `dockhand_action_lag_seconds` is the queue's lag: for an action due when it was enqueued,
//! the time from enqueue to start. The gauges are read from the database by
//! [`crate::prometheus::spawn_gauges`] (every 15 s in `dockhand run --metrics-bind` and
//! `dockhand ui`): they describe the whole database, so several processes export the same
//! values (aggregate with `max`). `group` is empty for actions without a group.
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
/// Histogram: a runner's claim round trip to the store, label `op` (`claim`,
/// `finish_and_claim`).
pub const CLAIM_DURATION: &str = "dockhand_claim_duration_seconds";
/// Histogram: a run's finish write from the handler's end to its acknowledgement.
pub const FINISH_DURATION: &str = "dockhand_finish_duration_seconds";
/// Gauge: actions stored now, labels `group` and `status` (pending, running, failed).
pub const ACTIONS: &str = "dockhand_actions";
/// Gauge: pending actions already due, label `group`.
pub const ACTIONS_DUE: &str = "dockhand_actions_due";
/// Gauge: seconds the oldest due pending action of a group is late, label `group`.
pub const OLDEST_DUE_LAG: &str = "dockhand_oldest_due_lag_seconds";
/// Gauge: jobs in status `processing`.
pub const JOBS_PROCESSING: &str = "dockhand_jobs_processing";
/// Gauge: batch parents not final.
pub const BATCHES_OPEN: &str = "dockhand_batches_open";
/// Gauge: item claims held.
pub const CLAIMS_HELD: &str = "dockhand_item_claims_held";

/// Span name for one action run.
pub const SPAN_RUN: &str = "dockhand.action.run";
/// Span name for one store call.
pub const SPAN_STORE: &str = "dockhand.store";
/// Span name for one maintenance task tick.
pub const SPAN_MAINTENANCE: &str = "dockhand.maintenance";

/// Log target of the dashboard's audit events (one per operator POST).
pub const UI_AUDIT_TARGET: &str = "dockhand::ui::audit";
