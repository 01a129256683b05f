//! Completion handlers (C3, C4, C8): user code that runs inside the transaction completing a
//! claim, what it is told ([`CompletionContext`]), the transaction it writes on
//! ([`CompletionTx`]), how it fails ([`CompletionError`]: transient or permanent), the registry
//! of handlers by id, and `run_in_tx`, the one place the stores call a handler (a panic is
//! caught and becomes a permanent failure; a transient failure becomes
//! [`Error::TransientCompletion`], on which the store re-runs its whole transaction).

use super::{CompletionConfig, Identity};
use crate::error::{Error, Result};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The open transaction a completion handler writes in, on whichever backend is in use.
#[non_exhaustive]
pub enum CompletionTx<'a> {
    /// SQLite.
    Sqlite(&'a mut sqlx::SqliteConnection),
    /// PostgreSQL.
    Postgres(&'a mut sqlx::PgConnection),
    /// MySQL / MariaDB.
    MySql(&'a mut sqlx::MySqlConnection),
}

/// What a completion handler is told about the claim it completes.
#[derive(Debug, Clone)]
pub struct CompletionContext {
    /// The item.
    pub identity: Identity,
    /// The completing token.
    pub token: String,
    /// The owning job.
    pub job_id: Option<i64>,
    /// The payload from the completion config.
    pub payload: Value,
    /// The completion time.
    pub now: DateTime<Utc>,
}

/// Why a completion handler did not complete its claim. Either way its writes and the claim's
/// transition roll back together.
///
/// - [`CompletionError::Transient`]: a condition a new attempt may clear (deadlock,
///   serialization failure, lost connection, busy database). The store re-runs its whole
///   transaction, handler included, a bounded number of times; if it still fails, the call
///   returns [`Error::TransientCompletion`] (a transient error), never a final verdict on the
///   item: the terminal bridge does not turn it into `item_claim_completion_failed`.
/// - [`CompletionError::Permanent`]: the handler refuses the item; retrying will not help.
///
/// `?` works on the crate's [`Error`] and on [`sqlx::Error`] (classified by
/// [`Error::is_transient`]) and on `String` / `&str` messages (permanent), so a handler written
/// for the former `Result<(), String>` only changes its signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    /// A retry of the whole transaction may succeed.
    #[error("transient: {0}")]
    Transient(String),
    /// Retrying will not help.
    #[error("{0}")]
    Permanent(String),
}

impl CompletionError {
    /// A transient failure.
    pub fn transient(message: impl std::fmt::Display) -> Self {
        CompletionError::Transient(message.to_string())
    }

    /// A permanent failure.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        CompletionError::Permanent(message.to_string())
    }

    /// True for [`CompletionError::Transient`].
    pub fn is_transient(&self) -> bool {
        matches!(self, CompletionError::Transient(_))
    }
}

impl From<String> for CompletionError {
    fn from(message: String) -> Self {
        CompletionError::Permanent(message)
    }
}

impl From<&str> for CompletionError {
    fn from(message: &str) -> Self {
        CompletionError::Permanent(message.to_string())
    }
}

impl From<Error> for CompletionError {
    fn from(e: Error) -> Self {
        if e.is_transient() {
            CompletionError::Transient(e.to_string())
        } else {
            CompletionError::Permanent(e.to_string())
        }
    }
}

impl From<sqlx::Error> for CompletionError {
    fn from(e: sqlx::Error) -> Self {
        Error::db("completion handler")(e).into()
    }
}

/// What a completion handler returns.
pub type CompletionResult = std::result::Result<(), CompletionError>;

/// User code run inside the transaction that completes a claim. Its writes and the claim's
/// transition commit or roll back together. Return `Err` to roll both back: a
/// [`CompletionError::Transient`] one makes the store run the whole transaction again. A panic
/// is caught and treated as a permanent failure.
#[async_trait]
pub trait CompletionHandler: Send + Sync + 'static {
    /// Writes the side effect on `tx`.
    async fn complete(&self, tx: CompletionTx<'_>, ctx: &CompletionContext) -> CompletionResult;
}

/// Runs `handler` on the open transaction `tx`. `Ok(Ok(()))`: it succeeded. `Ok(Err(message))`:
/// it failed for good (or panicked); the message names the item, and the caller rolls back and
/// reports it. `Err(`[`Error::TransientCompletion`]`)`: it failed transiently; the caller rolls
/// back and returns the error, on which the store's transaction retry runs it again.
pub(crate) async fn run_in_tx(
    handler: &dyn CompletionHandler,
    tx: CompletionTx<'_>,
    ctx: &CompletionContext,
) -> Result<std::result::Result<(), String>> {
    let item = &ctx.identity.item_id;
    let ran = std::panic::AssertUnwindSafe(handler.complete(tx, ctx))
        .catch_unwind()
        .await;
    let failed = match ran {
        Ok(Ok(())) => return Ok(Ok(())),
        Ok(Err(e)) => e,
        Err(panic) => CompletionError::Permanent(format!(
            "the completion handler panicked: {}",
            panic_message(panic.as_ref())
        )),
    };
    match failed {
        CompletionError::Transient(message) => Err(Error::TransientCompletion {
            item_id: item.clone(),
            job_id: ctx.job_id,
            message,
        }),
        CompletionError::Permanent(message) => {
            Ok(Err(format!("handler failed for item {item}: {message}")))
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Completion handlers by id.
#[derive(Clone, Default)]
pub struct CompletionRegistry {
    handlers: HashMap<String, Arc<dyn CompletionHandler>>,
}

impl std::fmt::Debug for CompletionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.handlers.keys()).finish()
    }
}

impl CompletionRegistry {
    /// A registry holding the shipped tracked-items handler.
    pub fn with_builtins() -> Self {
        let mut r = Self::default();
        r.insert(
            super::ledger::TRACKED_ITEMS,
            Arc::new(super::ledger::TrackedItems),
        );
        r
    }

    /// Registers `handler` under `id`.
    pub fn insert(&mut self, id: impl Into<String>, handler: Arc<dyn CompletionHandler>) {
        self.handlers.insert(id.into(), handler);
    }

    /// The handler for `id`.
    pub fn get(&self, id: &str) -> Option<Arc<dyn CompletionHandler>> {
        self.handlers.get(id).cloned()
    }

    /// Resolves a config's handler: `Ok(None)` when it names none, an error when it names one
    /// that is not registered.
    pub fn resolve(&self, config: &CompletionConfig) -> Result<Option<Arc<dyn CompletionHandler>>> {
        match &config.handler {
            None => Ok(None),
            Some(id) => self.get(id).map(Some).ok_or_else(|| {
                Error::invalid(
                    "completion handler",
                    format!("no handler registered as `{id}`"),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_kind() {
        let e: CompletionError = "refused".into();
        assert_eq!(e, CompletionError::Permanent("refused".into()));
        let e: CompletionError = String::from("refused").into();
        assert!(!e.is_transient());
        let io = sqlx::Error::Io(std::io::Error::other("connection reset"));
        assert!(CompletionError::from(io).is_transient());
        let bad = Error::invalid("payload", "no namespace");
        assert!(!CompletionError::from(bad).is_transient());
        let pool = Error::db("ledger")(sqlx::Error::PoolTimedOut);
        assert!(CompletionError::from(pool).is_transient());
    }
}
