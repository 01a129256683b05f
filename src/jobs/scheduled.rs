//! Scheduled pipelines: a schedule whose occurrences start a job of a named pipeline
//! ([`crate::ScheduleSpec::pipeline`], `dockhand enqueue --pipeline NAME --cron …`).
//!
//! Owns the occurrence action's hook ([`SCHEDULED_START_HOOK`]), its args and its handler.
//! Each occurrence is one action (unique per occurrence, like every schedule's), routed by the
//! pipeline's group so only a runtime that has the pipeline runs it; its handler starts the job
//! with the idempotency key `schedule:<name>:<occurrence ms>` in one transaction that locks the
//! schedule's row ([`crate::Store::start_scheduled_job`]): at most one job per occurrence,
//! however often the action runs, and with `no_overlap` none while the schedule's previous job
//! is not final (that occurrence is skipped, not postponed).

use super::api::{Jobs, StartOptions};
use super::{JobCreated, ScheduleGuard};
use crate::handler::{ActionContext, HandlerError, HandlerResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Hook of the actions a pipeline schedule's occurrences enqueue.
pub const SCHEDULED_START_HOOK: &str = "dockhand.job.scheduled_start";

/// Args of a [`SCHEDULED_START_HOOK`] action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledStartArgs {
    /// The pipeline to start.
    pub pipeline: String,
    /// The job's input packet.
    pub input: Value,
    /// The schedule's name (set when the schedule is prepared).
    #[serde(default)]
    pub schedule: String,
    /// Skip an occurrence while the schedule's previous job is not final.
    #[serde(default)]
    pub no_overlap: bool,
}

/// The idempotency key of the job started for the occurrence of `schedule` at `at_ms`.
pub fn occurrence_key(schedule: &str, at_ms: i64) -> String {
    format!("schedule:{schedule}:{at_ms}")
}

/// Runs one occurrence: starts its job unless it exists, the schedule is gone, or (no
/// overlap) the schedule's previous job is still live. Store errors are retried with backoff.
pub(crate) async fn run_scheduled_start(jobs: Jobs, ctx: ActionContext) -> HandlerResult {
    let args: ScheduledStartArgs = serde_json::from_value(ctx.args.clone()).map_err(|e| {
        HandlerError::fatal(format!(
            "action {}: a scheduled start needs {{\"pipeline\": str, \"input\": any, \
             \"schedule\": str, \"no_overlap\": bool}}: {e}",
            ctx.action_id
        ))
    })?;
    if args.schedule.is_empty() {
        return Err(HandlerError::fatal(format!(
            "action {}: a scheduled start without its schedule's name",
            ctx.action_id
        )));
    }
    let key = occurrence_key(&args.schedule, ctx.scheduled_at.timestamp_millis());
    let now = jobs.engine().clock.now();
    let job = jobs
        .new_job(
            &args.pipeline,
            args.input,
            &StartOptions::idempotency_key(key),
            now,
        )
        .await
        .map_err(|e| match e {
            // The pipeline is routed here only when this runtime has it; an invalid key or
            // input cannot get better by retrying.
            crate::Error::InvalidInput { .. } => HandlerError::fatal(e),
            e => HandlerError::retry(e),
        })?;
    let guard = ScheduleGuard {
        schedule: &args.schedule,
        no_overlap: args.no_overlap,
    };
    let created = jobs
        .engine()
        .store
        .start_scheduled_job(&job, guard, now)
        .await
        .map_err(HandlerError::retry)?;
    let (schedule, occurrence) = (&args.schedule, ctx.scheduled_at);
    match created {
        JobCreated::New(id) => {
            tracing::info!(schedule, %occurrence, job_id = id, "scheduled pipeline: job started")
        }
        JobCreated::Existing(id) => tracing::debug!(
            schedule,
            %occurrence,
            job_id = id,
            "scheduled pipeline: the occurrence's job exists"
        ),
        JobCreated::Overlapping(live) => tracing::info!(
            schedule,
            %occurrence,
            live_job = live,
            "scheduled pipeline: occurrence skipped, the previous job is not final (no overlap)"
        ),
        JobCreated::ScheduleGone => tracing::info!(
            schedule,
            %occurrence,
            "scheduled pipeline: the schedule is gone; nothing started"
        ),
        JobCreated::ParentMoved => {}
    }
    Ok(())
}
