//! MySQL: content-addressed packets (a step's output bodies, stored once per hash).

use super::claim::push_in;
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
    let statements = packet_statements(&sorted);
    let (sorted, statements) = (&sorted, &statements);
    retry_deadlocks(op, move || async move {
        let mut tx = store.begin(op).await?;
        for range in statements {
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
                "INSERT INTO dockhand_packets (hash, body, created_at, used_at) ",
            );
            qb.push_values(&sorted[range.clone()], |mut b, p| {
                b.push_bind(&p.hash)
                    .push_bind(&p.body)
                    .push_bind(ms(now))
                    .push_bind(ms(now));
            });
            qb.push(" ON DUPLICATE KEY UPDATE used_at = IF(used_at < VALUES(used_at) - ")
                .push_bind(crate::jobs::packets::USED_AT_GRANULARITY.num_milliseconds())
                .push(", VALUES(used_at), used_at)");
            qb.build().execute(&mut *tx).await.map_err(Error::db(op))?;
        }
        tx.commit().await.map_err(Error::db(op))?;
        Ok(())
    })
    .await
}

/// Packets per multi-row insert, at most.
const PACKETS_PER_STATEMENT: usize = 1_000;
/// Body bytes per multi-row insert, at most (one larger packet goes alone): well under the
/// server's `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on MySQL 8).
const PACKET_BYTES_PER_STATEMENT: usize = 4 << 20;

/// `packets` split into the index ranges of one multi-row insert each.
fn packet_statements(packets: &[&EncodedPacket]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, p) in packets.iter().enumerate() {
        let size = p.body.len() + p.hash.len();
        if i > start
            && (i - start == PACKETS_PER_STATEMENT || bytes + size > PACKET_BYTES_PER_STATEMENT)
        {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < packets.len() {
        out.push(start..packets.len());
    }
    out
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
            QueryBuilder::new("SELECT hash, body FROM dockhand_packets WHERE hash");
        push_in(&mut qb, part);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(body_len: usize) -> EncodedPacket {
        EncodedPacket {
            reference: format!("v1:{}", "h".repeat(64)),
            hash: "h".repeat(64),
            body: "b".repeat(body_len),
        }
    }

    #[test]
    fn packet_statements_bound_rows_and_bytes_and_cover_every_packet() {
        let small: Vec<EncodedPacket> = (0..2_500).map(|_| packet(10)).collect();
        let refs: Vec<&EncodedPacket> = small.iter().collect();
        assert_eq!(
            packet_statements(&refs),
            vec![0..1_000, 1_000..2_000, 2_000..2_500]
        );
        let big = [packet(3 << 20), packet(3 << 20), packet(5 << 20), packet(1)];
        let refs: Vec<&EncodedPacket> = big.iter().collect();
        assert_eq!(packet_statements(&refs), vec![0..1, 1..2, 2..3, 3..4]);
        assert!(packet_statements(&[]).is_empty());
    }
}
