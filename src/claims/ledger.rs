//! The shipped completion handler (C8): a tracked-items ledger of (namespace, item id,
//! revision, last job), written in the same transaction that completes the claim.
//!
//! Completion config payload: `{"namespace": "feed", "revision": 3}` (`revision` defaults to 1).

use super::{
    CompletionContext, CompletionError, CompletionHandler, CompletionResult, CompletionTx,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// The id the tracked-items handler is registered under.
pub const TRACKED_ITEMS: &str = "dockhand.tracked_items";

/// One ledger row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackedItem {
    /// Ledger namespace.
    pub namespace: String,
    /// The item id.
    pub item_id: String,
    /// Revision recorded.
    pub revision: i64,
    /// The job that completed it.
    pub last_job: Option<i64>,
    /// When.
    pub updated_at: DateTime<Utc>,
}

/// The tracked-items completion handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackedItems;

#[async_trait]
impl CompletionHandler for TrackedItems {
    async fn complete(&self, tx: CompletionTx<'_>, ctx: &CompletionContext) -> CompletionResult {
        let namespace = ctx
            .payload
            .get("namespace")
            .and_then(|v| v.as_str())
            .ok_or("tracked-items payload needs a string `namespace`")?;
        let revision = match ctx.payload.get("revision") {
            None | Some(serde_json::Value::Null) => 1,
            Some(v) => v
                .as_i64()
                .ok_or("tracked-items `revision` must be an integer")?,
        };
        let row = TrackedItem {
            namespace: namespace.to_string(),
            item_id: ctx.identity.item_id.clone(),
            revision,
            last_job: ctx.job_id,
            updated_at: ctx.now,
        };
        let r = match tx {
            CompletionTx::Sqlite(conn) => crate::store::sqlite::ledger::upsert(conn, &row).await,
            CompletionTx::Postgres(conn) => {
                crate::store::postgres::ledger::upsert(conn, &row).await
            }
            CompletionTx::MySql(conn) => crate::store::mysql::ledger::upsert(conn, &row).await,
        };
        // A deadlock or lost connection stays transient: the store re-runs the transaction.
        r.map_err(CompletionError::from)
    }
}
