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
    /// Set when the handler's own store transaction completed this action (a pipeline step
    /// finishing its job acknowledges its step action in the bridge's transaction): the runner
    /// then writes no acknowledgement of its own.
    pub(crate) settled: Settled,
}

/// Whether a run's action was completed by its handler's own store write
/// ([`ActionContext::settled`]). Cloned into the handler; the runner reads it after the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settled(Arc<std::sync::atomic::AtomicBool>);

impl Settled {
    /// The action was completed in a committed transaction of the handler's.
    pub(crate) fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Self::mark`] was called.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
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
