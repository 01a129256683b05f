//! MySQL-only tests of what the conformance suite does not race hard: item claims under
//! contention (64 tasks on one item), exact identity matching (case and trailing spaces),
//! duplicate child creation, children finishing at once, and disjoint worklist leases. Each
//! test runs on its own database and is skipped when `DOCKHAND_TEST_MYSQL_URL` is unset.

use super::super::MySqlStore;
use crate::batch::{ChildOutcome, ChildSpec, FanOutOutcome, FenceOutcome, WorkItem};
use crate::claims::ledger::{TrackedItems, TRACKED_ITEMS};
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, CompleteOutcome, CompletionConfig,
    CompletionRegistry, Identity,
};
use crate::jobs::{BridgeOutcome, NewJob, StepAction};
use crate::state::JobStatus;
use crate::store::test_lease::running_lease;
use crate::store::Store;
use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;

/// A migrated store on a fresh database, and what [`drop_db`] needs; `None` without a server.
async fn open(test: &str) -> Option<(Arc<MySqlStore>, String, String)> {
    let url = std::env::var("DOCKHAND_TEST_MYSQL_URL").ok()?;
    let name = format!("dockhand_m2_{test}_{}", std::process::id());
    MySqlStore::drop_database(&url, &name).await.unwrap();
    MySqlStore::create_database(&url, &name).await.unwrap();
    let opts = MySqlStore::url_for_database(&url, &name).unwrap();
    let store = MySqlStore::connect_with(opts, 80).await.unwrap();
    store.migrate().await.unwrap();
    Some((Arc::new(store), url, name))
}

async fn drop_db(store: Arc<MySqlStore>, url: &str, name: &str) {
    store.close().await;
    MySqlStore::drop_database(url, name).await.unwrap();
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
}

fn step() -> StepAction {
    StepAction {
        priority: 10,
        max_attempts: 3,
        group: None,
    }
}

fn request(item: &str, job: i64) -> ClaimItemRequest {
    ClaimItemRequest {
        identity: Identity::new("shared:feed", "rss", item).unwrap(),
        job_id: Some(job),
        ttl: Duration::minutes(5),
        completion: CompletionConfig::default(),
        reprocess: false,
        run: None,
    }
}

#[tokio::test]
async fn sixty_four_tasks_racing_for_one_item_make_one_owner_and_no_error() {
    let Some((store, url, name)) = open("race").await else {
        return;
    };
    for round in 0..3 {
        let tasks: Vec<_> = (1..=64)
            .map(|job| {
                let store = store.clone();
                tokio::spawn(async move { store.claim_item(&request("item-1", job), t0()).await })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap().unwrap() {
                ClaimOutcome::Claimed(d) => winners.push(d),
                ClaimOutcome::HeldByOther => {}
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one owner");
        let claim = store
            .get_claim(&winners[0].identity)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claim.token.as_deref(), Some(winners[0].token.as_str()));
        assert!(store.release_claim(&winners[0], false, t0()).await.unwrap());
    }
    drop_db(store, &url, &name).await;
}

#[tokio::test]
async fn identities_differing_in_case_or_trailing_space_are_distinct() {
    let Some((store, url, name)) = open("exact").await else {
        return;
    };
    let items = ["a", "a ", "A", "a  "];
    let mut tokens = Vec::new();
    for (job, item) in items.iter().enumerate() {
        let job = i64::try_from(job).unwrap() + 1;
        let ClaimOutcome::Claimed(d) = store.claim_item(&request(item, job), t0()).await.unwrap()
        else {
            panic!("{item:?} should be free");
        };
        tokens.push(d);
    }
    for (d, item) in tokens.iter().zip(items) {
        let claim = store.get_claim(&d.identity).await.unwrap().unwrap();
        assert_eq!(claim.identity.item_id, item);
        assert_eq!(claim.token.as_deref(), Some(d.token.as_str()));
    }
    // A token with a trailing space is another token.
    let mut stale = tokens[0].clone();
    stale.token.push(' ');
    assert!(!store.release_claim(&stale, false, t0()).await.unwrap());
    assert_eq!(
        store.complete_claim(&stale, None, t0()).await.unwrap(),
        CompleteOutcome::Lost
    );
    // The scope filter is exact too.
    let scoped = |scope: &str| ClaimFilter {
        scope: Some(scope.into()),
        ..ClaimFilter::default()
    };
    assert_eq!(
        store
            .list_claims(&scoped("shared:feed"))
            .await
            .unwrap()
            .len(),
        4
    );
    assert!(store
        .list_claims(&scoped("shared:feed "))
        .await
        .unwrap()
        .is_empty());
    // The tracked-items ledger keys items exactly.
    let handler = Arc::new(TrackedItems);
    for (rev, d) in tokens.iter().take(2).enumerate() {
        let mut d = d.clone();
        d.completion = CompletionConfig {
            handler: Some(TRACKED_ITEMS.into()),
            payload: json!({"namespace": "ns", "revision": rev + 1}),
            retain_processed: true,
        };
        let done = store.complete_claim(&d, Some(handler.clone()), t0()).await;
        assert_eq!(done.unwrap(), CompleteOutcome::Completed);
    }
    let first = store.tracked_item("ns", "a").await.unwrap().unwrap();
    let second = store.tracked_item("ns", "a ").await.unwrap().unwrap();
    assert_eq!((first.revision, second.revision), (1, 2));
    assert!(store.tracked_item("ns", "A").await.unwrap().is_none());
    drop_db(store, &url, &name).await;
}

/// A processing parent fanned out over `n` items (no sidecars).
async fn parent_with_worklist(store: &MySqlStore, n: usize) -> i64 {
    let job = NewJob {
        pipeline: "p".into(),
        input_refs: Vec::new(),
        engine_data: json!({}),
        step: step(),
        idempotency_key: None,
    };
    let parent = store.create_job(&job, t0()).await.unwrap();
    assert!(store
        .start_step(parent, 0, t0())
        .await
        .unwrap()
        .job()
        .is_some());
    let items: Vec<WorkItem> = (0..n)
        .map(|i| WorkItem {
            payload_ref: format!("v1:{i:064x}"),
            sidecar: Vec::new(),
        })
        .collect();
    let out = store
        .fan_out(parent, None, &items, (10, 1), "c1", t0())
        .await;
    assert_eq!(out.unwrap(), FanOutOutcome::Created);
    parent
}

fn child(parent: i64, idx: i32) -> ChildSpec {
    ChildSpec {
        parent_id: parent,
        idx,
        pipeline: "p".into(),
        step_index: 1,
        input_refs: vec![format!("v1:{idx:064x}")],
        claim_tokens: Vec::new(),
        claim_ttl: Duration::minutes(30),
        step: step(),
        run_by: None,
    }
}

#[tokio::test]
async fn concurrent_children_are_created_once_and_finish_with_one_finalize() {
    let Some((store, url, name)) = open("children").await else {
        return;
    };
    let n = 20;
    let parent = parent_with_worklist(&store, n).await;
    let run = running_lease(&*store, "w", t0()).await;
    // Sixteen deliveries of row 0 at once: one child.
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.create_child(&child(parent, 0), run, t0()).await })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            ChildOutcome::Created(id) => {
                created += 1;
                ids.insert(id);
            }
            ChildOutcome::Adopted(id) => {
                ids.insert(id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((created, ids.len()), (1, 1));
    // The other rows, from concurrent chunk deliveries.
    let tasks: Vec<_> = (1..n)
        .map(|idx| {
            let store = store.clone();
            let idx = i32::try_from(idx).unwrap();
            tokio::spawn(async move { store.create_child(&child(parent, idx), run, t0()).await })
        })
        .collect();
    let mut children: Vec<i64> = ids.into_iter().collect();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            ChildOutcome::Created(id) => children.push(id),
            other => panic!("unexpected {other:?}"),
        }
    }
    let fenced = store.fence_batch(parent, t0()).await.unwrap();
    assert_eq!(
        fenced,
        FenceOutcome::Fenced {
            finalize_enqueued: false
        }
    );
    // Every child finishes at once; each bumps the parent's counters in its bridge.
    let registry = Arc::new(CompletionRegistry::with_builtins());
    let tasks: Vec<_> = children
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let (store, registry) = (store.clone(), registry.clone());
            let status = if i % 2 == 0 {
                JobStatus::Completed
            } else {
                JobStatus::Failed
            };
            tokio::spawn(async move {
                store.start_step(id, 1, t0()).await?;
                store.finish_job(id, status, None, &registry, t0()).await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), BridgeOutcome::Finished);
    }
    let st = store.batch_state(parent).await.unwrap().unwrap();
    assert_eq!(
        (
            st.children_total,
            st.children_terminal,
            st.children_completed,
            st.children_failed
        ),
        (20, 20, 10, 10)
    );
    let finalize: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM dockhand_actions WHERE unique_key = ? AND status = 'pending'",
    )
    .bind(format!("f:{parent}"))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(finalize, 1, "exactly one finalize action");
    let violations = store.audit(t0(), Duration::minutes(1)).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    drop_db(store, &url, &name).await;
}

#[tokio::test]
async fn concurrent_leases_take_disjoint_rows() {
    let Some((store, url, name)) = open("lease").await else {
        return;
    };
    let parent = parent_with_worklist(&store, 40).await;
    let until = t0() + Duration::minutes(5);
    // Eight chunk runs, each with its own action lease, lease at once.
    let mut runs = Vec::new();
    for w in 0..8 {
        runs.push(running_lease(&*store, &format!("w{w}"), t0()).await);
    }
    let tasks: Vec<_> = runs
        .into_iter()
        .map(|run| {
            let store = store.clone();
            tokio::spawn(async move { store.lease_work(parent, 5, run, until, t0()).await })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in tasks {
        for row in t.await.unwrap().unwrap() {
            assert!(seen.insert(row.idx), "row {} leased twice", row.idx);
        }
    }
    assert_eq!(seen.len(), 40);
    let st = store.batch_state(parent).await.unwrap().unwrap();
    assert_eq!((st.ready, st.leased), (0, 40));
    drop_db(store, &url, &name).await;
}

/// `create_children` reads the parent unlocked and takes its lock only with its last write
/// (`ParentLock::Last`). A stop that commits while it waits for that lock makes the write match
/// nothing; the attempt is rolled back and runs again with the parent locked first, which
/// discards the rows (batch stopped): no child of a stopped batch, whatever the interleaving.
#[tokio::test]
async fn a_stop_committed_while_create_children_waits_for_the_parent_creates_no_child() {
    let Some((store, url, name)) = open("stop_race").await else {
        return;
    };
    let parent = parent_with_worklist(&store, 3).await;
    let run = running_lease(&*store, "w", t0()).await;
    let leased = store
        .lease_work(parent, 3, run, t0() + Duration::minutes(5), t0())
        .await
        .unwrap();
    assert_eq!(leased.len(), 3);
    // A stop under way: the parent locked and marked, not committed yet.
    let mut stop = store.pool().begin().await.unwrap();
    sqlx::query("UPDATE dockhand_jobs SET batch_outcome = ? WHERE id = ?")
        .bind(crate::batch::outcome::STOPPED)
        .bind(parent)
        .execute(&mut *stop)
        .await
        .unwrap();
    let creating = {
        let store = store.clone();
        tokio::spawn(async move {
            let specs = [child(parent, 0), child(parent, 1)];
            store.create_children(&specs, run, t0()).await
        })
    };
    // Wait (a signal from the server, not a sleep) until the creation's last write, the
    // parent's `children_total`, is in progress: it waits there for the stop's lock.
    let waiting = async {
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.processlist
                 WHERE info LIKE 'UPDATE dockhand_jobs SET children_total%'",
            )
            .fetch_one(store.pool())
            .await
            .unwrap();
            if n > 0 || creating.is_finished() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
        .await
        .expect("create_children neither waited for the parent's lock nor ended");
    assert!(
        !creating.is_finished(),
        "create_children ended without waiting for the parent's lock: {:?}",
        creating.await
    );
    stop.commit().await.unwrap();
    let out = creating.await.unwrap().unwrap();
    assert_eq!(
        out,
        vec![ChildOutcome::Discarded(crate::batch::DiscardCause::BatchStopped); 2]
    );
    let children: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM dockhand_jobs WHERE parent_id = ?")
            .bind(parent)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(children, 0, "no child of a stopped batch");
    drop_db(store, &url, &name).await;
}
