//! Log entries read from the action's row instead of stored: `created` and `completed`
//! (migration 0017) on every backend, the latest attempt's `started` (migration 0020) on
//! SQLite and PostgreSQL. Every backend must show the same log, stored or derived.

use super::store_api::claim;
use crate::harness::{Kind, TestDb};
use chrono::Duration;
use dockhand::store::{ClaimRequest, Finish, FinishResult};
use dockhand::Clock;
use dockhand::{ActionSpec, ActionStatus};
use serde_json::json;

fn events(logs: &[dockhand::action::ActionLog]) -> Vec<(String, Option<String>)> {
    logs.iter()
        .map(|l| {
            (
                l.event.clone(),
                l.detail.clone().filter(|_| l.event == "started"),
            )
        })
        .collect()
}

/// Migration 0020: each attempt's `started` entry, whether read from the row (the latest
/// attempt on SQLite) or stored (earlier attempts; every attempt elsewhere), sits in claim
/// order among the other entries, names its claimer and carries its claim time: across a
/// snooze, a release (no entry of its own, so two claims follow each other), a retry, a reaped
/// lease and a stale owner's refused finish, in the full log and in every tail.
pub async fn store_started_entry_comes_from_the_row(db: TestDb) {
    let q = db.queue();
    let id = q
        .enqueue(ActionSpec::new("h", json!({})).max_attempts(5))
        .await
        .unwrap();
    let mut claimed_at = Vec::new();
    let mut claim_one = async |owner: &str, lease: i64| {
        db.clock.advance(Duration::seconds(1));
        claimed_at.push(db.clock.now());
        let c = claim(&db, owner, 1, Duration::seconds(lease)).await;
        assert_eq!(c.len(), 1, "{owner} claims the action");
        c[0].lease()
    };
    let w1 = claim_one("w1", 30).await;
    let at = db.clock.now();
    let r = db
        .store
        .finish(w1, &Finish::Snooze { at }, at)
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let w2 = claim_one("w2", 30).await;
    let r = db
        .store
        .finish(w2, &Finish::Release, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let w3 = claim_one("w3", 30).await;
    let retry = Finish::Retry {
        at: db.clock.now(),
        error: "flaky".into(),
    };
    let r = db.store.finish(w3, &retry, db.clock.now()).await.unwrap();
    assert_eq!(r, FinishResult::Applied);
    let w4 = claim_one("w4", 5).await;
    db.clock.advance(Duration::seconds(10));
    let reaped = db.store.reap_expired(db.clock.now(), 10).await.unwrap();
    assert_eq!(reaped.requeued + reaped.failed, 1, "w4's lease is reaped");
    let w5 = claim_one("w5", 30).await;
    db.clock.advance(Duration::seconds(1));
    let r = db
        .store
        .finish(w4, &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(
        r,
        FinishResult::LeaseLost,
        "the stale owner's finish is refused"
    );
    db.clock.advance(Duration::seconds(1));
    let r = db
        .store
        .finish(w5, &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);

    let logs = q.logs(id).await.unwrap();
    let started: Vec<_> = logs.iter().filter(|l| l.event == "started").collect();
    let owners: Vec<_> = started.iter().map(|l| l.detail.as_deref()).collect();
    assert_eq!(
        owners,
        [Some("w1"), Some("w2"), Some("w3"), Some("w4"), Some("w5")],
        "{logs:?}"
    );
    let times: Vec<_> = started.iter().map(|l| l.at).collect();
    assert_eq!(times, claimed_at, "each entry carries its claim's time");
    let kinds: Vec<String> = logs.iter().map(|l| l.event.clone()).collect();
    let at_of = |e: &str, n: usize| {
        kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| *k == e)
            .nth(n)
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no {e} #{n} in {kinds:?}"))
    };
    assert_eq!(kinds[0], "created");
    assert_eq!(kinds.last().map(String::as_str), Some("completed"));
    // Each attempt's entries follow its `started` and precede the next one's.
    assert!(at_of("started", 0) < at_of("started", 1), "{kinds:?}");
    assert!(at_of("started", 2) < at_of("retry", 0), "{kinds:?}");
    assert!(at_of("retry", 0) < at_of("started", 3), "{kinds:?}");
    assert!(at_of("started", 4) < at_of("lease_lost", 0), "{kinds:?}");
    assert!(at_of("lease_lost", 0) < at_of("completed", 0), "{kinds:?}");
    let reap = kinds.len() - 4; // the reaper's entry: right before w5's start
    assert!(
        at_of("started", 3) < reap && reap < at_of("started", 4),
        "{kinds:?}"
    );
    for n in 1..=logs.len() + 1 {
        let tail = db.store.logs_tail(id, n as i64).await.unwrap();
        assert_eq!(
            events(&tail),
            events(&logs[logs.len().saturating_sub(n)..]),
            "tail of {n}"
        );
    }
    // SQLite and PostgreSQL store the earlier attempts' entries only: the latest claim wrote
    // no row.
    let stored = db
        .count_all(&["SELECT COUNT(*) FROM dockhand_action_logs WHERE event = 'started'"])
        .await;
    let expected = if db.kind == Kind::Mysql { 5 } else { 4 };
    assert_eq!(stored, vec![expected]);
    let a = q.get(id).await.unwrap();
    assert_eq!((a.status, a.attempt), (ActionStatus::Complete, 3));
}

/// Migration 0020 on SQLite and PostgreSQL: an action claimed before it (its `started` row stored, no
/// `started_by`) shows that row once, and its next claim adds exactly one entry after it.
pub async fn store_started_entry_before_0020_is_not_doubled(db: TestDb) {
    if db.kind == Kind::Mysql {
        return; // MySQL stores every `started` row
    }
    let q = db.queue();
    let id = q.enqueue(ActionSpec::new("h", json!({}))).await.unwrap();
    let c = claim(&db, "old", 1, Duration::seconds(30)).await;
    // What a claim before 0020 left: a stored row and no row-derived entry.
    db.exec_all(&[
        &format!(
            "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
             SELECT id, started_at, 'started', 'old' FROM dockhand_actions WHERE id = {id}"
        ),
        &format!(
            "UPDATE dockhand_actions SET started_by = NULL, started_after = NULL WHERE id = {id}"
        ),
    ])
    .await;
    let logs = q.logs(id).await.unwrap();
    assert_eq!(
        events(&logs),
        [
            ("created".to_string(), None),
            ("started".to_string(), Some("old".to_string()))
        ]
    );
    let r = db
        .store
        .finish(c[0].lease(), &Finish::Release, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let c = claim(&db, "new", 1, Duration::seconds(30)).await;
    let r = db
        .store
        .finish(c[0].lease(), &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    let logs = q.logs(id).await.unwrap();
    let owners: Vec<_> = logs
        .iter()
        .map(|l| (l.event.as_str(), l.detail.as_deref()))
        .collect();
    assert_eq!(
        owners,
        [
            ("created", None),
            ("started", Some("old")),
            ("released", Some("shutdown")),
            ("started", Some("new")),
            ("completed", None)
        ]
    );
    assert_eq!(db.store.logs_tail(id, 3).await.unwrap(), logs[2..]);
}

/// Migration 0017: an action's `created` entry comes from its row (single, unique and bulk
/// enqueues write no log row), exactly once, at `created_at`, also in a log tail; an action
/// enqueued before 0017 (a stored `created` row) shows that row and no second one.
pub async fn store_created_entry_comes_from_the_row(db: TestDb) {
    let q = db.queue();
    let single = q.enqueue(ActionSpec::new("h", json!(1))).await.unwrap();
    let keyed = q
        .enqueue(ActionSpec::new("h", json!(2)).unique_key("k"))
        .await
        .unwrap();
    let bulk = q
        .enqueue_bulk(vec![
            ActionSpec::new("h", json!(3)),
            ActionSpec::new("h", json!(4)),
        ])
        .await
        .unwrap();
    let stored = db
        .count_all(&["SELECT COUNT(*) FROM dockhand_action_logs"])
        .await;
    assert_eq!(stored, vec![0], "enqueues write no log rows");
    for id in [single, keyed, bulk[0], bulk[1]] {
        let action = q.get(id).await.unwrap();
        let logs = q.logs(id).await.unwrap();
        assert_eq!(logs.len(), 1, "action {id}: {logs:?}");
        assert_eq!(logs[0].event, "created");
        assert_eq!(logs[0].action_id, id);
        assert_eq!(logs[0].at, action.created_at);
        assert_eq!(logs[0].detail, None);
        assert_eq!(db.store.logs_tail(id, 5).await.unwrap(), logs);
    }
    // Later entries follow it; a tail shorter than the log leaves it out.
    db.store.cancel(single, db.clock.now()).await.unwrap();
    db.store.retry(single, db.clock.now()).await.unwrap();
    let events = |logs: Vec<dockhand::action::ActionLog>| -> Vec<String> {
        logs.into_iter().map(|l| l.event).collect()
    };
    assert_eq!(
        events(q.logs(single).await.unwrap()),
        ["created", "canceled", "requeued"]
    );
    assert_eq!(
        events(db.store.logs_tail(single, 2).await.unwrap()),
        ["canceled", "requeued"]
    );
    assert_eq!(
        events(db.store.logs_tail(single, 3).await.unwrap()),
        ["created", "canceled", "requeued"]
    );
    // A row from before 0017 (its `created` stored) is not doubled.
    db.exec_sql(&format!(
        "INSERT INTO dockhand_action_logs (action_id, at, event)
         SELECT id, created_at, 'created' FROM dockhand_actions WHERE id = {keyed}"
    ))
    .await;
    assert_eq!(events(q.logs(keyed).await.unwrap()), ["created"]);
    assert_eq!(
        events(db.store.logs_tail(keyed, 5).await.unwrap()),
        ["created"]
    );
    assert!(q.logs(999_999).await.unwrap().is_empty());
    assert!(db.store.logs_tail(999_999, 5).await.unwrap().is_empty());
}

/// Migration 0017: a completion writes no log row; the `completed` entry is read from the
/// row (at `finished_at`), once, whichever path completed it (one finish, a batch, a runner's
/// round), and sits before entries written after it (a stale owner's refused finish); a
/// completion from before 0017 (stored) is not doubled.
pub async fn store_completed_entry_comes_from_the_row(db: TestDb) {
    let q = db.queue();
    let ids = q
        .enqueue_bulk((0..4).map(|i| ActionSpec::new("h", json!(i))).collect())
        .await
        .unwrap();
    let events = |logs: Vec<dockhand::action::ActionLog>| -> Vec<String> {
        logs.into_iter().map(|l| l.event).collect()
    };
    // One finish.
    let c = claim(&db, "w", 1, Duration::seconds(30)).await;
    let one = c[0].lease();
    db.clock.advance(Duration::seconds(1));
    let r = db
        .store
        .finish(one, &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    // A batch.
    let c = claim(&db, "w", 1, Duration::seconds(30)).await;
    let batched = c[0].lease();
    let r = db
        .store
        .finish_many(&[(batched, Finish::Complete)], db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, vec![FinishResult::Applied]);
    // A round (finish and claim the next one).
    let c = claim(&db, "w", 1, Duration::seconds(30)).await;
    let rounded = c[0].lease();
    let now = db.clock.now();
    let round = db
        .store
        .finish_and_claim(
            &[(rounded, Finish::Complete)],
            &ClaimRequest {
                owner: "w",
                limit: 1,
                now,
                lease_until: now + Duration::seconds(30),
                hooks: None,
                routing: None,
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(round.finished, vec![FinishResult::Applied]);
    assert_eq!(round.claimed.unwrap().len(), 1);
    let stored = db
        .count_all(&[
            "SELECT COUNT(*) FROM dockhand_action_logs WHERE event IN ('created', 'completed')",
        ])
        .await;
    assert_eq!(stored, vec![0], "no created/completed log rows are written");
    for lease in [one, batched, rounded] {
        let action = q.get(lease.id).await.unwrap();
        let logs = q.logs(lease.id).await.unwrap();
        assert_eq!(events(logs.clone()), ["created", "started", "completed"]);
        assert_eq!(Some(logs[2].at), action.finished_at);
        assert_eq!(db.store.logs_tail(lease.id, 1).await.unwrap(), logs[2..]);
    }
    // A refused finish after the completion (at the same instant) is logged after it.
    let r = db
        .store
        .finish(one, &Finish::Complete, db.clock.now())
        .await
        .unwrap();
    assert_eq!(r, FinishResult::LeaseLost);
    assert_eq!(
        events(q.logs(one.id).await.unwrap()),
        ["created", "started", "completed", "lease_lost"]
    );
    assert_eq!(
        events(db.store.logs_tail(one.id, 2).await.unwrap()),
        ["completed", "lease_lost"]
    );
    // An action still running has no completed entry.
    assert!(!events(q.logs(ids[3]).await.unwrap()).contains(&"completed".to_string()));
    // A completion stored before 0017 is not doubled.
    db.exec_sql(&format!(
        "INSERT INTO dockhand_action_logs (action_id, at, event)
         SELECT id, finished_at, 'completed' FROM dockhand_actions WHERE id = {}",
        batched.id
    ))
    .await;
    assert_eq!(
        events(q.logs(batched.id).await.unwrap()),
        ["created", "started", "completed"]
    );
}
