//! Handlers: the user code an action's hook names, and how its outcome is reported (Q5).

use crate::queue::Queue;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

/// What a handler sees of the action it runs.
#[derive(Debug, Clone)]
pub struct ActionContext {
    /// The action's id.
    pub action_id: i64,
    /// Its hook.
    pub hook: String,
    /// Its JSON args.
    pub args: Value,
    /// Its group.
    pub group: Option<String>,
    /// This attempt's number (1 for the first run).
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// When it was due.
    pub scheduled_at: DateTime<Utc>,
    /// The fencing token of this run's lease.
    pub token: i64,
    /// The queue, to enqueue follow-up work.
    pub queue: Queue,
    /// The runner's side of this run: whether the handler's own store write completed the
    /// action, and its concurrency slot (see [`RunControl`]).
    pub(crate) run: RunControl,
}

/// What a handler can tell the runner about its run, beside its result. Cloned into the
/// handler; the runner reads it after the run.
#[derive(Clone, Default)]
pub(crate) struct RunControl {
    settled: Arc<std::sync::atomic::AtomicBool>,
    slot: Arc<std::sync::Mutex<Option<crate::runner::held::RunSlot>>>,
    runner: Option<Arc<RunnerFacts>>,
    finishes: Option<Arc<crate::batch::in_chunk::FinishQueue>>,
}

/// What a run's handler may know of the runner running it: enough to lease, heartbeat and
/// finish actions it runs itself as the runner would (a chunk running its children,
/// [`crate::Pipeline::children_in_chunk`]).
#[derive(Debug, Clone)]
pub(crate) struct RunnerFacts {
    /// The runner's owner id (stamped on leases; its heartbeat goes by it).
    pub(crate) owner: String,
    /// How long a lease lasts without a heartbeat.
    pub(crate) lease: chrono::Duration,
    /// How often leases are extended.
    pub(crate) heartbeat_interval: std::time::Duration,
    /// A run's time limit when its action has none.
    pub(crate) default_timeout: Option<std::time::Duration>,
    /// Retry delays.
    pub(crate) backoff: crate::backoff::Backoff,
}

impl std::fmt::Debug for RunControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunControl")
            .field("settled", &self.is_settled())
            .finish_non_exhaustive()
    }
}

impl RunControl {
    /// A run holding `slot` (none for the inline testing helpers).
    pub(crate) fn new(slot: Option<crate::runner::held::RunSlot>) -> Self {
        Self {
            settled: Arc::default(),
            slot: Arc::new(std::sync::Mutex::new(slot)),
            runner: None,
            finishes: None,
        }
    }

    /// This control, with the run's bridge finish written through `queue` (a child run by its
    /// chunk) instead of the engine's group commit.
    pub(crate) fn with_finish_queue(
        mut self,
        queue: Arc<crate::batch::in_chunk::FinishQueue>,
    ) -> Self {
        self.finishes = Some(queue);
        self
    }

    /// Where the run's bridge finish goes, when not to the engine's group commit.
    pub(crate) fn finish_queue(&self) -> Option<&Arc<crate::batch::in_chunk::FinishQueue>> {
        self.finishes.as_ref()
    }

    /// This control, telling the handler about the runner running it.
    pub(crate) fn with_runner(mut self, facts: Arc<RunnerFacts>) -> Self {
        self.runner = Some(facts);
        self
    }

    /// The runner running this run (none for the inline testing helpers).
    pub(crate) fn runner(&self) -> Option<&Arc<RunnerFacts>> {
        self.runner.as_ref()
    }

    /// The action was completed in a committed transaction of the handler's (a pipeline step
    /// finishing its job acknowledges its step action in the bridge's transaction): the runner
    /// writes no acknowledgement of its own.
    pub(crate) fn mark_settled(&self) {
        self.settled
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Self::mark_settled`] was called.
    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Frees the run's concurrency slot now: the user code is done and what is left is the
    /// handler's own bookkeeping write (a step's bridge), which then overlaps the next run as
    /// a plain action's acknowledgement does. Idempotent; the runner calls it when the
    /// handler ends.
    pub(crate) fn release_slot(&self) {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(slot);
    }
}

/// How a handler run can end other than success.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HandlerError {
    /// Try again after the backoff delay, until attempts run out.
    #[error("{0}")]
    Retryable(String),
    /// Fail now, whatever attempts are left.
    #[error("fatal: {0}")]
    Fatal(String),
    /// Run again after this delay without using an attempt.
    #[error("snoozed for {0:?}")]
    Snooze(std::time::Duration),
}

impl HandlerError {
    /// A retryable error from anything displayable.
    pub fn retry(e: impl std::fmt::Display) -> Self {
        HandlerError::Retryable(e.to_string())
    }
    /// A fatal error from anything displayable.
    pub fn fatal(e: impl std::fmt::Display) -> Self {
        HandlerError::Fatal(e.to_string())
    }
    /// Snooze for `d`.
    pub fn snooze(d: std::time::Duration) -> Self {
        HandlerError::Snooze(d)
    }
}

/// What a handler returns.
pub type HandlerResult = Result<(), HandlerError>;

/// A type-erased handler.
pub(crate) type BoxHandler =
    Arc<dyn Fn(ActionContext) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// Hook name → handler.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    handlers: HashMap<String, BoxHandler>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.handlers.keys()).finish()
    }
}

impl Registry {
    pub(crate) fn insert<F, Fut>(&mut self, hook: impl Into<String>, f: F)
    where
        F: Fn(ActionContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.handlers
            .insert(hook.into(), Arc::new(move |ctx| Box::pin(f(ctx))));
    }

    pub(crate) fn get(&self, hook: &str) -> Option<&BoxHandler> {
        self.handlers.get(hook)
    }

    /// The registered hooks, sorted.
    pub(crate) fn hook_list(&self) -> Vec<String> {
        let mut h: Vec<String> = self.handlers.keys().cloned().collect();
        h.sort();
        h
    }
}
