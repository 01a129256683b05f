//! The action queue: lifecycle, unique and bulk enqueues, the reaper and pruning, schedules,
//! maintenance leases and cross-process wake-ups.

use super::{claim_request as req, cleanup, fresh, t0, PgStore};
use crate::action::{ActionFilter, ActionQuery};
use crate::schedule::{Recurrence, ScheduleSpec};
use crate::store::{Finish, FinishResult, Lease, PruneCutoffs, Store};
use crate::ActionSpec;
use chrono::Duration;
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn lifecycle() {
    let Some((s, url, schema)) = fresh("lifecycle").await else {
        return;
    };
    let now = t0();
    let spec = ActionSpec::new("mail.send", json!({"to": "a", "n": 1})).unique();
    let first = s.enqueue(&spec.prepare(now).unwrap(), now).await.unwrap();
    let dup = s.enqueue(&spec.prepare(now).unwrap(), now).await.unwrap();
    assert!(first.inserted && !dup.inserted);
    assert_eq!(first.id, dup.id);
    let plain = ActionSpec::new("mail.send", json!({"to": "b"}))
        .prepare(now)
        .unwrap();
    let second = s.enqueue(&plain, now).await.unwrap();
    let got = s.get(first.id).await.unwrap().unwrap();
    assert_eq!(got.scheduled_at, crate::clock::to_millis(now));
    assert_eq!(got.args, json!({"n": 1, "to": "a"}));
    // Args filters are semantic JSON equality.
    let q = ActionQuery {
        filter: ActionFilter {
            args: Some(json!({"n": 1, "to": "a"})),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(s.query(&q).await.unwrap().len(), 1);

    let claimed = s.claim(&req("w1", now, 10)).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.attempt == 1 && c.token == 1));
    assert!(s.claim(&req("w2", now, 10)).await.unwrap().is_empty());
    let leases: Vec<Lease> = claimed.iter().map(|c| c.lease()).collect();
    let until = now + Duration::seconds(60);
    assert_eq!(s.heartbeat("w1", &leases, until).await.unwrap(), 2);
    assert_eq!(s.heartbeat("w2", &leases, until).await.unwrap(), 0);

    let lease = Lease {
        id: first.id,
        token: 1,
    };
    let done = s.finish(lease, &Finish::Complete, now).await.unwrap();
    assert_eq!(done, FinishResult::Applied);
    let stale = s.finish(lease, &Finish::Complete, now).await.unwrap();
    assert_eq!(stale, FinishResult::LeaseLost);
    let events: Vec<String> = s
        .logs(first.id)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.event)
        .collect();
    assert_eq!(events, ["created", "started", "completed", "lease_lost"]);
    // The key is free again once the holder finished.
    let again = s.enqueue(&spec.prepare(now).unwrap(), now).await.unwrap();
    assert!(again.inserted && again.id != first.id);

    let fail = Finish::Fail {
        error: "boom".into(),
    };
    let lease2 = Lease {
        id: second.id,
        token: 1,
    };
    assert_eq!(
        s.finish(lease2, &fail, now).await.unwrap(),
        FinishResult::Applied
    );
    assert!(s.retry(second.id, now).await.unwrap());
    assert!(s.cancel(second.id, now).await.unwrap());
    let stats = s.stats(now).await.unwrap();
    assert_eq!(stats.by_status.get("complete"), Some(&1));
    assert_eq!(stats.by_status.get("canceled"), Some(&1));
    assert_eq!(stats.past_due, 1);
    assert_eq!(
        s.unschedule(&ActionFilter::default(), now).await.unwrap(),
        1
    );
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn concurrent_unique_enqueue_yields_one_row() {
    let Some((s, url, schema)) = fresh("concurrent_unique").await else {
        return;
    };
    let s = Arc::new(s);
    let a = ActionSpec::new("x", json!({}))
        .unique_key("k")
        .prepare(t0())
        .unwrap();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (s, a) = (s.clone(), a.clone());
            tokio::spawn(async move { s.enqueue(&a, t0()).await.unwrap() })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    assert!(ids.iter().all(|e| e.id == ids[0].id));
    assert_eq!(ids.iter().filter(|e| e.inserted).count(), 1);
    let all = s.query(&ActionQuery::default()).await.unwrap();
    assert_eq!(all.len(), 1);
    let s = Arc::into_inner(s).unwrap();
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn bulk_reap_prune() {
    let Some((s, url, schema)) = fresh("bulk_reap_prune").await else {
        return;
    };
    let now = t0();
    let mut batch: Vec<_> = (0..10_000)
        .map(|i| {
            ActionSpec::new("bulk", json!({ "i": i }))
                .prepare(now)
                .unwrap()
        })
        .collect();
    batch[17] = ActionSpec::new("bulk", json!({}))
        .unique_key("u")
        .prepare(now)
        .unwrap();
    batch[9_000] = batch[17].clone();
    let r = s.enqueue_bulk(&batch, now).await.unwrap();
    assert_eq!(r.len(), 10_000);
    assert_eq!(r[17].id, r[9_000].id);
    assert!(!r[9_000].inserted);
    let plain: Vec<i64> = (0..10_000)
        .filter(|&i| i != 17 && i != 9_000)
        .map(|i| r[i].id)
        .collect();
    assert!(
        plain.windows(2).all(|w| w[0] < w[1]),
        "ids follow input order"
    );
    let got = s.get(r[5].id).await.unwrap().unwrap();
    assert_eq!(got.args, json!({"i": 5}));
    assert_eq!(s.stats(now).await.unwrap().past_due, 9_999);

    // Reaper: one lease expires with attempts left, one without.
    let one = ActionSpec::new("r", json!({})).priority(-1).max_attempts(1);
    s.enqueue(&one.prepare(now).unwrap(), now).await.unwrap();
    let c = s.claim(&req("w", now, 2)).await.unwrap();
    assert_eq!(c.len(), 2);
    let later = now + Duration::minutes(5);
    let rep = s.reap_expired(later, 100).await.unwrap();
    assert_eq!((rep.requeued, rep.failed), (1, 1));
    assert_eq!(s.reap_expired(later, 100).await.unwrap().requeued, 0);

    // Prune: the failed one is old enough, nothing else finished.
    let cut = PruneCutoffs {
        finished_before: later + Duration::days(1),
        failed_before: later + Duration::days(1),
        batch: 1_000,
    };
    assert_eq!(s.prune(&cut).await.unwrap(), 1);
    assert_eq!(s.prune(&cut).await.unwrap(), 0);
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn schedules_and_leases() {
    let Some((s, url, schema)) = fresh("schedules_and_leases").await else {
        return;
    };
    let now = t0();
    let every = Recurrence::every(Duration::minutes(10)).unwrap();
    let spec = ScheduleSpec::new("tick", json!({"a": 1}), every).name("ticker");
    let id = s
        .upsert_schedule(&spec.prepare(now).unwrap(), now)
        .await
        .unwrap();
    let due = s.due_schedules(now, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    let occ = due[0].next_run_at.unwrap();
    assert_eq!(occ, crate::clock::to_millis(now));
    let next = occ + Duration::minutes(10);
    assert!(s.materialise(&due[0], occ, Some(next), now).await.unwrap());
    assert!(!s.materialise(&due[0], occ, Some(next), now).await.unwrap());
    // Re-upserting the same recurrence keeps the moved next_run_at.
    let again = s
        .upsert_schedule(&spec.prepare(now).unwrap(), now)
        .await
        .unwrap();
    assert_eq!(again, id);
    assert_eq!(s.schedules().await.unwrap()[0].next_run_at, Some(next));
    let q = ActionQuery::default();
    let occurrences = s.query(&q).await.unwrap();
    assert_eq!(occurrences.len(), 1);
    assert_eq!(occurrences[0].schedule_id, Some(id));
    assert_eq!(
        s.next_scheduled(&ActionFilter::default()).await.unwrap(),
        Some(occ)
    );

    // Fixed delay: re-armed `every` after the occurrence finished.
    let fd = Recurrence::every_after_finish(Duration::seconds(30)).unwrap();
    let fd_spec = ScheduleSpec::new("fd", json!({}), fd).name("fd");
    s.upsert_schedule(&fd_spec.prepare(now).unwrap(), now)
        .await
        .unwrap();
    let fd_row = s
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .find(|x| x.name == "fd")
        .unwrap();
    assert!(s
        .materialise(&fd_row, fd_row.next_run_at.unwrap(), None, now)
        .await
        .unwrap());
    assert_eq!(
        s.rearm_fixed_delay(now).await.unwrap(),
        0,
        "occurrence still pending"
    );
    s.unschedule(
        &ActionFilter {
            hook: Some("fd".into()),
            ..Default::default()
        },
        now,
    )
    .await
    .unwrap();
    assert!(s.set_schedule_enabled(fd_row.id, true).await.unwrap());

    let until = now + Duration::seconds(60);
    assert!(s
        .try_maintenance_lease("reaper", "a", until, now)
        .await
        .unwrap());
    assert!(!s
        .try_maintenance_lease("reaper", "b", until, now)
        .await
        .unwrap());
    assert!(s
        .try_maintenance_lease("reaper", "a", until, now)
        .await
        .unwrap());
    assert!(s
        .try_maintenance_lease("reaper", "b", until, until)
        .await
        .unwrap());
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn notify_wakes_other_store_and_enqueue_in() {
    let Some((a, url, schema)) = fresh("notify").await else {
        return;
    };
    let b = PgStore::connect_in_schema(&url, &schema).await.unwrap();
    assert_eq!(a.channel(), format!("dockhand_wakeup_{schema}"));
    b.listen().await.unwrap();
    b.listen().await.unwrap();
    let mut rx = b.wakeups();
    rx.borrow_and_update();
    let now = t0();
    let spec = ActionSpec::new("n", json!({}));
    a.enqueue(&spec.prepare(now).unwrap(), now).await.unwrap();
    let woke = tokio::time::timeout(std::time::Duration::from_secs(5), rx.changed()).await;
    assert!(matches!(woke, Ok(Ok(()))), "no cross-store wake-up");

    // Transactional enqueue: gone on rollback, kept (and notified) on commit.
    let mut tx = a.pool().begin().await.unwrap();
    PgStore::enqueue_in(&mut tx, &spec.prepare(now).unwrap(), now)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(a.query(&ActionQuery::default()).await.unwrap().len(), 1);
    rx.borrow_and_update();
    let mut tx = a.pool().begin().await.unwrap();
    PgStore::enqueue_in(&mut tx, &spec.prepare(now).unwrap(), now)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let woke = tokio::time::timeout(std::time::Duration::from_secs(5), rx.changed()).await;
    assert!(
        matches!(woke, Ok(Ok(()))),
        "no wake-up after transactional enqueue"
    );
    assert_eq!(a.query(&ActionQuery::default()).await.unwrap().len(), 2);
    b.close().await;
    cleanup(a, &url, &schema).await;
}

#[tokio::test]
async fn schema_names_are_validated() {
    for bad in ["", "Public", "a-b", "x\"; DROP TABLE y; --"] {
        let e = PgStore::connect_in_schema("postgres://127.0.0.1:1/x", bad).await;
        assert!(matches!(
            e,
            Err(crate::Error::InvalidInput {
                field: "schema",
                ..
            })
        ));
    }
}
