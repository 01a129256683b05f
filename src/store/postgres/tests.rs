//! Smoke tests of the PostgreSQL store against a live server, each in a fresh schema. Skipped
//! (with a printed line) unless `DOCKHAND_TEST_POSTGRES_URL` is set.

use super::PgStore;
use crate::action::{ActionFilter, ActionQuery};
use crate::schedule::{Recurrence, ScheduleSpec};
use crate::store::{ClaimRequest, Finish, FinishResult, Lease, PruneCutoffs, Store};
use crate::ActionSpec;
use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;
use std::sync::Arc;

/// An instant with sub-millisecond digits, to check that times are stored in whole ms.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap() + Duration::nanoseconds(123_456_789)
}

/// A migrated store in a fresh schema, or `None` (skipped) without a server URL.
async fn fresh(test: &str) -> Option<(PgStore, String, String)> {
    let Some(url) = std::env::var("DOCKHAND_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        println!("SKIPPED postgres::{test}: set DOCKHAND_TEST_POSTGRES_URL to run it");
        return None;
    };
    let schema = format!("dh_unit_{}", uuid::Uuid::new_v4().simple());
    let store = PgStore::connect_in_schema(&url, &schema).await.unwrap();
    store.migrate().await.unwrap();
    Some((store, url, schema))
}

async fn cleanup(store: PgStore, url: &str, schema: &str) {
    store.close().await;
    PgStore::drop_schema(url, schema).await.unwrap();
}

fn req(owner: &str, now: DateTime<Utc>, limit: i64) -> ClaimRequest<'_> {
    ClaimRequest {
        owner,
        limit,
        now,
        lease_until: now + Duration::seconds(30),
        hooks: None,
    }
}

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

// ----- jobs, the terminal bridge and item claims ---------------------------------------------

mod jobs_and_claims {
    use super::{cleanup, fresh, t0};
    use crate::action::{ActionFilter, ActionQuery};
    use crate::claims::ledger::{TrackedItems, TRACKED_ITEMS};
    use crate::claims::{
        ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimStatus, CompleteOutcome,
        CompletionConfig, CompletionContext, CompletionHandler, CompletionRegistry, CompletionTx,
        Descriptor, Identity,
    };
    use crate::jobs::{packets, BridgeOutcome, JobFilter, NewJob, StepAction, STEP_HOOK};
    use crate::state::JobStatus;
    use crate::store::Store;
    use async_trait::async_trait;
    use chrono::Duration;
    use serde_json::json;
    use std::sync::Arc;

    fn tracked(namespace: &str) -> CompletionConfig {
        CompletionConfig {
            handler: Some(TRACKED_ITEMS.into()),
            payload: json!({ "namespace": namespace, "revision": 2 }),
            retain_processed: true,
        }
    }

    fn req(item: &str, job: Option<i64>, completion: CompletionConfig) -> ClaimItemRequest {
        ClaimItemRequest {
            identity: Identity::new("step-a", "rss", item).unwrap(),
            job_id: job,
            ttl: Duration::minutes(5),
            completion,
            reprocess: false,
        }
    }

    fn claimed(o: ClaimOutcome) -> Descriptor {
        match o {
            ClaimOutcome::Claimed(d) => d,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn step() -> StepAction {
        StepAction {
            priority: 0,
            max_attempts: 3,
            group: None,
        }
    }

    async fn new_job(s: &super::PgStore) -> i64 {
        let job = NewJob {
            pipeline: "feed".into(),
            input_refs: vec![],
            engine_data: json!({}),
            step: step(),
        };
        s.create_job(&job, t0()).await.unwrap()
    }

    /// Writes the tracked-items row, then fails.
    struct WriteThenFail;

    #[async_trait]
    impl CompletionHandler for WriteThenFail {
        async fn complete(
            &self,
            tx: CompletionTx<'_>,
            ctx: &CompletionContext,
        ) -> std::result::Result<(), String> {
            TrackedItems.complete(tx, ctx).await?;
            Err("downstream said no".into())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn claim_race_takeover_stale_token_and_ledger() {
        let Some((s, url, schema)) = fresh("claim_race").await else {
            return;
        };
        let s = Arc::new(s);
        let now = t0();
        // 16 racers on a fresh item, then 16 on its expired claim: one winner each time.
        for (round, at) in [(0, now), (1, now + Duration::minutes(6))] {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let s = s.clone();
                    let r = req("item-1", None, tracked("feed"));
                    tokio::spawn(async move { s.claim_item(&r, at).await })
                })
                .collect();
            let mut outcomes = Vec::new();
            for t in tasks {
                outcomes.push(t.await.unwrap().expect("contention is not an error"));
            }
            let wins = outcomes
                .iter()
                .filter(|o| matches!(o, ClaimOutcome::Claimed(_)))
                .count();
            let held = outcomes
                .iter()
                .filter(|o| **o == ClaimOutcome::HeldByOther)
                .count();
            assert_eq!((wins, held), (1, 15), "round {round}: {outcomes:?}");
        }
        let item = Identity::new("step-a", "rss", "item-1").unwrap();
        let row = s.get_claim(&item).await.unwrap().unwrap();
        assert_eq!(row.status, ClaimStatus::Claimed);
        assert_eq!(row.completion, Some(tracked("feed")));

        // Takeover by a job: the old token is lost, the new one completes with the ledger.
        let later = now + Duration::minutes(20);
        let stale = Descriptor {
            identity: row.identity.clone(),
            token: row.token.clone().unwrap(),
            job_id: None,
            completion: tracked("feed"),
        };
        let d = claimed(
            s.claim_item(&req("item-1", Some(7), tracked("feed")), later)
                .await
                .unwrap(),
        );
        assert_ne!(d.token, stale.token);
        // The owning job claims again (a retried step): same token, fresh expiry; others wait.
        let retried = later + Duration::minutes(1);
        let r7 = req("item-1", Some(7), tracked("feed"));
        let again7 = claimed(s.claim_item(&r7, retried).await.unwrap());
        assert_eq!(again7.token, d.token);
        let held = s.get_claim(&d.identity).await.unwrap().unwrap();
        assert_eq!(
            held.expires_at,
            Some(crate::clock::to_millis(retried + Duration::minutes(5)))
        );
        let r8 = req("item-1", Some(8), tracked("feed"));
        assert_eq!(
            s.claim_item(&r8, retried).await.unwrap(),
            ClaimOutcome::HeldByOther
        );
        let handler: Arc<dyn CompletionHandler> = Arc::new(TrackedItems);
        let lost = s.complete_claim(&stale, Some(handler.clone()), later).await;
        assert_eq!(lost.unwrap(), CompleteOutcome::Lost);
        assert!(!s.release_claim(&stale, false, later).await.unwrap());
        assert!(s.tracked_item("feed", "item-1").await.unwrap().is_none());
        let done = s.complete_claim(&d, Some(handler.clone()), later).await;
        assert_eq!(done.unwrap(), CompleteOutcome::Completed);
        let t = s.tracked_item("feed", "item-1").await.unwrap().unwrap();
        assert_eq!((t.revision, t.last_job), (2, Some(7)));
        assert_eq!(t.updated_at, crate::clock::to_millis(later));
        let row = s.get_claim(&d.identity).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.token, row.job_id),
            (ClaimStatus::Processed, None, Some(7))
        );
        assert_eq!(row.processed_at, Some(crate::clock::to_millis(later)));
        assert_eq!(
            s.complete_claim(&d, None, later).await.unwrap(),
            CompleteOutcome::Lost
        );

        // Processed: refused unless reprocessing; release (defer) then reclaim.
        let again = s
            .claim_item(&req("item-1", None, tracked("feed")), later)
            .await;
        assert_eq!(again.unwrap(), ClaimOutcome::AlreadyProcessed);
        let mut r = req("item-1", None, CompletionConfig::default());
        r.reprocess = true;
        let d2 = claimed(s.claim_item(&r, later).await.unwrap());
        assert!(s.release_claim(&d2, true, later).await.unwrap());
        assert!(!s.release_claim(&d2, true, later).await.unwrap());
        let deferred = s.get_claim(&d2.identity).await.unwrap().unwrap();
        assert_eq!(
            (deferred.status, deferred.token),
            (ClaimStatus::Deferred, None)
        );
        assert_eq!((deferred.job_id, deferred.expires_at), (None, None));
        let d3 = claimed(
            s.claim_item(&req("item-1", None, Default::default()), later)
                .await
                .unwrap(),
        );
        assert_eq!(
            s.get_claim(&d3.identity).await.unwrap().unwrap().completion,
            Some(CompletionConfig::default()),
            "the default config is stored"
        );
        // Without a handler and without retain: the row is deleted.
        let mut gone = d3.clone();
        gone.completion.retain_processed = false;
        assert_eq!(
            s.complete_claim(&gone, None, later).await.unwrap(),
            CompleteOutcome::Completed
        );
        assert!(s.get_claim(&d3.identity).await.unwrap().is_none());

        // A row stored under another identity's hash is corruption, named by the hash.
        let victim = Identity::new("step-a", "rss", "victim").unwrap();
        sqlx::query(
            "INSERT INTO dockhand_item_claims (identity_hash, scope, source_type, item_id, status)
             VALUES ($1, 'step-a', 'rss', 'impostor', 'processed')",
        )
        .bind(victim.hash())
        .execute(s.pool())
        .await
        .unwrap();
        let e = s
            .claim_item(&req("victim", None, Default::default()), later)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(&victim.hash()), "{e}");
        assert!(s.get_claim(&victim).await.unwrap().is_none());
        let f = ClaimFilter {
            scope: Some("step-a".into()),
            ..Default::default()
        };
        assert_eq!(s.list_claims(&f).await.unwrap().len(), 1);
        let s = Arc::into_inner(s).unwrap();
        cleanup(s, &url, &schema).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_waits_for_an_in_flight_inserter() {
        let Some((s, url, schema)) = fresh("in_flight_inserter").await else {
            return;
        };
        let s = Arc::new(s);
        let now = t0();
        for commit in [true, false] {
            let item = format!("inflight-{commit}");
            let identity = Identity::new("step-a", "rss", item.as_str()).unwrap();
            let mut tx = s.pool().begin().await.unwrap();
            sqlx::query(
                "INSERT INTO dockhand_item_claims
                    (identity_hash, scope, source_type, item_id, status, token, expires_at)
                 VALUES ($1, 'step-a', 'rss', $2, 'claimed', 'other', $3)",
            )
            .bind(identity.hash())
            .bind(&item)
            .bind(now + Duration::minutes(5))
            .execute(&mut *tx)
            .await
            .unwrap();
            let racer = {
                let (s, r) = (s.clone(), req(&item, None, Default::default()));
                tokio::spawn(async move { s.claim_item(&r, now).await })
            };
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            assert!(
                !racer.is_finished(),
                "the claim waits for the uncommitted inserter"
            );
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            let got = racer.await.unwrap().expect("no error after the wait");
            match (commit, got) {
                (true, ClaimOutcome::HeldByOther) | (false, ClaimOutcome::Claimed(_)) => {}
                (c, other) => panic!("commit={c}: {other:?}"),
            }
        }
        let s = Arc::into_inner(s).unwrap();
        cleanup(s, &url, &schema).await;
    }

    #[tokio::test]
    async fn failing_handler_rolls_back_its_write_and_keeps_the_claim() {
        let Some((s, url, schema)) = fresh("failing_handler").await else {
            return;
        };
        let now = t0();
        let d = claimed(
            s.claim_item(&req("x", None, tracked("feed")), now)
                .await
                .unwrap(),
        );
        let e = s
            .complete_claim(&d, Some(Arc::new(WriteThenFail)), now)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                crate::Error::InvalidInput {
                    field: "completion",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("handler failed for item x: downstream said no"),
            "{e}"
        );
        assert!(
            s.tracked_item("feed", "x").await.unwrap().is_none(),
            "handler write rolled back"
        );
        let row = s.get_claim(&d.identity).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.token.as_deref()),
            (ClaimStatus::Claimed, Some(d.token.as_str()))
        );
        // An expired claim nobody took over can still be completed by its token.
        let late = now + Duration::hours(1);
        let ok = s
            .complete_claim(&d, Some(Arc::new(TrackedItems)), late)
            .await
            .unwrap();
        assert_eq!(ok, CompleteOutcome::Completed);
        assert!(s.tracked_item("feed", "x").await.unwrap().is_some());
        cleanup(s, &url, &schema).await;
    }

    #[tokio::test]
    async fn bridge_completes_releases_and_is_idempotent() {
        let Some((s, url, schema)) = fresh("bridge").await else {
            return;
        };
        let now = t0();
        let reg = CompletionRegistry::with_builtins();
        let e = s
            .finish_job(1, JobStatus::Processing, None, &reg, now)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                crate::Error::InvalidInput {
                    field: "job status",
                    ..
                }
            ),
            "{e}"
        );
        let e = s
            .finish_job(999, JobStatus::Failed, None, &reg, now)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                crate::Error::NotFound {
                    what: "job",
                    id: 999
                }
            ),
            "{e}"
        );

        // Success: every claim of the job completes (ledger row, processed / deleted).
        let ok = new_job(&s).await;
        let other = new_job(&s).await;
        let a = claimed(
            s.claim_item(&req("a", Some(ok), tracked("feed")), now)
                .await
                .unwrap(),
        );
        let drop_cfg = CompletionConfig {
            retain_processed: false,
            ..Default::default()
        };
        let b = claimed(
            s.claim_item(&req("b", Some(ok), drop_cfg), now)
                .await
                .unwrap(),
        );
        let c = claimed(
            s.claim_item(&req("c", Some(other), tracked("feed")), now)
                .await
                .unwrap(),
        );
        let out = s
            .finish_job(ok, JobStatus::Completed, None, &reg, now)
            .await
            .unwrap();
        assert_eq!(out, BridgeOutcome::Finished);
        let job = s.get_job(ok).await.unwrap().unwrap();
        assert_eq!(
            (job.status, job.finished_at),
            (JobStatus::Completed, Some(crate::clock::to_millis(now)))
        );
        assert_eq!(
            s.get_claim(&a.identity).await.unwrap().unwrap().status,
            ClaimStatus::Processed
        );
        assert!(s.get_claim(&b.identity).await.unwrap().is_none());
        assert_eq!(
            s.tracked_item("feed", "a").await.unwrap().unwrap().last_job,
            Some(ok)
        );
        // Repeats change nothing and report the standing status.
        for st in [JobStatus::Completed, JobStatus::Failed] {
            let again = s
                .finish_job(ok, st, Some("manual"), &reg, now)
                .await
                .unwrap();
            assert_eq!(
                again,
                BridgeOutcome::AlreadyFinal {
                    status: JobStatus::Completed,
                    reason: None
                }
            );
        }

        // A missing handler rolls everything back; failing then releases the claims.
        let mut missing = tracked("feed");
        missing.handler = Some("nope".into());
        let d = claimed(
            s.claim_item(&req("d", Some(other), missing), now)
                .await
                .unwrap(),
        );
        let out = s
            .finish_job(other, JobStatus::Completed, None, &reg, now)
            .await
            .unwrap();
        let BridgeOutcome::ClaimCompletionFailed { error } = out else {
            panic!("{out:?}")
        };
        assert!(
            error.contains("nope") && error.contains("item d"),
            "{error}"
        );
        assert_eq!(
            s.get_claim(&c.identity).await.unwrap().unwrap().status,
            ClaimStatus::Claimed
        );
        assert!(s.tracked_item("feed", "c").await.unwrap().is_none());
        assert_eq!(
            s.get_job(other).await.unwrap().unwrap().status,
            JobStatus::Pending
        );
        let out = s.finish_job(
            other,
            JobStatus::Failed,
            Some("item_claim_completion_failed"),
            &reg,
            now,
        );
        assert_eq!(out.await.unwrap(), BridgeOutcome::Finished);
        assert!(s.get_claim(&c.identity).await.unwrap().is_none());
        assert!(s.get_claim(&d.identity).await.unwrap().is_none());
        // The items are free again.
        claimed(
            s.claim_item(&req("c", None, Default::default()), now)
                .await
                .unwrap(),
        );

        // One outbox event per finished job, delivered once.
        let events = s.undelivered_events(10).await.unwrap();
        let got: Vec<_> = events
            .iter()
            .map(|e| (e.job_id, e.status, e.reason.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (ok, JobStatus::Completed, None),
                (
                    other,
                    JobStatus::Failed,
                    Some("item_claim_completion_failed")
                )
            ]
        );
        assert_eq!(events[0].pipeline, "feed");
        assert!(s.mark_event_delivered(events[0].id, now).await.unwrap());
        assert!(!s.mark_event_delivered(events[0].id, now).await.unwrap());
        assert_eq!(s.undelivered_events(10).await.unwrap().len(), 1);
        cleanup(s, &url, &schema).await;
    }

    #[tokio::test]
    async fn job_steps_engine_data_and_packets() {
        let Some((s, url, schema)) = fresh("job_steps").await else {
            return;
        };
        let now = t0();
        let mut rx = s.wakeups();
        rx.borrow_and_update();
        let id = s
            .create_job(
                &NewJob {
                    pipeline: "feed".into(),
                    input_refs: vec!["v1:abc".into()],
                    engine_data: json!({"cursor": 1}),
                    step: step(),
                },
                now,
            )
            .await
            .unwrap();
        assert!(rx.has_changed().unwrap(), "create_job wakes runners");
        let steps = |n: usize| {
            let s = &s;
            async move {
                let f = ActionFilter {
                    hook: Some(STEP_HOOK.into()),
                    ..Default::default()
                };
                let q = ActionQuery {
                    filter: f,
                    ..Default::default()
                };
                let all = s.query(&q).await.unwrap();
                assert_eq!(all.len(), n);
                all
            }
        };
        assert_eq!(steps(1).await[0].args, json!({"job": id, "step": 0}));
        let job = s.get_job(id).await.unwrap().unwrap();
        assert_eq!(
            (job.status, job.step_index, job.input_refs.clone()),
            (JobStatus::Pending, 0, vec!["v1:abc".to_string()])
        );

        assert!(
            s.start_step(id, 1, now).await.unwrap().is_none(),
            "stale step"
        );
        let j = s.start_step(id, 0, now).await.unwrap().unwrap();
        assert_eq!(j.status, JobStatus::Processing);
        assert_eq!(
            s.start_step(id, 0, now).await.unwrap().unwrap().status,
            JobStatus::Processing
        );
        let refs = vec!["v1:def".to_string()];
        assert!(s.advance_job(id, 0, 1, &refs, &step(), now).await.unwrap());
        assert!(
            !s.advance_job(id, 0, 1, &refs, &step(), now).await.unwrap(),
            "moved on"
        );
        assert_eq!(steps(2).await[1].args, json!({"job": id, "step": 1}));
        assert!(s.park_job(id, 1, 2, &[], now).await.unwrap());
        assert!(!s.park_job(id, 1, 2, &[], now).await.unwrap());
        assert!(s.start_step(id, 2, now).await.unwrap().is_none(), "waiting");
        assert!(s.resume_job(id, &step(), now).await.unwrap());
        assert!(!s.resume_job(id, &step(), now).await.unwrap());
        assert_eq!(steps(3).await[2].args, json!({"job": id, "step": 2}));
        let job = s.get_job(id).await.unwrap().unwrap();
        assert_eq!(
            (job.status, job.step_index, job.input_refs),
            (JobStatus::Processing, 2, vec![])
        );

        // Engine data: compare-and-swap on the version.
        assert_eq!(
            s.engine_data(id).await.unwrap(),
            Some((json!({"cursor": 1}), 0))
        );
        assert!(s
            .cas_engine_data(id, 0, &json!({"cursor": 2}))
            .await
            .unwrap());
        assert!(
            !s.cas_engine_data(id, 0, &json!({"cursor": 3}))
                .await
                .unwrap(),
            "conflict"
        );
        assert_eq!(
            s.engine_data(id).await.unwrap(),
            Some((json!({"cursor": 2}), 1))
        );
        assert_eq!(s.engine_data(12345).await.unwrap(), None);

        // Packets: stored once, duplicates in one batch included.
        let p = packets::encode(&json!({"b": 1, "a": [1, 2]})).unwrap();
        let q = packets::encode(&json!("x")).unwrap();
        s.put_packets(&[p.clone(), q.clone(), p.clone()], now)
            .await
            .unwrap();
        s.put_packets(std::slice::from_ref(&p), now).await.unwrap();
        s.put_packets(&[], now).await.unwrap();
        let body = s.packet_body(&p.hash).await.unwrap();
        assert_eq!(
            packets::verify(&p.reference, body).unwrap(),
            json!({"a": [1, 2], "b": 1})
        );
        assert_eq!(s.packet_body("0".repeat(64).as_str()).await.unwrap(), None);

        // Listing: newest first, filtered, paged.
        let second = new_job(&s).await;
        let all = s.list_jobs(&JobFilter::default()).await.unwrap();
        assert_eq!(all.iter().map(|j| j.id).collect::<Vec<_>>(), [second, id]);
        let f = JobFilter {
            statuses: vec![JobStatus::Pending],
            ..Default::default()
        };
        assert_eq!(s.list_jobs(&f).await.unwrap()[0].id, second);
        let f = JobFilter {
            pipeline: Some("other".into()),
            ..Default::default()
        };
        assert!(s.list_jobs(&f).await.unwrap().is_empty());
        let f = JobFilter {
            limit: 1,
            offset: 1,
            ..Default::default()
        };
        assert_eq!(s.list_jobs(&f).await.unwrap()[0].id, id);
        cleanup(s, &url, &schema).await;
    }
}
