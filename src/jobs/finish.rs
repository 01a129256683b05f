//! The durable way from a failed step action to its job's final status (J6, R1).
//!
//! When a step action ends `failed` for good — its last attempt failed, a fatal error, or the
//! reaper found its lease expired with no attempt left — its job must follow through the
//! terminal bridge as `failed / retry_exhausted` (or `step_failed` for an error on an earlier
//! attempt). The store writes that failure and, in the same transaction, enqueues the action
//! `dockhand.job.finish {job, step, reason}` built by [`followup`]. Its handler
//! (`Engine::run_job_finish`) calls the bridge; a bridge error retries the action with
//! backoff, so one transient error can no longer leave the job `processing` with no action
//! (the step action is final, so nothing else would move it), and no operator is needed.
//!
//! The finish action is unique per job among active actions (`j:{job}:finish`, inside the
//! job's `j:{job}:` key range, so liveness and `check` see it as the job's scheduler path) and
//! carries the step action's group (`pipeline:<name>`): it is routed like the step (see
//! [`crate::store::Routing`]) to a runtime that has the job's pipeline.

use super::bridge::reason;
use super::engine::Engine;
use super::STEP_HOOK;
use crate::action::PreparedAction;
use crate::handler::{ActionContext, HandlerError, HandlerResult};
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::Arc;

/// The hook of the action that finishes a job whose step action failed for good.
pub const FINISH_HOOK: &str = "dockhand.job.finish";

/// Attempts of a finish action: with the default backoff, about a day of retries.
pub const FINISH_MAX_ATTEMPTS: i32 = 25;

/// An action the store has just marked `failed` for good, as that same write returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAction {
    /// Its hook.
    pub hook: String,
    /// Its args.
    pub args: Value,
    /// Its group.
    pub group: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// The attempt that failed.
    pub attempt: i32,
    /// Its attempt limit.
    pub max_attempts: i32,
}

/// The `dockhand.job.finish` action a failed action leaves behind, when it is a step action
/// with well-formed args (`{"job": int, "step": int}`); `None` otherwise. The reason is
/// `retry_exhausted` when the failed attempt was the last one, else `step_failed` (a fatal
/// error). Store backends enqueue it in the transaction that writes the failure.
pub fn followup(failed: &FailedAction, now: DateTime<Utc>) -> Option<PreparedAction> {
    if failed.hook != STEP_HOOK {
        return None;
    }
    let job = failed.args.get("job")?.as_i64()?;
    let step = failed.args.get("step")?.as_i64()?;
    let why = if failed.attempt >= failed.max_attempts {
        reason::RETRY_EXHAUSTED
    } else {
        reason::STEP_FAILED
    };
    Some(PreparedAction {
        hook: FINISH_HOOK.to_string(),
        args_json: format!(r#"{{"job":{job},"reason":"{why}","step":{step}}}"#),
        group: failed.group.clone(),
        priority: failed.priority,
        scheduled_at: crate::clock::to_millis(now),
        max_attempts: FINISH_MAX_ATTEMPTS,
        timeout_ms: None,
        unique_key: Some(format!("j:{job}:finish")),
        schedule_id: None,
    })
}

/// `{"job", "step", "reason"}` of a finish action.
fn finish_args(ctx: &ActionContext) -> Option<(i64, i64, String)> {
    let job = ctx.args.get("job")?.as_i64()?;
    let step = ctx.args.get("step")?.as_i64()?;
    let why = ctx.args.get("reason")?.as_str()?.to_string();
    Some((job, step, why))
}

impl Engine {
    /// Runs one `dockhand.job.finish` action: finishes the job `failed` with the action's
    /// reason through the bridge, unless it is final already, has moved past the failed
    /// step (an operator retried the step action and it succeeded), or fanned out (its batch
    /// drives it: resumed instead). A bridge error is retryable: the action comes back with
    /// backoff.
    pub(crate) async fn run_job_finish(self: Arc<Self>, ctx: ActionContext) -> HandlerResult {
        let Some((job_id, step, why)) = finish_args(&ctx) else {
            return Err(HandlerError::fatal(format!(
                "action {}: finish actions need {{\"job\": int, \"step\": int, \"reason\": str}}, got {}",
                ctx.action_id, ctx.args
            )));
        };
        let Some(job) = self
            .store
            .get_job(job_id)
            .await
            .map_err(HandlerError::retry)?
        else {
            tracing::debug!(job_id, "finish action for a job that no longer exists");
            return Ok(());
        };
        if job.status.is_final() || i64::from(job.step_index) != step {
            tracing::debug!(
                job_id,
                step,
                status = %job.status,
                "finish action: the job is final or moved on; nothing to do"
            );
            return Ok(());
        }
        // A job that fanned out is driven by its batch (its step's output is the committed
        // worklist): a step action that failed for good after that (its worker died past its
        // last attempt) does not fail it; the batch is resumed instead, as a re-delivery would.
        if self
            .store
            .batch_state(job_id)
            .await
            .map_err(HandlerError::retry)?
            .is_some()
        {
            return self.resume_fanned_out(&job, job.step_index).await;
        }
        tracing::warn!(job_id, step, reason = %why, "step failed for good; failing the job");
        self.bridge(job_id, JobStatus::Failed, Some(&why))
            .await
            .map(|_| ())
            .map_err(HandlerError::retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn failed(hook: &str, args: Value, attempt: i32) -> FailedAction {
        FailedAction {
            hook: hook.into(),
            args,
            group: Some("pipeline:p".into()),
            priority: 7,
            attempt,
            max_attempts: 3,
        }
    }

    #[test]
    fn a_failed_step_leaves_a_finish_action_with_its_reason() {
        let now = Utc::now();
        let a = followup(&failed(STEP_HOOK, json!({"job": 5, "step": 2}), 3), now).unwrap();
        assert_eq!(a.hook, FINISH_HOOK);
        assert_eq!(
            serde_json::from_str::<Value>(&a.args_json).unwrap(),
            json!({"job": 5, "step": 2, "reason": "retry_exhausted"})
        );
        assert_eq!(a.unique_key.as_deref(), Some("j:5:finish"));
        assert_eq!(a.group.as_deref(), Some("pipeline:p"));
        assert_eq!(a.priority, 7);
        let fatal = followup(&failed(STEP_HOOK, json!({"job": 5, "step": 2}), 1), now).unwrap();
        assert!(fatal.args_json.contains("step_failed"));
    }

    #[test]
    fn other_actions_and_malformed_args_leave_nothing() {
        let now = Utc::now();
        assert!(followup(&failed("send_mail", json!({"job": 5, "step": 0}), 3), now).is_none());
        assert!(followup(&failed(STEP_HOOK, json!({"job": "x"}), 3), now).is_none());
        assert!(followup(&failed(STEP_HOOK, json!([]), 3), now).is_none());
    }
}
