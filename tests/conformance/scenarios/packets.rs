//! Packet reads on the batch path (issue 16, W4): `Store::packet_bodies` (found, missing,
//! repeated, empty, and a list longer than MySQL's statement chunk), the chunk action's one
//! read per chunk with its children served from the engine's packet cache, and a missing or
//! corrupt packet settling only its own row, with its reason.

use super::batches::{assert_clean, batch_pipeline, children, item, ok_child, runtime};
use crate::harness::TestDb;
use dockhand::jobs::packets::{self, EncodedPacket};
use dockhand::store::faulty::FaultyStore;
use dockhand::{Clock, JobStatus};
use serde_json::json;

fn packet(i: usize) -> EncodedPacket {
    packets::encode(&json!({"packet": i})).unwrap()
}

pub async fn packet_bodies_reads_found_leaves_out_missing_and_reads_nothing_for_none(db: TestDb) {
    let stored: Vec<EncodedPacket> = (0..3).map(packet).collect();
    db.store.put_packets(&stored, db.clock.now()).await.unwrap();
    let missing = packet(99).hash;
    let asked = [
        stored[0].hash.as_str(),
        missing.as_str(),
        stored[2].hash.as_str(),
        stored[0].hash.as_str(),
    ];
    let got = db.store.packet_bodies(&asked).await.unwrap();
    assert_eq!(got.len(), 2, "two stored packets asked for: {got:?}");
    assert_eq!(got.get(&stored[0].hash), Some(&stored[0].body));
    assert_eq!(got.get(&stored[2].hash), Some(&stored[2].body));
    assert!(!got.contains_key(&missing), "a missing packet is absent");
    assert!(!got.contains_key(&stored[1].hash), "not asked for");
    assert!(db.store.packet_bodies(&[]).await.unwrap().is_empty());
    assert!(db
        .store
        .packet_bodies(&[missing.as_str()])
        .await
        .unwrap()
        .is_empty());

    // More hashes than one MySQL statement takes: every stored one is found.
    let many: Vec<EncodedPacket> = (100..1_600).map(packet).collect();
    db.store.put_packets(&many, db.clock.now()).await.unwrap();
    let absent: Vec<String> = (2_000..3_000).map(|i| packet(i).hash).collect();
    let asked: Vec<&str> = many
        .iter()
        .map(|p| p.hash.as_str())
        .chain(absent.iter().map(String::as_str))
        .collect();
    let got = db.store.packet_bodies(&asked).await.unwrap();
    assert_eq!(got.len(), many.len());
    for p in &many {
        assert_eq!(got.get(&p.hash), Some(&p.body), "packet {}", p.hash);
    }
}

pub async fn batch_chunk_reads_its_packets_once_and_children_reuse_them(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), batch_pipeline(25, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 25);
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_eq!(
        faulty.calls("packet_bodies"),
        3,
        "one read per chunk (25 items, chunks of 10)"
    );
    // The parent's own step reads its one input; every child finds its body in the cache the
    // chunk filled.
    assert_eq!(
        faulty.calls("packet_body"),
        1,
        "only the parent's step reads a packet on its own"
    );
    assert_clean(&rt).await;
}

pub async fn batch_hydration_failures_settle_only_their_rows_with_their_reason(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(5, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    let r1 = packets::encode(&json!({"i": 1})).unwrap();
    let r3 = packets::encode(&json!({"i": 3})).unwrap();
    db.exec_sql(&format!(
        "DELETE FROM dockhand_packets WHERE hash = '{}'",
        r1.hash
    ))
    .await;
    db.exec_sql(&format!(
        "UPDATE dockhand_packets SET body = '{{\"i\":999}}' WHERE hash = '{}'",
        r3.hash
    ))
    .await;
    rt.run_due_once().await.unwrap(); // the chunk
    let missing = format!(
        "hydration failed: invalid packet: body of `{}` is missing",
        r1.reference
    );
    let corrupt = format!(
        "hydration failed: invalid packet: body of `{}` fails its integrity check",
        r3.reference
    );
    let row = |idx: i32, error: &str| {
        format!(
            "SELECT COUNT(*) FROM dockhand_worklist
             WHERE parent_id = {parent} AND idx = {idx} AND state = 'discarded' AND error = '{error}'"
        )
    };
    let counts = db
        .count_all(&[
            &row(1, &missing),
            &row(3, &corrupt),
            &format!(
                "SELECT COUNT(*) FROM dockhand_worklist
                 WHERE parent_id = {parent} AND state = 'discarded'"
            ),
        ])
        .await;
    assert_eq!(
        counts,
        vec![1, 1, 2],
        "rows 1 and 3 discarded with their reasons, no other"
    );
    rt.drain(1000).await.unwrap();
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 3, "the other rows became children");
    assert!(kids.iter().all(|k| k.status == JobStatus::Completed));
    for i in [1, 3] {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} released via the sidecar"
        );
    }
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    assert_clean(&rt).await;
}
