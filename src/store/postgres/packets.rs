//! PostgreSQL: content-addressed packets (a step's output bodies, stored once per hash).

use super::{ts, PgStore};
use crate::error::{Error, Result};
use crate::jobs::packets::EncodedPacket;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

pub(super) async fn put_packets(
    store: &PgStore,
    packets: &[EncodedPacket],
    now: DateTime<Utc>,
) -> Result<()> {
    if packets.is_empty() {
        return Ok(());
    }
    // One row per hash: ON CONFLICT DO UPDATE may not touch a row twice in one statement.
    let mut unique: Vec<&EncodedPacket> = packets.iter().collect();
    unique.sort_by(|a, b| a.hash.cmp(&b.hash));
    unique.dedup_by(|a, b| a.hash == b.hash);
    let hashes: Vec<&str> = unique.iter().map(|p| p.hash.as_str()).collect();
    let bodies: Vec<&str> = unique.iter().map(|p| p.body.as_str()).collect();
    sqlx::query(
        "INSERT INTO dockhand_packets (hash, body, created_at, used_at)
         SELECT t.hash, t.body, $3, $3 FROM UNNEST($1::text[], $2::text[]) AS t(hash, body)
         ON CONFLICT (hash) DO UPDATE SET used_at = EXCLUDED.used_at
         WHERE dockhand_packets.used_at < EXCLUDED.used_at - $4::interval",
    )
    .bind(hashes)
    .bind(bodies)
    .bind(ts(now))
    .bind(crate::jobs::packets::USED_AT_GRANULARITY)
    .execute(&store.pool)
    .await
    .map_err(Error::db("put_packets"))?;
    Ok(())
}

pub(super) async fn packet_body(store: &PgStore, hash: &str) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT body FROM dockhand_packets WHERE hash = $1")
        .bind(hash)
        .fetch_optional(&store.pool)
        .await
        .map_err(Error::db("packet_body"))
}

/// The stored bodies of `hashes`, in one statement (`= ANY($1)`).
pub(super) async fn packet_bodies(
    store: &PgStore,
    hashes: &[&str],
) -> Result<HashMap<String, String>> {
    if hashes.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT hash, body FROM dockhand_packets WHERE hash = ANY($1)")
            .bind(hashes)
            .fetch_all(&store.pool)
            .await
            .map_err(Error::db("packet_bodies"))?;
    Ok(rows.into_iter().collect())
}
