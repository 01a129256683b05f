//! PostgreSQL: the tracked-items ledger rows written by the shipped completion handler
//! ([`crate::claims::ledger::TrackedItems`]), on the transaction that completes the claim.

use super::ts;
use crate::claims::ledger::TrackedItem;
use crate::error::{Error, Result};

/// Inserts or updates the ledger row `(namespace, item_id)` on the completing transaction
/// (`revision`, `last_job` and `updated_at` take the new values).
pub async fn upsert(conn: &mut sqlx::PgConnection, row: &TrackedItem) -> Result<()> {
    sqlx::query(
        "INSERT INTO dockhand_tracked_items (namespace, item_id, revision, last_job, updated_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (namespace, item_id) DO UPDATE SET
            revision = excluded.revision, last_job = excluded.last_job,
            updated_at = excluded.updated_at",
    )
    .bind(&row.namespace)
    .bind(&row.item_id)
    .bind(row.revision)
    .bind(row.last_job)
    .bind(ts(row.updated_at))
    .execute(&mut *conn)
    .await
    .map_err(Error::db("tracked items upsert"))?;
    Ok(())
}
