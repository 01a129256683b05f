//! sqlite: the tracked-items ledger rows written by the shipped completion handler.

use super::ms;
use crate::claims::ledger::TrackedItem;
use crate::error::{Error, Result};

/// Inserts or updates the ledger row on the completing transaction.
pub async fn upsert(conn: &mut sqlx::SqliteConnection, row: &TrackedItem) -> Result<()> {
    sqlx::query(
        "INSERT INTO dockhand_tracked_items (namespace, item_id, revision, last_job, updated_at)
         VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (namespace, item_id) DO UPDATE SET
            revision = excluded.revision, last_job = excluded.last_job,
            updated_at = excluded.updated_at",
    )
    .bind(&row.namespace)
    .bind(&row.item_id)
    .bind(row.revision)
    .bind(row.last_job)
    .bind(ms(row.updated_at))
    .execute(&mut *conn)
    .await
    .map_err(Error::db("tracked items upsert"))?;
    Ok(())
}
