//! MySQL: the tracked-items ledger rows written by the shipped completion handler (C8).
//!
//! The key is `item_hash`, the sha256 (hex) of the length-prefixed namespace and item id, so
//! item ids of any length are keyed exactly (no prefix index, no trailing-space padding); the
//! upsert only overwrites a row whose stored parts equal the new ones, and a row left with other
//! parts (a hash collision) is reported as an error instead of being merged.

use super::ms;
use crate::claims::hex;
use crate::claims::ledger::TrackedItem;
use crate::error::{Error, Result};
use sha2::{Digest, Sha256};

/// The ledger key of (`namespace`, `item_id`): sha256 over the length-prefixed parts, as hex.
pub(super) fn item_hash(namespace: &str, item_id: &str) -> String {
    let mut h = Sha256::new();
    for part in [namespace, item_id] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

/// Inserts or updates the ledger row on the completing transaction.
pub async fn upsert(conn: &mut sqlx::MySqlConnection, row: &TrackedItem) -> Result<()> {
    let op = "tracked items upsert";
    let hash = item_hash(&row.namespace, &row.item_id);
    sqlx::query(
        "INSERT INTO dockhand_tracked_items
            (item_hash, namespace, item_id, revision, last_job, updated_at)
         VALUES (?, ?, ?, ?, ?, ?)
         ON DUPLICATE KEY UPDATE
            revision = IF(namespace = VALUES(namespace) AND item_id = VALUES(item_id),
                          VALUES(revision), revision),
            last_job = IF(namespace = VALUES(namespace) AND item_id = VALUES(item_id),
                          VALUES(last_job), last_job),
            updated_at = IF(namespace = VALUES(namespace) AND item_id = VALUES(item_id),
                            VALUES(updated_at), updated_at)",
    )
    .bind(&hash)
    .bind(&row.namespace)
    .bind(&row.item_id)
    .bind(row.revision)
    .bind(row.last_job)
    .bind(ms(row.updated_at))
    .execute(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let stored: Option<i64> = sqlx::query_scalar(
        "SELECT revision FROM dockhand_tracked_items
         WHERE item_hash = ? AND namespace = ? AND item_id = ?",
    )
    .bind(&hash)
    .bind(&row.namespace)
    .bind(&row.item_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    if stored.is_none() {
        return Err(Error::Corrupt {
            what: "tracked item",
            id: 0,
            message: format!("ledger key {hash} is stored for a different namespace or item"),
        });
    }
    Ok(())
}
