//! MySQL: content-addressed packets (a step's output bodies, stored once per hash).

use super::claim::push_list;
use super::connect::retry_deadlocks;
use super::jobs::text;
use super::{ms, MySqlStore};
use crate::error::{Error, Result};
use crate::jobs::packets::EncodedPacket;
use chrono::{DateTime, Utc};
use sqlx::{MySql, QueryBuilder};
use std::collections::HashMap;

/// Inserts the packets that are not stored yet, in hash order (two writers of overlapping sets
/// take their row locks in the same order).
pub(super) async fn put_packets(
    store: &MySqlStore,
    packets: &[EncodedPacket],
    now: DateTime<Utc>,
) -> Result<()> {
    if packets.is_empty() {
        return Ok(());
    }
    let op = "put_packets";
    let mut sorted: Vec<&EncodedPacket> = packets.iter().collect();
    sorted.sort_by(|a, b| a.hash.cmp(&b.hash));
    sorted.dedup_by(|a, b| a.hash == b.hash);
    let sorted = &sorted;
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        for p in sorted {
            sqlx::query(
                "INSERT INTO dockhand_packets (hash, body, created_at, used_at)
                 VALUES (?, ?, ?, ?)
                 ON DUPLICATE KEY UPDATE used_at =
                     IF(used_at < VALUES(used_at) - ?, VALUES(used_at), used_at)",
            )
            .bind(&p.hash)
            .bind(&p.body)
            .bind(ms(now))
            .bind(ms(now))
            .bind(crate::jobs::packets::USED_AT_GRANULARITY.num_milliseconds())
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?;
        }
        tx.commit().await.map_err(Error::db(op))?;
        Ok(())
    })
    .await
}

pub(super) async fn packet_body(store: &MySqlStore, hash: &str) -> Result<Option<String>> {
    let row = sqlx::query("SELECT body FROM dockhand_packets WHERE hash = ?")
        .bind(hash)
        .fetch_optional(store.pool())
        .await
        .map_err(Error::db("packet_body"))?;
    row.as_ref().map(|r| text(r, "body")).transpose()
}

/// Hashes per statement of [`packet_bodies`], well under MySQL's 65,535 placeholders.
const HASHES_PER_STATEMENT: usize = 1_000;

/// The stored bodies of `hashes`: one `IN (…)` statement per [`HASHES_PER_STATEMENT`] hashes
/// (one for a chunk's rows).
pub(super) async fn packet_bodies(
    store: &MySqlStore,
    hashes: &[&str],
) -> Result<HashMap<String, String>> {
    let op = "packet_bodies";
    let mut found = HashMap::with_capacity(hashes.len());
    for part in hashes.chunks(HASHES_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("SELECT hash, body FROM dockhand_packets WHERE hash IN (");
        push_list(&mut qb, part);
        qb.push(")");
        let rows = qb
            .build()
            .fetch_all(store.pool())
            .await
            .map_err(Error::db(op))?;
        for row in &rows {
            found.insert(text(row, "hash")?, text(row, "body")?);
        }
    }
    Ok(found)
}
