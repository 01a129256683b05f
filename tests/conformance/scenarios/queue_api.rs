//! Queue API scenarios: uniqueness, unschedule, retention, bulk, queries (Action Scheduler parity).

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::store::{ClaimRequest, Finish, FinishResult, PruneCutoffs};
use dockhand::Clock;
use dockhand::{
    ActionFilter, ActionOrder, ActionQuery, ActionSpec, ActionStatus, Recurrence, ScheduleSpec,
};
use serde_json::json;

pub async fn s_a2_fifty_concurrent_unique_enqueues_make_one_row(db: TestDb) {
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let q = db.queue();
        tasks.push(tokio::spawn(async move {
            q.enqueue(
                ActionSpec::new("sync.user", json!({"user": 7}))
                    .group("crm")
                    .unique(),
            )
            .await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().expect("a duplicate is never an error"));
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "all fifty got the same id");
    let rows = db.queue().query(&ActionQuery::default()).await.unwrap();
    assert_eq!(rows.len(), 1, "exactly one row");
    assert_eq!(rows[0].id, ids[0]);
    // Different args or group are different actions; a finished one frees the key.
    let q = db.queue();
    let other = q
        .enqueue(ActionSpec::new("sync.user", json!({"user": 7})).unique())
        .await
        .unwrap();
    assert_ne!(other, ids[0]);
    q.cancel(ids[0]).await.unwrap();
    let again = q
        .enqueue(
            ActionSpec::new("sync.user", json!({"user": 7}))
                .group("crm")
                .unique(),
        )
        .await
        .unwrap();
    assert_ne!(
        again, ids[0],
        "uniqueness holds among pending and running only"
    );
    // Custom keys.
    let k1 = q
        .enqueue(ActionSpec::new("a", json!(1)).unique_key("k"))
        .await
        .unwrap();
    let k2 = q
        .enqueue(ActionSpec::new("b", json!(2)).unique_key("k"))
        .await
        .unwrap();
    assert_eq!(k1, k2);
}

pub async fn s_a8_unschedule_cancels_pending_only(db: TestDb) {
    let q = db.queue();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            q.enqueue(
                ActionSpec::new("mail", json!({"batch": 1}))
                    .group("news")
                    .priority(i),
            )
            .await
            .unwrap(),
        );
    }
    let other_group = q
        .enqueue(ActionSpec::new("mail", json!({"batch": 1})).group("ops"))
        .await
        .unwrap();
    let other_args = q
        .enqueue(ActionSpec::new("mail", json!({"batch": 2})).group("news"))
        .await
        .unwrap();
    q.schedule(
        ScheduleSpec::new(
            "mail",
            json!({"batch": 1}),
            Recurrence::every(Duration::hours(1)).unwrap(),
        )
        .group("news"),
    )
    .await
    .unwrap();
    let now = db.clock.now();
    // The first (priority 0) is running.
    let running = db
        .store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now,
            lease_until: now + Duration::seconds(30),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(running[0].id, ids[0]);
    let filter = ActionFilter {
        hook: Some("mail".into()),
        args: Some(json!({"batch": 1})),
        group: Some("news".into()),
    };
    assert_eq!(q.unschedule_all(&filter).await.unwrap(), 2);
    for id in &ids[1..] {
        assert_eq!(q.get(*id).await.unwrap().status, ActionStatus::Canceled);
    }
    for id in [other_group, other_args] {
        assert_eq!(q.get(id).await.unwrap().status, ActionStatus::Pending);
    }
    assert!(
        !q.schedules().await.unwrap()[0].enabled,
        "the recurring series stops too"
    );
    assert!(!q.has_scheduled(&filter).await.unwrap());
    // The running one finishes normally.
    let r = db
        .store
        .finish(running[0].lease(), &Finish::Complete, now)
        .await
        .unwrap();
    assert_eq!(r, FinishResult::Applied);
    assert_eq!(q.get(ids[0]).await.unwrap().status, ActionStatus::Complete);
    // unschedule_one cancels the next matching pending action only.
    let f2 = ActionFilter {
        hook: Some("mail".into()),
        ..ActionFilter::default()
    };
    let one = q.unschedule_one(&f2).await.unwrap();
    assert!(one == Some(other_group) || one == Some(other_args));
    assert_eq!(
        q.unschedule_one(&ActionFilter {
            hook: Some("none".into()),
            ..ActionFilter::default()
        })
        .await
        .unwrap(),
        None
    );
}

pub async fn s_a10_retention_prunes_old_finished_in_batches(db: TestDb) {
    let rt = db
        .runtime()
        .handler("ok", |_| async { Ok(()) })
        .handler("bad", |_| async {
            Err(dockhand::HandlerError::fatal("no"))
        })
        .concurrency(50)
        .build()
        .await
        .unwrap();
    let q = rt.queue();
    let specs = (0..25)
        .map(|i| ActionSpec::new("ok", json!({"i": i})))
        .collect();
    let done = q.enqueue_bulk(specs).await.unwrap();
    let failed = q.enqueue(ActionSpec::new("bad", json!({}))).await.unwrap();
    rt.drain(100).await.unwrap();
    let canceled = q
        .enqueue(ActionSpec::new("ok", json!("c")).after(Duration::days(100)))
        .await
        .unwrap();
    q.cancel(canceled).await.unwrap();
    let pending = q
        .enqueue(ActionSpec::new("ok", json!("p")).after(Duration::days(100)))
        .await
        .unwrap();
    let running_id = q.enqueue(ActionSpec::new("ok", json!("r"))).await.unwrap();
    let now = db.clock.now();
    db.store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now,
            lease_until: now + Duration::days(100),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();

    db.clock.advance(Duration::days(8));
    let cutoffs = PruneCutoffs {
        finished_before: db.clock.now() - Duration::days(7),
        failed_before: db.clock.now() - Duration::days(30),
        batch: 10,
    };
    let mut batches = Vec::new();
    loop {
        let n = db.store.prune(&cutoffs).await.unwrap();
        batches.push(n);
        if n < 10 {
            break;
        }
    }
    assert_eq!(
        batches,
        vec![10, 10, 6],
        "bounded batches: 25 complete + 1 canceled"
    );
    for id in done.iter().chain([&canceled]) {
        assert!(db.store.get(*id).await.unwrap().is_none());
        assert!(
            db.store.logs(*id).await.unwrap().is_empty(),
            "logs go with the action"
        );
    }
    assert_eq!(
        q.get(failed).await.unwrap().status,
        ActionStatus::Failed,
        "failed kept 30 days"
    );
    assert_eq!(q.get(pending).await.unwrap().status, ActionStatus::Pending);
    assert_eq!(
        q.get(running_id).await.unwrap().status,
        ActionStatus::Running
    );
    assert!(!db.store.logs(failed).await.unwrap().is_empty());
    db.clock.advance(Duration::days(30));
    let report = rt.run_maintenance_once().await.unwrap();
    assert_eq!(report.pruned, 1, "the failed one goes after 30 days");
    assert_eq!(q.get(pending).await.unwrap().status, ActionStatus::Pending);
}

pub async fn store_bulk_enqueue_keeps_order_and_dedupes(db: TestDb) {
    let q = db.queue();
    let existing = q
        .enqueue(ActionSpec::new("u", json!(1)).unique())
        .await
        .unwrap();
    let mut specs: Vec<ActionSpec> = (0..7003)
        .map(|i| ActionSpec::new("bulk", json!({"i": i})))
        .collect();
    specs.insert(3, ActionSpec::new("u", json!(1)).unique());
    let ids = q.enqueue_bulk(specs).await.unwrap();
    assert_eq!(ids.len(), 7004);
    assert_eq!(
        ids[3], existing,
        "a unique duplicate in a bulk resolves to the existing id"
    );
    let plain: Vec<i64> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(_, id)| *id)
        .collect();
    // Every 997th, and both sides of each statement boundary: SQLite inserts 500 rows per
    // statement on a file's enqueue connection, 3,200 through sqlx (in-memory databases), and
    // derives their ids from the statement's last one; the last statement is a short one.
    let boundaries = [
        0, 499, 500, 999, 1000, 3199, 3200, 6399, 6400, 6999, 7000, 7002,
    ];
    let checked = (0..7003).step_by(997).chain(boundaries);
    for n in checked {
        let a = q.get(plain[n]).await.unwrap();
        assert_eq!(a.args, json!({"i": n}), "ids are returned in input order");
    }
    let mut sorted = plain.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 7003);
    assert!(q.enqueue_bulk(vec![]).await.unwrap().is_empty());
}

pub async fn store_query_filters_paging_and_order(db: TestDb) {
    let q = db.queue();
    let t = db.clock.now();
    for i in 0..10i64 {
        q.enqueue(
            ActionSpec::new(if i % 2 == 0 { "even" } else { "odd" }, json!({"i": i}))
                .group(if i < 5 { "low" } else { "high" })
                .at(t + Duration::minutes(i)),
        )
        .await
        .unwrap();
    }
    let run = |qq: ActionQuery| {
        let q = q.clone();
        async move { q.query(&qq).await.unwrap() }
    };
    let evens = run(ActionQuery {
        filter: ActionFilter {
            hook: Some("even".into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    assert_eq!(evens.len(), 5);
    let args = run(ActionQuery {
        filter: ActionFilter {
            args: Some(json!({"i": 3})),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    assert_eq!(args.len(), 1);
    assert_eq!(args[0].hook, "odd");
    let high = run(ActionQuery {
        filter: ActionFilter {
            group: Some("high".into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    assert_eq!(high.len(), 5);
    let window = run(ActionQuery {
        scheduled_from: Some(t + Duration::minutes(2)),
        scheduled_to: Some(t + Duration::minutes(5)),
        ..Default::default()
    })
    .await;
    assert_eq!(
        window
            .iter()
            .map(|a| a.args["i"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    let page = run(ActionQuery {
        limit: 3,
        offset: 3,
        order: ActionOrder::ScheduledDesc,
        ..Default::default()
    })
    .await;
    assert_eq!(
        page.iter()
            .map(|a| a.args["i"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![6, 5, 4]
    );
    let by_id = run(ActionQuery {
        limit: 2,
        order: ActionOrder::IdDesc,
        ..Default::default()
    })
    .await;
    assert!(by_id[0].id > by_id[1].id);
    let now = db.clock.now();
    db.store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now,
            lease_until: now + Duration::seconds(30),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap();
    let claimed = run(ActionQuery {
        claimed: Some(true),
        ..Default::default()
    })
    .await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].status, ActionStatus::Running);
    let pending = run(ActionQuery {
        statuses: vec![ActionStatus::Pending],
        claimed: Some(false),
        ..Default::default()
    })
    .await;
    assert_eq!(pending.len(), 9);
    // By hook and status: each status set reads through its own index (SQLite 0019).
    assert_eq!(
        claimed[0].hook, "even",
        "the one due action (i = 0) is claimed"
    );
    for (hook, statuses, want) in [
        ("even", vec![ActionStatus::Running], 1),
        ("even", vec![ActionStatus::Pending], 4),
        (
            "even",
            vec![ActionStatus::Pending, ActionStatus::Running],
            5,
        ),
        (
            "even",
            vec![ActionStatus::Running, ActionStatus::Complete],
            1,
        ),
        ("odd", vec![ActionStatus::Running], 0),
        ("odd", vec![ActionStatus::Pending, ActionStatus::Running], 5),
    ] {
        let found = run(ActionQuery {
            filter: ActionFilter {
                hook: Some(hook.into()),
                ..Default::default()
            },
            statuses: statuses.clone(),
            ..Default::default()
        })
        .await;
        assert_eq!(found.len(), want, "hook {hook}, statuses {statuses:?}");
        assert!(found
            .iter()
            .all(|a| a.hook == hook && statuses.contains(&a.status)));
    }
    let created = run(ActionQuery {
        created_from: Some(t),
        created_to: Some(t + Duration::seconds(1)),
        ..Default::default()
    })
    .await;
    assert_eq!(created.len(), 10);
    assert!(q
        .query(&ActionQuery {
            limit: -1,
            ..Default::default()
        })
        .await
        .is_err());
}

pub async fn store_next_scheduled_and_has_scheduled(db: TestDb) {
    let q = db.queue();
    let t = db.clock.now();
    let f = |hook: &str| ActionFilter {
        hook: Some(hook.into()),
        ..Default::default()
    };
    assert_eq!(q.next_scheduled(&f("a")).await.unwrap(), None);
    assert!(!q.has_scheduled(&f("a")).await.unwrap());
    q.enqueue(ActionSpec::new("a", json!({})).at(t + Duration::hours(2)))
        .await
        .unwrap();
    q.enqueue(ActionSpec::new("a", json!({})).at(t + Duration::hours(1)))
        .await
        .unwrap();
    assert_eq!(
        q.next_scheduled(&f("a")).await.unwrap(),
        Some(t + Duration::hours(1))
    );
    assert!(q.has_scheduled(&f("a")).await.unwrap());
    // A schedule counts before its occurrence is materialised.
    q.schedule(
        ScheduleSpec::new(
            "b",
            json!({}),
            Recurrence::every(Duration::hours(3)).unwrap(),
        )
        .starting_at(t + Duration::hours(3)),
    )
    .await
    .unwrap();
    assert_eq!(
        q.next_scheduled(&f("b")).await.unwrap(),
        Some(t + Duration::hours(3))
    );
}
