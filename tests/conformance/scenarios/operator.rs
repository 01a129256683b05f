//! Operator views and bulk changes (the dashboard, issue 8): keyset search in every sort order
//! (each row once, forwards and backwards), filters, capped counts, throughput buckets, the log
//! tail, the schema version, and the guards of bulk cancel, retry, run now and delete. Args
//! containment is in `operator_args`.

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::action::Action;
use dockhand::search::{ActionSearch, ActionSort, ActionSummary, Cursor};
use dockhand::store::{ClaimRequest, Finish, FinishResult};
use dockhand::{ActionQuery, ActionSpec, ActionStatus, Clock};
use serde_json::{json, Value};

/// 60 actions over 3 hooks, 4 priorities, 7 due times (ties), two groups and none; 20 claimed,
/// then 8 of those completed and 4 failed at distinct times. Returns every action.
async fn seed(db: &TestDb) -> Vec<Action> {
    let q = db.queue();
    let t0 = db.clock.now();
    for i in 0..60i64 {
        let mut spec = ActionSpec::new(
            format!("h{}", i % 3),
            json!({"i": i, "odd": i % 2 == 1, "tags": [format!("t{}", i % 4), i % 5], "nested": {"k": i % 3}}),
        )
        .priority(((i % 4) * 5) as i32)
        .at(t0 + Duration::minutes(i % 7));
        if i % 5 != 0 {
            spec = spec.group(format!("g{}", i % 2));
        }
        q.enqueue(spec).await.unwrap();
    }
    db.clock.advance(Duration::minutes(10));
    let now = db.clock.now();
    let claimed = db
        .store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 20,
            now,
            lease_until: now + Duration::minutes(5),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 20);
    for (n, c) in claimed.iter().take(12).enumerate() {
        db.clock
            .advance(Duration::seconds(if n % 3 == 0 { 0 } else { 61 }));
        let finish = if n < 8 {
            Finish::Complete
        } else {
            Finish::Fail {
                error: format!("boom {n}"),
            }
        };
        let r = db
            .store
            .finish(c.lease(), &finish, db.clock.now())
            .await
            .unwrap();
        assert_eq!(r, FinishResult::Applied);
    }
    all(db).await
}

async fn all(db: &TestDb) -> Vec<Action> {
    db.store
        .query(&ActionQuery {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
}

fn key(a: &Action, sort: ActionSort) -> Vec<i64> {
    let t = |d: Option<chrono::DateTime<chrono::Utc>>| d.map_or(0, |d| d.timestamp_millis());
    match sort {
        ActionSort::NextToRun => vec![a.priority.into(), a.scheduled_at.timestamp_millis(), a.id],
        ActionSort::Scheduled => vec![a.scheduled_at.timestamp_millis(), a.id],
        ActionSort::Lease => vec![t(a.lease_until), a.id],
        ActionSort::FinishedDesc => vec![t(a.finished_at), a.id],
        ActionSort::IdDesc => vec![a.id],
    }
}

/// The ids a search should list, in order, computed in Rust from every action.
fn expected(actions: &[Action], s: &ActionSearch, keep: impl Fn(&Action) -> bool) -> Vec<i64> {
    let mut rows: Vec<&Action> = actions
        .iter()
        .filter(|a| s.status.map_or(true, |st| a.status == st))
        .filter(|a| keep(a))
        .collect();
    rows.sort_by_key(|a| key(a, s.sort));
    if s.sort.descending() {
        rows.reverse();
    }
    rows.iter().map(|a| a.id).collect()
}

async fn walk_forward(db: &TestDb, base: &ActionSearch) -> Vec<i64> {
    let mut s = base.clone();
    let mut ids = Vec::new();
    for _ in 0..100 {
        let page = db.store.search_actions(&s).await.unwrap();
        assert!(page.rows.len() as i64 <= s.limit);
        ids.extend(page.rows.iter().map(|r| r.id));
        match page.next {
            Some(c) => s.after = Some(c),
            None => return ids,
        }
    }
    panic!("the walk did not end");
}

async fn walk_backward(db: &TestDb, base: &ActionSearch, from: Cursor) -> Vec<i64> {
    let mut s = base.clone();
    s.after = None;
    s.before = Some(from);
    let mut pages = Vec::new();
    for _ in 0..100 {
        let page = db.store.search_actions(&s).await.unwrap();
        let ids: Vec<i64> = page.rows.iter().map(|r| r.id).collect();
        pages.push(ids);
        match page.prev {
            Some(c) => s.before = Some(c),
            None => break,
        }
    }
    pages.reverse();
    pages.concat()
}

pub async fn ops_keyset_lists_every_row_once_in_each_order(db: TestDb) {
    let actions = seed(&db).await;
    let cases = [
        (ActionSort::NextToRun, Some(ActionStatus::Pending)),
        (ActionSort::Scheduled, Some(ActionStatus::Pending)),
        (ActionSort::Scheduled, None),
        (ActionSort::Lease, Some(ActionStatus::Running)),
        (ActionSort::FinishedDesc, Some(ActionStatus::Complete)),
        (ActionSort::FinishedDesc, Some(ActionStatus::Failed)),
        (ActionSort::IdDesc, None),
        (ActionSort::NextToRun, None),
    ];
    for (sort, status) in cases {
        let base = ActionSearch {
            sort,
            status,
            limit: 7,
            ..Default::default()
        };
        let want = expected(&actions, &base, |_| true);
        assert!(!want.is_empty(), "{sort:?} {status:?}: seed covers it");
        let got = walk_forward(&db, &base).await;
        assert_eq!(got, want, "{sort:?} {status:?} forward");
        // Back from past the last row: the same rows, pages reassembled in order.
        let last = actions.iter().find(|a| Some(&a.id) == want.last()).unwrap();
        let beyond = {
            let mut k = key(last, sort);
            let n = k.len();
            k[n - 1] += if sort.descending() { -1 } else { 1 };
            Cursor::new(sort, k).unwrap()
        };
        let back = walk_backward(&db, &base, beyond).await;
        assert_eq!(back, want, "{sort:?} {status:?} backward");
    }
    // A page in the middle links both ways, and its prev page ends right before it.
    let base = ActionSearch {
        sort: ActionSort::IdDesc,
        limit: 10,
        ..Default::default()
    };
    let p1 = db.store.search_actions(&base).await.unwrap();
    assert!(p1.prev.is_none());
    let p2 = db
        .store
        .search_actions(&ActionSearch {
            after: p1.next.clone(),
            ..base.clone()
        })
        .await
        .unwrap();
    let back = db
        .store
        .search_actions(&ActionSearch {
            before: p2.prev.clone(),
            ..base.clone()
        })
        .await
        .unwrap();
    assert_eq!(back.rows, p1.rows);
    assert!(back.prev.is_none(), "nothing before the first page");
}

/// A search and the predicate, in Rust, of the rows it should list.
type Check = (ActionSearch, Box<dyn Fn(&Action) -> bool + Send>);

pub async fn ops_filters_and_capped_counts(db: TestDb) {
    let actions = seed(&db).await;
    let t0 = actions.iter().map(|a| a.scheduled_at).min().unwrap();
    let max_id = actions[30].id;
    let checks: Vec<Check> = vec![
        (
            ActionSearch {
                hook: Some("h1".into()),
                ..Default::default()
            },
            Box::new(|a| a.hook == "h1"),
        ),
        (
            ActionSearch {
                group: Some(None),
                ..Default::default()
            },
            Box::new(|a| a.group.is_none()),
        ),
        (
            ActionSearch {
                group: Some(Some("g1".into())),
                status: Some(ActionStatus::Pending),
                ..Default::default()
            },
            Box::new(|a| a.group.as_deref() == Some("g1")),
        ),
        (
            ActionSearch {
                priority: Some((5, 10)),
                ..Default::default()
            },
            Box::new(|a| (5..=10).contains(&a.priority)),
        ),
        (
            ActionSearch {
                sort: ActionSort::Scheduled,
                from: Some(t0 + Duration::minutes(2)),
                to: Some(t0 + Duration::minutes(5)),
                ..Default::default()
            },
            Box::new(move |a| {
                a.scheduled_at >= t0 + Duration::minutes(2)
                    && a.scheduled_at < t0 + Duration::minutes(5)
            }),
        ),
        (
            ActionSearch {
                max_id: Some(max_id),
                ..Default::default()
            },
            Box::new(move |a| a.id <= max_id),
        ),
    ];
    for (s, keep) in checks {
        let want = expected(&actions, &s, &keep);
        let got = walk_forward(
            &db,
            &ActionSearch {
                limit: 500,
                ..s.clone()
            },
        )
        .await;
        assert_eq!(got, want, "{s:?}");
        let c = db.store.count_actions(&s, 1_000).await.unwrap();
        assert_eq!((c.n, c.capped), (want.len() as i64, false), "{s:?}");
        let c = db.store.count_actions(&s, 3).await.unwrap();
        assert_eq!((c.n, c.capped), (3, want.len() > 3), "{s:?} capped");
    }
    // Summaries carry the row and cut args and errors to their heads.
    let page = db
        .store
        .search_actions(&ActionSearch {
            status: Some(ActionStatus::Failed),
            sort: ActionSort::FinishedDesc,
            ..Default::default()
        })
        .await
        .unwrap();
    let row: &ActionSummary = &page.rows[0];
    let full = actions.iter().find(|a| a.id == row.id).unwrap();
    assert_eq!(row.error_head, full.last_error);
    assert_eq!(
        serde_json::from_str::<Value>(&row.args_head).unwrap(),
        full.args
    );
    assert_eq!(row.finished_at, full.finished_at);
    // Bad searches are refused by name, before any query.
    let e = db
        .store
        .search_actions(&ActionSearch {
            sort: ActionSort::Lease,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("sort"), "{e}");
    let e = db
        .store
        .count_actions(
            &ActionSearch {
                args_contains: Some(json!("x")),
                ..Default::default()
            },
            10,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("args_contains"), "{e}");
}

pub async fn ops_internal_actions_can_be_left_out(db: TestDb) {
    let q = db.queue();
    q.enqueue(ActionSpec::new("dockhand.job.step", json!({})))
        .await
        .unwrap();
    let mine = q
        .enqueue(ActionSpec::new("dockhandx", json!({})))
        .await
        .unwrap();
    let page = db
        .store
        .search_actions(&ActionSearch {
            exclude_internal: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![mine]
    );
}

pub async fn ops_throughput_counts_finishes_per_bucket(db: TestDb) {
    let actions = seed(&db).await;
    let since = db.clock.now() - Duration::minutes(30);
    let until = db.clock.now() + Duration::minutes(1);
    let buckets = db
        .store
        .throughput(since, until, Duration::minutes(1))
        .await
        .unwrap();
    assert_eq!(buckets.len(), 32, "aligned to whole minutes, both ends");
    for w in buckets.windows(2) {
        assert_eq!(w[1].start - w[0].start, Duration::minutes(1));
    }
    for b in &buckets {
        let in_b = |s: ActionStatus| {
            actions
                .iter()
                .filter(|a| a.status == s)
                .filter(|a| {
                    a.finished_at
                        .is_some_and(|f| f >= b.start && f < b.start + Duration::minutes(1))
                })
                .count() as i64
        };
        assert_eq!(b.completed, in_b(ActionStatus::Complete), "{b:?}");
        assert_eq!(b.failed, in_b(ActionStatus::Failed), "{b:?}");
    }
    assert_eq!(buckets.iter().map(|b| b.completed).sum::<i64>(), 8);
    assert_eq!(buckets.iter().map(|b| b.failed).sum::<i64>(), 4);
    let e = db
        .store
        .throughput(until, since, Duration::minutes(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("time range"), "{e}");
}

pub async fn ops_log_tail_and_schema_version(db: TestDb) {
    let q = db.queue();
    let id = q.enqueue(ActionSpec::new("h", json!({}))).await.unwrap();
    for _ in 0..5 {
        db.store.cancel(id, db.clock.now()).await.unwrap();
        db.store.retry(id, db.clock.now()).await.unwrap();
    }
    let every = db.store.logs(id).await.unwrap();
    assert_eq!(every.len(), 11);
    let tail = db.store.logs_tail(id, 3).await.unwrap();
    assert_eq!(tail, every[8..].to_vec(), "the last three, oldest first");
    assert!(db.store.schema_version().await.unwrap() >= 4);
}

pub async fn ops_bulk_changes_keep_their_guards(db: TestDb) {
    let q = db.queue();
    let now = db.clock.now();
    let later = q
        .enqueue(ActionSpec::new("h", json!(1)).after(Duration::hours(1)))
        .await
        .unwrap();
    let due = q.enqueue(ActionSpec::new("h", json!(2))).await.unwrap();
    let keyed = q
        .enqueue(ActionSpec::new("h", json!(3)).unique_key("k"))
        .await
        .unwrap();
    let running = q.enqueue(ActionSpec::new("r", json!(4))).await.unwrap();
    let c = db
        .store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now,
            lease_until: now + Duration::minutes(5),
            hooks: Some(&["r".to_string()]),
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(c[0].id, running);
    let gone = 999_999;

    // Run now: only pending actions due later.
    let o = db
        .store
        .run_now(&[later, due, running, gone], "ui:ann", now)
        .await
        .unwrap();
    assert_eq!(
        (o.changed, o.skipped),
        (vec![later], vec![due, running, gone])
    );
    let a = db.store.get(later).await.unwrap().unwrap();
    assert_eq!(a.scheduled_at, now);
    let log = db.store.logs(later).await.unwrap();
    assert_eq!(
        log.last().map(|l| (l.event.as_str(), l.detail.as_deref())),
        Some(("run_now", Some("ui:ann")))
    );

    // Cancel: pending and running; the running worker is fenced out.
    let o = db
        .store
        .cancel_many(&[keyed, running, gone], "ui:ann", now)
        .await
        .unwrap();
    assert_eq!((o.changed, o.skipped), (vec![keyed, running], vec![gone]));
    let r = db
        .store
        .finish(c[0].lease(), &Finish::Complete, now)
        .await
        .unwrap();
    assert_eq!(r, FinishResult::LeaseLost);
    let o = db.store.cancel_many(&[keyed], "ui:ann", now).await.unwrap();
    assert_eq!(o.skipped, vec![keyed], "already canceled");

    // Retry: a unique key taken by a newer active action skips that row, not the rest.
    let taker = q
        .enqueue(ActionSpec::new("h", json!(5)).unique_key("k"))
        .await
        .unwrap();
    assert_ne!(taker, keyed);
    let o = db
        .store
        .retry_many(&[keyed, running, due], "ui:ann", now)
        .await
        .unwrap();
    assert_eq!((o.changed, o.skipped), (vec![running], vec![due, keyed]));
    let a = db.store.get(running).await.unwrap().unwrap();
    assert_eq!((a.status, a.attempt), (ActionStatus::Pending, 0));
    assert_eq!(
        db.store.get(keyed).await.unwrap().unwrap().status,
        ActionStatus::Canceled
    );

    // Delete: never a running action; the log goes with the row.
    let c = db
        .store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now,
            lease_until: now + Duration::minutes(5),
            hooks: Some(&["r".to_string()]),
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(c[0].id, running);
    let o = db
        .store
        .delete_actions(&[keyed, due, running])
        .await
        .unwrap();
    assert_eq!((o.changed, o.skipped), (vec![due, keyed], vec![running]));
    assert!(db.store.get(keyed).await.unwrap().is_none());
    assert!(db.store.logs(keyed).await.unwrap().is_empty());
    assert!(db.store.get(running).await.unwrap().is_some());

    // Oversized lists are refused by name; nothing changes.
    let e = db
        .store
        .cancel_many(&vec![taker; 501], "ui:ann", now)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("ids"), "{e}");
    assert_eq!(
        db.store.get(taker).await.unwrap().unwrap().status,
        ActionStatus::Pending
    );
}
