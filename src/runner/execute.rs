//! One run of one claimed action: find the handler, run it under its timeout in its own task
//! (so a panic is caught), turn the result into a [`Finish`], and write it owner-guarded.

use super::Runner;
use crate::handler::{ActionContext, HandlerError, RunControl};
use crate::store::{ClaimedAction, Finish, FinishResult};
use crate::telemetry;
use backon::{ExponentialBuilder, Retryable};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Aborts the handler task when the run is dropped (shutdown abort, timeout).
struct AbortOnDrop(tokio::task::JoinHandle<crate::handler::HandlerResult>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a run ended before it is mapped to a store write.
#[derive(Debug)]
pub(crate) enum RunEnd {
    Ok,
    Err(HandlerError),
    Panicked(String),
    TimedOut(Duration),
    UnknownHook,
}

/// The run a [`RunEnd`] belongs to, as [`finish_for`] needs it.
pub(crate) struct RunOf<'a> {
    pub(crate) id: i64,
    pub(crate) hook: &'a str,
    pub(crate) attempt: i32,
    pub(crate) max_attempts: i32,
}

/// Maps a run's end to the write that records it (Q5): the runner's rule, also used by a
/// chunk for the children it runs itself.
pub(crate) fn finish_for(
    end: RunEnd,
    run: RunOf<'_>,
    backoff: &crate::backoff::Backoff,
    now: chrono::DateTime<chrono::Utc>,
) -> Finish {
    let retry_or_fail = |error: String| {
        if run.attempt >= run.max_attempts {
            Finish::Fail {
                error: format!("{error} (attempt {} of {})", run.attempt, run.max_attempts),
            }
        } else {
            Finish::Retry {
                at: now + backoff.delay(run.attempt),
                error,
            }
        }
    };
    match end {
        RunEnd::Ok => Finish::Complete,
        RunEnd::Err(HandlerError::Retryable(e)) => retry_or_fail(e),
        RunEnd::Err(HandlerError::Fatal(e)) => Finish::Fail { error: e },
        RunEnd::Err(HandlerError::Snooze(d)) => Finish::Snooze {
            at: now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX),
        },
        RunEnd::Panicked(msg) => retry_or_fail(format!("handler panicked: {msg}")),
        RunEnd::TimedOut(limit) => retry_or_fail(format!("timed out after {limit:?}")),
        RunEnd::UnknownHook => Finish::Fail {
            error: crate::Error::UnknownHook {
                hook: run.hook.to_string(),
                action_id: run.id,
            }
            .to_string(),
        },
    }
}

/// How a finished handler task ended: its result, or why it has none (panic, cancel).
pub(crate) fn task_end(
    joined: Result<crate::handler::HandlerResult, tokio::task::JoinError>,
) -> RunEnd {
    match joined {
        Ok(Ok(())) => RunEnd::Ok,
        Ok(Err(e)) => RunEnd::Err(e),
        Err(join) if join.is_panic() => {
            let payload = join.into_panic();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            RunEnd::Panicked(msg)
        }
        Err(_) => RunEnd::Panicked("handler task was cancelled".into()),
    }
}

impl Runner {
    /// Runs one claimed action to its finish write. Never panics; errors are logged.
    /// `acks`: the batched acknowledgement writer, when running as a pool; `None` writes
    /// directly (the inline testing helpers). `slot`: the run's concurrency permit, given back
    /// as soon as the handler has ended, so the next claim overlaps this run's finish write
    /// (the lease stays heartbeated until the write is done).
    pub(crate) async fn execute(
        &self,
        action: ClaimedAction,
        acks: Option<&super::acks::AckSender>,
        slot: Option<super::held::RunSlot>,
    ) -> Option<FinishResult> {
        let span = tracing::info_span!(
            "dockhand.action.run",
            action_id = action.id,
            hook = %action.hook,
            attempt = action.attempt
        );
        async move {
            let lag = (self.clock.now() - action.scheduled_at)
                .num_milliseconds()
                .max(0) as f64
                / 1000.0;
            metrics::histogram!(telemetry::LAG, "hook" => action.hook.clone()).record(lag);
            let started = Instant::now();
            let control = RunControl::new(slot).with_runner(Arc::clone(&self.facts));
            let end = self.run_handler(&action, &control).await;
            control.release_slot();
            metrics::histogram!(telemetry::RUN_DURATION, "hook" => action.hook.clone())
                .record(started.elapsed().as_secs_f64());
            if control.is_settled() {
                // The handler's own committed transaction completed the action (a step that
                // finished its job through the bridge): nothing is left to write, whatever
                // happened to the handler after that commit.
                metrics::counter!(telemetry::COMPLETED, "hook" => action.hook.clone()).increment(1);
                return Some(FinishResult::Applied);
            }
            let outcome = self.outcome(&action, end);
            // A step action failed for good leaves its job's finish action in the same
            // store write (jobs::finish), so nothing has to follow it up here.
            self.finish(&action, &outcome, acks).await
        }
        .instrument(span)
        .await
    }

    fn context(&self, action: &ClaimedAction, control: &RunControl) -> ActionContext {
        ActionContext {
            action_id: action.id,
            hook: action.hook.clone(),
            args: action.args.clone(),
            group: action.group.clone(),
            attempt: action.attempt,
            max_attempts: action.max_attempts,
            scheduled_at: action.scheduled_at,
            token: action.token,
            queue: self.queue.clone(),
            run: control.clone(),
        }
    }

    async fn run_handler(&self, action: &ClaimedAction, control: &RunControl) -> RunEnd {
        let Some(handler) = self.registry.get(&action.hook) else {
            return RunEnd::UnknownHook;
        };
        let mut task = AbortOnDrop(tokio::spawn(handler(self.context(action, control))));
        let timeout = action
            .timeout_ms
            .map(|ms| Duration::from_millis(ms.max(0) as u64))
            .or(self.config.default_timeout);
        let joined = match timeout {
            Some(limit) => match tokio::time::timeout(limit, &mut task.0).await {
                Ok(j) => j,
                Err(_) => return RunEnd::TimedOut(limit),
            },
            None => (&mut task.0).await,
        };
        task_end(joined)
    }

    /// Maps a run's end to the write that records it (Q5).
    pub(crate) fn outcome(&self, action: &ClaimedAction, end: RunEnd) -> Finish {
        finish_for(
            end,
            RunOf {
                id: action.id,
                hook: &action.hook,
                attempt: action.attempt,
                max_attempts: action.max_attempts,
            },
            &self.config.backoff,
            self.clock.now(),
        )
    }

    /// Writes the finish, retrying transient database errors a few times in-process.
    async fn finish(
        &self,
        action: &ClaimedAction,
        outcome: &Finish,
        acks: Option<&super::acks::AckSender>,
    ) -> Option<FinishResult> {
        crate::failpoint::crash("runner.before_finish");
        let lease = action.lease();
        let write = || async {
            match acks {
                Some(tx) => super::acks::ack(tx, lease, outcome).await,
                None => self.store.finish(lease, outcome, self.clock.now()).await,
            }
        };
        let started = Instant::now();
        let result = write
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(20))
                    .with_max_times(4),
            )
            .when(|e: &crate::Error| e.is_transient())
            .notify(|e, _| {
                metrics::counter!(telemetry::STORE_RETRIES, "op" => "finish").increment(1);
                tracing::debug!(error = %e, "retrying finish");
            })
            .await;
        metrics::histogram!(telemetry::FINISH_DURATION).record(started.elapsed().as_secs_f64());
        let hook = action.hook.clone();
        match result {
            Ok(FinishResult::Applied) => {
                let name = match outcome {
                    Finish::Complete => telemetry::COMPLETED,
                    Finish::Fail { error } => {
                        tracing::warn!(error = %error, "action failed");
                        telemetry::FAILED
                    }
                    Finish::Retry { .. } => telemetry::RETRIED,
                    Finish::Snooze { .. } | Finish::Release => telemetry::SNOOZED,
                };
                metrics::counter!(name, "hook" => hook).increment(1);
                Some(FinishResult::Applied)
            }
            Ok(FinishResult::LeaseLost) => {
                metrics::counter!(telemetry::LEASE_LOST, "hook" => hook).increment(1);
                tracing::warn!(
                    token = lease.token,
                    "lease lost: result dropped, a newer attempt owns the action"
                );
                Some(FinishResult::LeaseLost)
            }
            Err(e) => {
                tracing::error!(error = %e, "could not record the result; the lease will expire and the reaper retries");
                None
            }
        }
    }
}
