//! SQLite: content-addressed packets (a step's output bodies, stored once per hash).

use super::{ms, SqliteStore};
use crate::error::{Error, Result};
use crate::jobs::packets::EncodedPacket;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

pub(super) async fn put_packets(
    store: &SqliteStore,
    packets: &[EncodedPacket],
    now: DateTime<Utc>,
) -> Result<()> {
    if packets.is_empty() {
        return Ok(());
    }
    let mut tx = store.begin_write("put_packets").await?;
    for p in packets {
        sqlx::query(
            "INSERT INTO dockhand_packets (hash, body, created_at, used_at) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (hash) DO UPDATE SET used_at = excluded.used_at
             WHERE dockhand_packets.used_at < excluded.used_at - ?4",
        )
        .bind(&p.hash)
        .bind(&p.body)
        .bind(ms(now))
        .bind(crate::jobs::packets::USED_AT_GRANULARITY.num_milliseconds())
        .execute(&mut *tx)
        .await
        .map_err(Error::db("put_packets"))?;
    }
    tx.commit().await.map_err(Error::db("put_packets"))?;
    Ok(())
}

pub(super) async fn packet_body(store: &SqliteStore, hash: &str) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT body FROM dockhand_packets WHERE hash = ?")
        .bind(hash)
        .fetch_optional(&store.reader)
        .await
        .map_err(Error::db("packet_body"))
}

/// The stored bodies of `hashes`, in one statement (the list bound as one JSON array).
pub(super) async fn packet_bodies(
    store: &SqliteStore,
    hashes: &[&str],
) -> Result<HashMap<String, String>> {
    let op = "packet_bodies";
    if hashes.is_empty() {
        return Ok(HashMap::new());
    }
    let list =
        serde_json::to_string(hashes).map_err(|e| Error::invalid("hashes", e.to_string()))?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT hash, body FROM dockhand_packets WHERE hash IN (SELECT value FROM json_each(?))",
    )
    .bind(list)
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db(op))?;
    Ok(rows.into_iter().collect())
}
