//! Group limits (issue 17 item 4; S-G1, S-G2): a group's concurrency and rate limits hold
//! across runtimes sharing the database, measured from the action rows' recorded start and
//! finish times; they leave other groups alone, count buffered (claimed-ahead) actions as
//! running, hold in finish-and-claim rounds, and a cleared limit releases the waiting actions.
//!
//! The store-level scenarios run on the frozen clock, claim by claim. S-G1 and S-G2 run three
//! runtimes on the system clock (their rows' times are the evidence) and wait for handler
//! signals, never for time.

use crate::harness::TestDb;
use chrono::Duration;
use dockhand::store::{ClaimRequest, Finish, FinishResult, Lease};
use dockhand::{ActionSpec, ActionStatus, Clock, DynStore, GroupLimit, RateLimit, SystemClock};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Awaits a signal the scenario depends on, failing (instead of hanging) if it never comes.
async fn signal<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(std::time::Duration::from_secs(120), f).await {
        Ok(v) => v,
        Err(_) => panic!("no signal within 120 s: {what}"),
    }
}

fn concurrency(n: u32) -> GroupLimit {
    GroupLimit {
        concurrency: Some(n),
        rate: None,
    }
}

fn rate(n: u32, ms: u64) -> GroupLimit {
    GroupLimit {
        concurrency: None,
        rate: Some(RateLimit::new(n, std::time::Duration::from_millis(ms))),
    }
}

/// Claims up to `limit` actions at `now` as `owner`: (id, group, token).
async fn claim(
    store: &DynStore,
    owner: &str,
    limit: i64,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<(i64, Option<String>, i64)> {
    store
        .claim(&ClaimRequest {
            owner,
            limit,
            now,
            lease_until: now + Duration::minutes(5),
            hooks: None,
            routing: None,
        })
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.id, c.group, c.token))
        .collect()
}

fn in_group(claimed: &[(i64, Option<String>, i64)], g: &str) -> usize {
    claimed
        .iter()
        .filter(|(_, group, _)| group.as_deref() == Some(g))
        .count()
}

async fn enqueue(q: &dockhand::Queue, group: Option<&str>, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mut spec = ActionSpec::new("h", json!({ "i": i, "g": group }));
        if let Some(g) = group {
            spec = spec.group(g);
        }
        ids.push(q.enqueue(spec).await.unwrap());
    }
    ids
}

/// The most actions whose recorded [start, finish) intervals overlap at one instant.
fn max_overlap(times: &[(Option<i64>, Option<i64>)]) -> usize {
    let mut events: Vec<(i64, i32)> = Vec::new();
    for (s, f) in times {
        let (Some(s), Some(f)) = (s, f) else {
            panic!("an action without a start or finish time: {times:?}")
        };
        events.push((*s, 1));
        events.push((*f, -1));
    }
    // A finish at the same millisecond as a start comes first: intervals are half-open.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// S-G1: limit 2 on group `g`, three runtimes of concurrency 4 (claiming ahead, two on stores
/// of their own), 30 actions of 50 ms: never more than 2 overlap, by the rows' times.
pub async fn s_g1_concurrency_limit_holds_across_three_runtimes(db: TestDb) {
    db.queue()
        .set_group_limit("g", concurrency(2))
        .await
        .unwrap();
    let (done, all_done) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let (inside, most_inside) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut handles = Vec::new();
    let mut queue = None;
    for i in 0..3 {
        let store = if i == 0 {
            db.store.clone()
        } else {
            db.open_another().await
        };
        let (d, a, n, m) = (
            done.clone(),
            all_done.clone(),
            inside.clone(),
            most_inside.clone(),
        );
        let rt = db
            .runtime_on(store)
            .clock(Arc::new(SystemClock))
            .concurrency(4)
            .poll_interval(std::time::Duration::from_millis(10))
            .handler("h", move |_ctx| {
                let (d, a, n, m) = (d.clone(), a.clone(), n.clone(), m.clone());
                async move {
                    let now = n.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    n.fetch_sub(1, Ordering::SeqCst);
                    if d.fetch_add(1, Ordering::SeqCst) + 1 == 30 {
                        a.notify_one();
                    }
                    Ok(())
                }
            })
            .build()
            .await
            .unwrap();
        queue.get_or_insert_with(|| rt.queue().clone());
        handles.push(rt.start().await.unwrap());
    }
    let q = queue.unwrap();
    let ids = enqueue(&q, Some("g"), 30).await;
    signal("30 actions handled", all_done.notified()).await;
    for h in handles {
        h.shutdown().await;
    }
    for id in &ids {
        assert_eq!(q.get(*id).await.unwrap().status, ActionStatus::Complete);
    }
    let times = db.start_finish_ms("g").await;
    assert_eq!(times.len(), 30);
    let most = max_overlap(&times);
    assert!(most <= 2, "{most} actions of `g` overlapped: {times:?}");
    assert!(most_inside.load(Ordering::SeqCst) <= 2);
}

/// S-G2: 10 starts per second on group `h`, three runtimes: no one-second window of the rows'
/// start times holds more than 10.
pub async fn s_g2_rate_limit_holds_in_every_one_second_window(db: TestDb) {
    db.queue()
        .set_group_limit("h", rate(10, 1000))
        .await
        .unwrap();
    let (done, all_done) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let mut handles = Vec::new();
    let mut queue = None;
    for i in 0..3 {
        let store = if i == 0 {
            db.store.clone()
        } else {
            db.open_another().await
        };
        let (d, a) = (done.clone(), all_done.clone());
        let rt = db
            .runtime_on(store)
            .clock(Arc::new(SystemClock))
            .concurrency(4)
            .poll_interval(std::time::Duration::from_millis(10))
            .handler("h", move |_ctx| {
                let (d, a) = (d.clone(), a.clone());
                async move {
                    if d.fetch_add(1, Ordering::SeqCst) + 1 == 25 {
                        a.notify_one();
                    }
                    Ok(())
                }
            })
            .build()
            .await
            .unwrap();
        queue.get_or_insert_with(|| rt.queue().clone());
        handles.push(rt.start().await.unwrap());
    }
    enqueue(&queue.unwrap(), Some("h"), 25).await;
    signal("25 actions handled", all_done.notified()).await;
    for h in handles {
        h.shutdown().await;
    }
    let mut starts: Vec<i64> = db
        .start_finish_ms("h")
        .await
        .into_iter()
        .map(|(s, _)| s.expect("started"))
        .collect();
    starts.sort_unstable();
    assert_eq!(starts.len(), 25);
    for (i, s) in starts.iter().enumerate() {
        let within = starts[i..].iter().take_while(|t| **t < s + 1000).count();
        assert!(within <= 10, "{within} starts in [{s}, {s}+1s): {starts:?}");
    }
    // 25 starts at 10 per second need more than two seconds.
    assert!(starts[24] - starts[0] >= 2000, "{starts:?}");
}

/// Set, list and clear; bad input names its field.
pub async fn group_limits_are_set_listed_and_cleared(db: TestDb) {
    let q = db.queue();
    assert!(q.set_group_limit("g", concurrency(3)).await.unwrap());
    let both = GroupLimit {
        concurrency: Some(2),
        rate: Some(RateLimit::new(5, std::time::Duration::from_secs(60))),
    };
    assert!(!q.set_group_limit("g", both).await.unwrap(), "replaced");
    let listed = q.group_limits().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].group.as_str(),
            listed[0].limit,
            listed[0].set_by.as_str()
        ),
        ("g", both, "api")
    );
    assert_eq!((listed[0].running, listed[0].recent_starts), (0, 0));
    assert_eq!(listed[0].set_at, db.clock.now());
    for (group, limit, field) in [
        ("g", concurrency(0), "invalid concurrency"),
        ("g", rate(0, 1000), "invalid rate"),
        ("g", rate(1, 0), "invalid rate"),
        ("g", GroupLimit::default(), "invalid limit"),
        ("", concurrency(1), "invalid group"),
    ] {
        let e = q
            .set_group_limit(group, limit)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(field), "{e}");
    }
    assert_eq!(q.group_limits().await.unwrap()[0].limit, both, "unchanged");
    assert!(q.clear_group_limit("g").await.unwrap());
    assert!(!q.clear_group_limit("g").await.unwrap());
    assert!(q.group_limits().await.unwrap().is_empty());
}

/// A concurrency limit at the store: other groups are claimed as usual; the limited group
/// up to its limit, whichever store claims; a finish frees a slot, but not one stamped later
/// than the claim's `now`; clearing releases the rest.
pub async fn group_concurrency_limit_leaves_other_groups_and_clears(db: TestDb) {
    let q = db.queue();
    let now = db.clock.now();
    enqueue(&q, Some("g"), 5).await;
    enqueue(&q, Some("other"), 3).await;
    enqueue(&q, None, 2).await;
    q.set_group_limit("g", concurrency(2)).await.unwrap();
    // Another store, which has not seen the limit yet: its first claim leaves `g` out.
    let other = db.open_another().await;
    let mut got = claim(&other, "w1", 10, now).await;
    got.extend(claim(&other, "w1", 10, now).await);
    got.extend(claim(&db.store, "w2", 10, now).await);
    assert_eq!(got.len(), 7, "{got:?}");
    assert_eq!(in_group(&got, "g"), 2);
    assert_eq!(in_group(&got, "other"), 3);
    assert!(claim(&db.store, "w2", 10, now).await.is_empty());
    let listed = q.group_limits().await.unwrap();
    assert_eq!(listed[0].running, 2);

    let g: Vec<(i64, i64)> = got
        .iter()
        .filter(|(_, group, _)| group.as_deref() == Some("g"))
        .map(|(id, _, token)| (*id, *token))
        .collect();
    let finish = |id: i64, token: i64, at| {
        let store = db.store.clone();
        async move {
            let r = store
                .finish(Lease { id, token }, &Finish::Complete, at)
                .await
                .unwrap();
            assert_eq!(r, FinishResult::Applied);
        }
    };
    finish(g[0].0, g[0].1, now).await;
    let next = claim(&other, "w1", 10, now).await;
    assert_eq!(in_group(&next, "g"), 1, "a finish frees one slot");
    // Finished at a time after the next claim's `now` (a faster clock): by the rows' times
    // it still runs then, so the slot is not free yet at `now`.
    finish(g[1].0, g[1].1, now + Duration::seconds(1)).await;
    assert!(claim(&db.store, "w2", 10, now).await.is_empty());
    let later = claim(&db.store, "w2", 10, now + Duration::seconds(1)).await;
    assert_eq!(in_group(&later, "g"), 1);
    assert!(claim(&db.store, "w2", 10, now + Duration::seconds(1))
        .await
        .is_empty());
    assert!(q.clear_group_limit("g").await.unwrap());
    let rest = claim(&other, "w1", 10, now + Duration::seconds(1)).await;
    assert_eq!(in_group(&rest, "g"), 1, "cleared: the last one is claimed");
}

/// A rate limit at the store: at most N starts in any window of the period, on the claims'
/// own clock; retries count as starts.
pub async fn group_rate_limit_counts_starts_per_window(db: TestDb) {
    let q = db.queue();
    let now = db.clock.now();
    enqueue(&q, Some("r"), 10).await;
    q.set_group_limit("r", rate(3, 1000)).await.unwrap();
    let first = claim(&db.store, "w", 10, now).await;
    assert_eq!(in_group(&first, "r"), 3);
    assert!(claim(&db.store, "w", 10, now).await.is_empty());
    let ms = Duration::milliseconds;
    assert!(claim(&db.store, "w", 10, now + ms(999)).await.is_empty());
    let listed = q.group_limits().await.unwrap();
    assert_eq!(listed[0].recent_starts, 3);
    let second = claim(&db.store, "w", 2, now + ms(1000)).await;
    assert_eq!(second.len(), 2, "the window (now, now+1s] is empty again");
    let third = claim(&db.store, "w", 10, now + ms(1500)).await;
    assert_eq!(third.len(), 1, "2 of 3 used in (0.5s, 1.5s]");
    // A retried action starts again, and its second start counts.
    let (id, _, token) = first[0].clone();
    let _ = db
        .store
        .finish(
            Lease { id, token },
            &Finish::Retry {
                error: "again".into(),
                at: now + ms(2000),
            },
            now + ms(2000),
        )
        .await
        .unwrap();
    let fourth = claim(&db.store, "w", 10, now + ms(2000)).await;
    assert_eq!(fourth.len(), 2, "1 start in (1s, 2s]: 2 left");
    let fifth = claim(&db.store, "w", 10, now + ms(3000)).await;
    assert_eq!(
        fifth.len(),
        3,
        "the last 3, the retried one last (due at 2s)"
    );
    assert_eq!(fifth[2].0, id, "{fifth:?}");
    assert_eq!(q.group_limits().await.unwrap()[0].recent_starts, 3);
}

/// Claimed-ahead actions count as running: a runtime of one slot whose handler blocks holds
/// the group's limit with one running and one buffered action; nothing else of the group can
/// be claimed, other groups can.
pub async fn group_limit_counts_buffered_actions(db: TestDb) {
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, g, r) = (started.clone(), go.clone(), release.clone());
    let rt = db
        .runtime()
        .concurrency(1)
        .prefetch(4)
        .only_registered_hooks(true)
        .poll_interval(std::time::Duration::from_millis(10))
        .handler("h", move |_ctx| {
            let (s, g, r) = (s.clone(), g.clone(), r.clone());
            async move {
                if !r.load(Ordering::SeqCst) {
                    s.notify_one();
                    g.notified().await;
                }
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let q = rt.queue().clone();
    q.set_group_limit("g", concurrency(2)).await.unwrap();
    let ids = enqueue(&q, Some("g"), 5).await;
    let handle = rt.start().await.unwrap();
    signal("handler started", started.notified()).await;
    let mut running = 0;
    for id in &ids {
        if q.get(*id).await.unwrap().status == ActionStatus::Running {
            running += 1;
        }
    }
    assert_eq!(running, 2, "one running, one buffered");
    // Another runner (a hook this runtime does not serve, so it cannot take it first).
    let other = db.open_another().await;
    q.enqueue(ActionSpec::new("elsewhere", json!({})).group("free"))
        .await
        .unwrap();
    let got = claim(&other, "w2", 10, db.clock.now()).await;
    assert_eq!((got.len(), in_group(&got, "free")), (1, 1), "{got:?}");
    release.store(true, Ordering::SeqCst);
    go.notify_one();
    handle.shutdown().await;
}

/// A paused, limited group is not claimed; resumed, it is claimed up to its limit. A round
/// (finishes and the next claim) keeps the limit too.
pub async fn paused_limited_group_and_rounds_keep_the_limit(db: TestDb) {
    let q = db.queue();
    let now = db.clock.now();
    enqueue(&q, Some("g"), 6).await;
    q.set_group_limit("g", concurrency(2)).await.unwrap();
    db.store
        .set_group_paused("g", true, "test", now)
        .await
        .unwrap();
    assert!(claim(&db.store, "w", 10, now).await.is_empty());
    db.store
        .set_group_paused("g", false, "test", now)
        .await
        .unwrap();
    let got = claim(&db.store, "w", 10, now).await;
    assert_eq!(in_group(&got, "g"), 2);
    let items: Vec<(Lease, Finish)> = got
        .iter()
        .map(|(id, _, token)| {
            (
                Lease {
                    id: *id,
                    token: *token,
                },
                Finish::Complete,
            )
        })
        .collect();
    let round = db
        .store
        .finish_and_claim(
            &items,
            &ClaimRequest {
                owner: "w",
                limit: 10,
                now,
                lease_until: now + Duration::minutes(5),
                hooks: None,
                routing: None,
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(round.finished.len(), 2);
    let claimed = round.claimed.unwrap();
    assert_eq!(claimed.len(), 2, "two finished, two more started");
    assert!(claim(&db.store, "w", 10, now).await.is_empty());
}
