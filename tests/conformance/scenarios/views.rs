//! Operator views of groups, jobs and item claims (the dashboard's overview, groups, jobs,
//! batches and claims pages): group summaries with capped counts and lag, id-keyset job and
//! claim pages walked both ways, a job's own actions (never another job's with a longer id),
//! and claim scopes with their stale claims.

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::batch::{action_group, chunk_action, finalize_action};
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, CompletionConfig};
use dockhand::jobs::{NewJob, StepAction};
use dockhand::search::{ClaimSearch, IdPage, JobSearch};
use dockhand::store::ClaimRequest;
use dockhand::{ActionSpec, ActionStatus, Clock, Identity, JobStatus};
use serde_json::json;

pub async fn ops_group_overview_counts_and_lag(db: TestDb) {
    let q = db.queue();
    let t0 = db.clock.now();
    for (group, delay_min) in [("a", -5), ("a", -2), ("a", 30), ("b", 1), ("c", -1)] {
        q.enqueue(
            ActionSpec::new("h", json!({}))
                .group(group)
                .at(t0 + Duration::minutes(delay_min)),
        )
        .await
        .unwrap();
    }
    q.enqueue(ActionSpec::new("r", json!({})).group("b"))
        .await
        .unwrap();
    let c = db
        .store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now: t0,
            lease_until: t0 + Duration::minutes(5),
            hooks: Some(&["r".to_string()]),
            routing: None,
        })
        .await
        .unwrap();
    assert_eq!(c.len(), 1);
    let stats = db.store.group_overview(t0, 100, 10).await.unwrap();
    let names: Vec<Option<&str>> = stats.iter().map(|g| g.group.as_deref()).collect();
    assert_eq!(
        names,
        vec![Some("a"), Some("b"), Some("c")],
        "no empty ungrouped row"
    );
    let a = &stats[0];
    assert_eq!((a.pending.n, a.due.n, a.running.n), (3, 2, 0));
    assert_eq!(a.oldest_due, Some(t0 - Duration::minutes(5)));
    let b = &stats[1];
    assert_eq!(
        (b.pending.n, b.due.n, b.running.n, b.oldest_due),
        (1, 0, 1, None)
    );
    // Caps: counts stop, and so does the group list.
    let capped = db.store.group_overview(t0, 2, 1).await.unwrap();
    assert_eq!(capped.len(), 1);
    assert_eq!((capped[0].pending.n, capped[0].pending.capped), (2, true));
    // Ungrouped actions get their row.
    q.enqueue(ActionSpec::new("h", json!({}))).await.unwrap();
    let stats = db.store.group_overview(t0, 100, 10).await.unwrap();
    assert_eq!(stats[0].group, None);
    assert_eq!(stats[0].pending.n, 1);
}

fn step() -> StepAction {
    StepAction {
        priority: 0,
        max_attempts: 3,
        group: None,
    }
}

/// Walks an id-paged search forwards to the end, then backwards from beyond its oldest row.
async fn walk_ids<T, F, Fut>(mut fetch: F, id: impl Fn(&T) -> i64) -> (Vec<i64>, Vec<i64>)
where
    F: FnMut(Option<i64>, Option<i64>) -> Fut,
    Fut: std::future::Future<Output = IdPage<T>>,
{
    let mut forward = Vec::new();
    let mut after = None;
    let mut last_cursor = None;
    loop {
        let page = fetch(after, None).await;
        forward.extend(page.rows.iter().map(&id));
        if let Some(r) = page.rows.last() {
            last_cursor = Some(id(r));
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    // Back from beyond the oldest row.
    let mut pages = Vec::new();
    let mut before = last_cursor.map(|c| c - 1);
    while let Some(b) = before {
        let page = fetch(None, Some(b)).await;
        pages.push(page.rows.iter().map(&id).collect::<Vec<_>>());
        before = page.prev;
    }
    pages.reverse();
    (forward, pages.concat())
}

pub async fn ops_job_pages_and_a_jobs_own_actions(db: TestDb) {
    let now = db.clock.now();
    let mut ids = Vec::new();
    for n in 0..60 {
        let job = NewJob {
            pipeline: if n % 2 == 0 {
                "even".into()
            } else {
                "odd".into()
            },
            input_refs: vec![],
            engine_data: json!({}),
            step: step(),
            idempotency_key: None,
        };
        ids.push(db.store.create_job(&job, now).await.unwrap());
    }
    let search = JobSearch {
        pipeline: Some("odd".into()),
        limit: 7,
        ..Default::default()
    };
    let (forward, backward) = walk_ids(
        |after, before| {
            let (store, s) = (
                db.store.clone(),
                JobSearch {
                    after,
                    before,
                    ..search.clone()
                },
            );
            async move { store.search_jobs(&s).await.unwrap() }
        },
        |j| j.id,
    )
    .await;
    let mut want: Vec<i64> = ids.iter().copied().skip(1).step_by(2).collect();
    want.reverse();
    assert_eq!(forward, want);
    assert_eq!(backward, want);
    let pending = db
        .store
        .search_jobs(&JobSearch {
            status: Some(JobStatus::Pending),
            limit: 500,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(pending.rows.len(), 60);
    assert!(db
        .store
        .search_jobs(&JobSearch {
            batches_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .rows
        .is_empty());

    // A job's actions: its step, chunk and finalize actions, not those of a job whose id
    // starts with the same digits.
    let (job, other) = (ids[4], ids[4] * 10 + 1);
    for p in [
        step().action(job, 1, now),
        chunk_action(job, 0, 0, action_group(None), now),
        finalize_action(job, action_group(None), now),
        step().action(other, 0, now),
        chunk_action(other, 0, 0, action_group(None), now),
        finalize_action(other, action_group(None), now),
    ] {
        db.store.enqueue(&p, now).await.unwrap();
    }
    let got = db.store.job_actions(job, 100).await.unwrap();
    let mut keys: Vec<&str> = got.iter().filter_map(|a| a.unique_key.as_deref()).collect();
    keys.sort_unstable();
    let want = [
        format!("b:{job}:0"),
        format!("f:{job}"),
        format!("j:{job}:0"),
        format!("j:{job}:1"),
    ];
    assert_eq!(keys, want.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(got.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    assert!(got.iter().all(|a| a.status == ActionStatus::Pending));
    assert_eq!(db.store.job_actions(job, 2).await.unwrap().len(), 2);
}

pub async fn ops_claim_pages_and_scopes(db: TestDb) {
    let now = db.clock.now();
    let mut descriptors = Vec::new();
    for n in 0..25 {
        let scope = if n % 5 == 0 { "feed-b" } else { "feed-a" };
        let ttl = if n % 4 == 0 {
            Duration::seconds(10)
        } else {
            Duration::minutes(10)
        };
        let req = ClaimItemRequest {
            identity: Identity::new(scope, "rss", format!("item-{n}")).unwrap(),
            job_id: Some(n),
            ttl,
            completion: CompletionConfig::default(),
            reprocess: false,
            run: None,
        };
        match db.store.claim_item(&req, now).await.unwrap() {
            ClaimOutcome::Claimed(d) => descriptors.push((n, d)),
            other => panic!("{other:?}"),
        }
    }
    // Three processed.
    for (_, d) in descriptors.iter().filter(|(n, _)| [1, 2, 3].contains(n)) {
        let done = db.store.complete_claim(d, None, now).await.unwrap();
        assert_eq!(done, dockhand::claims::CompleteOutcome::Completed);
    }
    let later = now + Duration::minutes(1);
    let scopes = db.store.claim_scopes(later, 100, 10).await.unwrap();
    let names: Vec<&str> = scopes.iter().map(|s| s.scope.as_str()).collect();
    assert_eq!(names, vec!["feed-a", "feed-b"]);
    let a = &scopes[0];
    // feed-a: n in 0..25 with n % 5 != 0 → 20 claims; 1, 2, 3 processed; stale: n % 4 == 0
    // among the held ones (4, 8, 12, 16, 24).
    assert_eq!(
        (a.claimed.n, a.processed.n, a.deferred.n, a.stale.n),
        (17, 3, 0, 5)
    );
    let b = &scopes[1];
    // feed-b: 0, 5, 10, 15, 20; stale: 0, 20.
    assert_eq!((b.claimed.n, b.processed.n, b.stale.n), (5, 0, 2));
    assert_eq!(db.store.claim_scopes(later, 100, 1).await.unwrap().len(), 1);
    let capped = db.store.claim_scopes(later, 4, 10).await.unwrap();
    assert_eq!((capped[0].claimed.n, capped[0].claimed.capped), (4, true));

    let search = ClaimSearch {
        scope: Some("feed-a".into()),
        limit: 4,
        ..Default::default()
    };
    let (forward, backward) = walk_ids(
        |after, before| {
            let (store, s) = (
                db.store.clone(),
                ClaimSearch {
                    after,
                    before,
                    ..search.clone()
                },
            );
            async move { store.search_claims(&s).await.unwrap() }
        },
        |c| c.id,
    )
    .await;
    assert_eq!(forward.len(), 20);
    assert!(forward.windows(2).all(|w| w[0] > w[1]));
    assert_eq!(backward, forward);
    let stale = db
        .store
        .search_claims(&ClaimSearch {
            stale_at: Some(later),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut jobs: Vec<i64> = stale.rows.iter().filter_map(|c| c.claim.job_id).collect();
    jobs.sort_unstable();
    assert_eq!(jobs, vec![0, 4, 8, 12, 16, 20, 24]);
    let of_job = db
        .store
        .search_claims(&ClaimSearch {
            job_id: Some(7),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_job.rows.len(), 1);
    assert_eq!(of_job.rows[0].claim.identity.item_id, "item-7");
}

pub async fn ops_paused_group_is_not_claimed_until_resumed(db: TestDb) {
    let q = db.queue();
    let now = db.clock.now();
    let mail = q
        .enqueue(ActionSpec::new("h", json!(1)).group("mail"))
        .await
        .unwrap();
    let other = q
        .enqueue(ActionSpec::new("h", json!(2)).group("mail2"))
        .await
        .unwrap();
    let loose = q.enqueue(ActionSpec::new("h", json!(3))).await.unwrap();
    assert!(db
        .store
        .set_group_paused("mail", true, "ui:ann", now)
        .await
        .unwrap());
    assert!(
        !db.store
            .set_group_paused("mail", true, "ui:bob", now)
            .await
            .unwrap(),
        "already paused"
    );
    let pauses = db.store.paused_groups().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (pauses[0].group.as_str(), pauses[0].paused_by.as_str()),
        ("mail", "ui:ann")
    );
    assert_eq!(pauses[0].paused_at, now);
    let claim = |limit| {
        let store = db.store.clone();
        async move {
            store
                .claim(&ClaimRequest {
                    owner: "w",
                    limit,
                    now,
                    lease_until: now + Duration::minutes(5),
                    hooks: None,
                    routing: None,
                })
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        }
    };
    let mut got = claim(10).await;
    got.sort_unstable();
    assert_eq!(
        got,
        vec![other, loose],
        "a paused group's actions stay pending; a group named alike does not"
    );
    assert_eq!(
        db.store.get(mail).await.unwrap().unwrap().status,
        ActionStatus::Pending
    );
    assert!(db
        .store
        .set_group_paused("mail", false, "ui:ann", now)
        .await
        .unwrap());
    assert!(
        !db.store
            .set_group_paused("mail", false, "ui:ann", now)
            .await
            .unwrap(),
        "not paused"
    );
    assert!(db.store.paused_groups().await.unwrap().is_empty());
    assert_eq!(claim(10).await, vec![mail]);
}
