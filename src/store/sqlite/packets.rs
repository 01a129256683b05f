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
    // One statement for the whole list (bound as one JSON array of `[hash, body]`), in
    // slices so that a huge fan-out does not hold the writer for one giant statement.
    let mut tx = store.begin_write("put_packets").await?;
    for part in packets.chunks(PACKETS_PER_STATEMENT) {
        let list: Vec<(&str, &str)> = part
            .iter()
            .map(|p| (p.hash.as_str(), p.body.as_str()))
            .collect();
        let list =
            serde_json::to_string(&list).map_err(|e| Error::invalid("packets", e.to_string()))?;
        let written = sqlx::query(
            "INSERT INTO dockhand_packets (hash, body, created_at, used_at)
             SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), ?2, ?2
             FROM json_each(?1) WHERE true
             ON CONFLICT (hash) DO UPDATE SET used_at = excluded.used_at
             WHERE dockhand_packets.used_at < excluded.used_at - ?3",
        )
        .bind(list)
        .bind(ms(now))
        .bind(crate::jobs::packets::USED_AT_GRANULARITY.num_milliseconds())
        .execute(&mut *tx)
        .await;
        if let Err(e) = written {
            tx.rollback().await.map_err(Error::db("put_packets"))?;
            return Err(Error::db("put_packets")(e));
        }
    }
    tx.commit().await.map_err(Error::db("put_packets"))?;
    Ok(())
}

/// Packets per insert statement.
const PACKETS_PER_STATEMENT: usize = 1_000;

pub(super) async fn packet_body(store: &SqliteStore, hash: &str) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT body FROM dockhand_packets WHERE hash = ?")
        .bind(hash)
        .fetch_optional(&store.reader)
        .await
        .map_err(Error::db("packet_body"))
}

/// The stored bodies of `hashes`, in one statement (the list bound as one JSON array) that
/// answers one row (see `one_row`): a JSON object of hash to body.
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
    let bodies: String = sqlx::query_scalar(
        "SELECT json_group_object(hash, body) FROM dockhand_packets
         WHERE hash IN (SELECT value FROM json_each(?))",
    )
    .bind(list)
    .fetch_one(&store.reader)
    .await
    .map_err(Error::db(op))?;
    super::one_row::decode(&bodies, "packet bodies")
}
