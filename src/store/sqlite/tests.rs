//! Focused tests of the SQLite jobs, terminal bridge and item-claim methods on a temp file.

use super::SqliteStore;
use crate::claims::ledger::{TrackedItems, TRACKED_ITEMS};
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimStatus, CompleteOutcome, CompletionConfig,
    CompletionContext, CompletionHandler, CompletionRegistry, CompletionTx, Descriptor, Identity,
};
use crate::jobs::{BridgeOutcome, JobFilter, NewJob, StepAction};
use crate::state::JobStatus;
use crate::store::Store;
use async_trait::async_trait;
use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;
use std::sync::Arc;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap()
}

async fn fresh() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    (store, dir)
}

fn tracked(namespace: &str) -> CompletionConfig {
    CompletionConfig {
        handler: Some(TRACKED_ITEMS.into()),
        payload: json!({"namespace": namespace, "revision": 3}),
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
        run: None,
    }
}

fn claimed(o: ClaimOutcome) -> Descriptor {
    match o {
        ClaimOutcome::Claimed(d) => d,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

fn step() -> StepAction {
    StepAction {
        priority: 0,
        max_attempts: 3,
        group: None,
    }
}

async fn new_job(store: &SqliteStore) -> i64 {
    let job = NewJob {
        pipeline: "p".into(),
        input_refs: vec![],
        engine_data: json!({"n": 0}),
        step: step(),
        idempotency_key: None,
    };
    store.create_job(&job, t0()).await.unwrap()
}

/// Writes a ledger row, then fails: its write must roll back with the claim's transition.
struct WriteThenFail;

#[async_trait]
impl CompletionHandler for WriteThenFail {
    async fn complete(
        &self,
        tx: CompletionTx<'_>,
        ctx: &CompletionContext,
    ) -> crate::claims::CompletionResult {
        TrackedItems.complete(tx, ctx).await?;
        Err("boom".into())
    }
}

/// sqlx#3645 (see `store::pool`): a pool with an idle timeout or a lifetime runs a reaper task
/// that can spin for good; the file database's pools run none.
#[tokio::test]
async fn pools_run_no_reaper_task() {
    let (store, _dir) = fresh().await;
    for (name, pool) in [("pool", &store.pool), ("reader", &store.reader)] {
        assert_eq!(pool.options().get_idle_timeout(), None, "{name}");
        assert_eq!(pool.options().get_max_lifetime(), None, "{name}");
    }
}

#[tokio::test]
async fn claim_contention_takeover_and_stale_token() {
    let (store, _dir) = fresh().await;
    let now = t0();
    let first = claimed(
        store
            .claim_item(&req("i1", None, tracked("feed")), now)
            .await
            .unwrap(),
    );
    let second = store
        .claim_item(&req("i1", None, tracked("feed")), now)
        .await
        .unwrap();
    assert_eq!(second, ClaimOutcome::HeldByOther);

    // After expiry another owner takes over with a new token.
    let later = now + Duration::minutes(6);
    let taken = claimed(
        store
            .claim_item(&req("i1", Some(7), tracked("feed")), later)
            .await
            .unwrap(),
    );
    assert_ne!(taken.token, first.token);
    assert_eq!(taken.job_id, Some(7));

    // The old token changes nothing; its handler never runs.
    let handler: Arc<dyn CompletionHandler> = Arc::new(TrackedItems);
    let lost = store
        .complete_claim(&first, Some(handler.clone()), later)
        .await
        .unwrap();
    assert_eq!(lost, CompleteOutcome::Lost);
    assert!(store.tracked_item("feed", "i1").await.unwrap().is_none());
    assert!(!store.release_claim(&first, false, later).await.unwrap());

    // The new holder completes: the ledger row and the processed transition commit together.
    let done = store
        .complete_claim(&taken, Some(handler), later)
        .await
        .unwrap();
    assert_eq!(done, CompleteOutcome::Completed);
    let row = store.tracked_item("feed", "i1").await.unwrap().unwrap();
    assert_eq!((row.revision, row.last_job), (3, Some(7)));
    let c = store.get_claim(&taken.identity).await.unwrap().unwrap();
    assert_eq!(c.status, ClaimStatus::Processed);
    assert_eq!((c.token, c.job_id), (None, Some(7)));
    assert_eq!(c.completion, Some(tracked("feed")));

    // Processed: refused unless reprocessing, which hands out a fresh token.
    let again = store
        .claim_item(&req("i1", None, tracked("feed")), later)
        .await
        .unwrap();
    assert_eq!(again, ClaimOutcome::AlreadyProcessed);
    let mut r = req("i1", None, tracked("feed"));
    r.reprocess = true;
    let re = claimed(store.claim_item(&r, later).await.unwrap());
    assert_ne!(re.token, taken.token);
    let c = store.get_claim(&re.identity).await.unwrap().unwrap();
    assert_eq!((c.status, c.processed_at), (ClaimStatus::Claimed, None));
}

#[tokio::test]
async fn failing_handler_rolls_back_its_write_and_keeps_the_claim() {
    let (store, _dir) = fresh().await;
    let d = claimed(
        store
            .claim_item(&req("i2", None, tracked("feed")), t0())
            .await
            .unwrap(),
    );
    let err = store
        .complete_claim(&d, Some(Arc::new(WriteThenFail)), t0())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("i2") && err.to_string().contains("boom"),
        "{err}"
    );
    assert!(store.tracked_item("feed", "i2").await.unwrap().is_none());
    let c = store.get_claim(&d.identity).await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.token),
        (ClaimStatus::Claimed, Some(d.token.clone()))
    );

    // Release with defer, then reclaim; no handler and no retain deletes the row.
    assert!(store.release_claim(&d, true, t0()).await.unwrap());
    let c = store.get_claim(&d.identity).await.unwrap().unwrap();
    assert_eq!((c.status, c.token), (ClaimStatus::Deferred, None));
    let cfg = CompletionConfig {
        retain_processed: false,
        ..CompletionConfig::default()
    };
    let d2 = claimed(store.claim_item(&req("i2", None, cfg), t0()).await.unwrap());
    assert_eq!(
        store.complete_claim(&d2, None, t0()).await.unwrap(),
        CompleteOutcome::Completed
    );
    assert!(store.get_claim(&d.identity).await.unwrap().is_none());
}

#[tokio::test]
async fn long_ids_sharing_a_prefix_are_independent() {
    let (store, _dir) = fresh().await;
    let prefix = "x".repeat(300);
    let a = claimed(
        store
            .claim_item(&req(&format!("{prefix}a"), None, tracked("f")), t0())
            .await
            .unwrap(),
    );
    let b = claimed(
        store
            .claim_item(&req(&format!("{prefix}b"), None, tracked("f")), t0())
            .await
            .unwrap(),
    );
    assert_ne!(a.identity.hash(), b.identity.hash());
    assert_eq!(
        store.complete_claim(&a, None, t0()).await.unwrap(),
        CompleteOutcome::Completed
    );
    let cb = store.get_claim(&b.identity).await.unwrap().unwrap();
    assert_eq!(cb.status, ClaimStatus::Claimed);
    assert_eq!(cb.identity.item_id, format!("{prefix}b"));
    let all = store.list_claims(&ClaimFilter::default()).await.unwrap();
    assert_eq!(all.len(), 2);
}

#[tokio::test]
async fn bridge_completes_or_deletes_the_jobs_claims_once() {
    let (store, _dir) = fresh().await;
    let registry = CompletionRegistry::with_builtins();
    let ok_job = new_job(&store).await;
    let bad_job = new_job(&store).await;
    for (i, job) in [(1, ok_job), (2, ok_job), (3, bad_job)] {
        store
            .claim_item(&req(&format!("j{i}"), Some(job), tracked("bridge")), t0())
            .await
            .unwrap();
    }
    let later = t0() + Duration::seconds(1);
    let r = store
        .finish_job(ok_job, JobStatus::Completed, None, &registry, later)
        .await
        .unwrap();
    assert_eq!(r, BridgeOutcome::Finished);
    for item in ["j1", "j2"] {
        let row = store.tracked_item("bridge", item).await.unwrap().unwrap();
        assert_eq!(row.last_job, Some(ok_job));
    }
    let processed = ClaimFilter {
        job_id: Some(ok_job),
        status: Some(ClaimStatus::Processed),
        ..ClaimFilter::default()
    };
    assert_eq!(store.list_claims(&processed).await.unwrap().len(), 2);

    let r = store
        .finish_job(
            bad_job,
            JobStatus::Failed,
            Some("retry_exhausted"),
            &registry,
            later,
        )
        .await
        .unwrap();
    assert_eq!(r, BridgeOutcome::Finished);
    let filter = ClaimFilter {
        job_id: Some(bad_job),
        ..ClaimFilter::default()
    };
    assert!(store.list_claims(&filter).await.unwrap().is_empty());
    assert!(store.tracked_item("bridge", "j3").await.unwrap().is_none());

    // A second finish (same or other status) leaves the first standing.
    let again = store
        .finish_job(bad_job, JobStatus::Failed, None, &registry, later)
        .await
        .unwrap();
    assert_eq!(
        again,
        BridgeOutcome::AlreadyFinal {
            status: JobStatus::Failed,
            reason: Some("retry_exhausted".into())
        }
    );
    let job = store.get_job(bad_job).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.finished_at),
        (JobStatus::Failed, Some(later))
    );

    // One event per finished job, delivered once.
    let events = store.undelivered_events(10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].job_id, events[0].status),
        (ok_job, JobStatus::Completed)
    );
    assert_eq!(events[1].reason.as_deref(), Some("retry_exhausted"));
    assert!(store
        .mark_event_delivered(events[0].id, later)
        .await
        .unwrap());
    assert!(!store
        .mark_event_delivered(events[0].id, later)
        .await
        .unwrap());
    assert_eq!(store.undelivered_events(10).await.unwrap().len(), 1);

    // Non-final targets and missing jobs are errors.
    assert!(store
        .finish_job(ok_job, JobStatus::Waiting, None, &registry, later)
        .await
        .is_err());
    assert!(store
        .finish_job(999, JobStatus::Failed, None, &registry, later)
        .await
        .is_err());
}

#[tokio::test]
async fn bridge_rolls_back_when_a_handler_is_missing() {
    let (store, _dir) = fresh().await;
    let job = new_job(&store).await;
    let d = claimed(
        store
            .claim_item(&req("m1", Some(job), tracked("x")), t0())
            .await
            .unwrap(),
    );
    let empty = CompletionRegistry::default();
    let r = store
        .finish_job(job, JobStatus::Completed, None, &empty, t0())
        .await
        .unwrap();
    assert!(
        matches!(r, BridgeOutcome::ClaimCompletionFailed { ref error } if error.contains("m1")),
        "{r:?}"
    );
    assert_eq!(
        store.get_job(job).await.unwrap().unwrap().status,
        JobStatus::Pending
    );
    let c = store.get_claim(&d.identity).await.unwrap().unwrap();
    assert_eq!(c.status, ClaimStatus::Claimed);
    assert!(store.undelivered_events(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn job_steps_engine_data_and_packets() {
    let (store, _dir) = fresh().await;
    let mut wake = store.wakeups();
    let job = new_job(&store).await;
    assert!(wake.has_changed().unwrap());
    wake.mark_unchanged();
    let step_hook = crate::action::ActionQuery::default();
    assert_eq!(store.query(&step_hook).await.unwrap().len(), 1);

    assert!(store
        .start_step(job, 1, t0())
        .await
        .unwrap()
        .job()
        .is_none());
    let j = store
        .start_step(job, 0, t0())
        .await
        .unwrap()
        .into_job()
        .unwrap();
    assert_eq!(j.status, JobStatus::Processing);
    assert!(store
        .start_step(job, 0, t0())
        .await
        .unwrap()
        .job()
        .is_some());

    let refs = vec!["v1:abc".to_string()];
    assert!(store
        .advance_job(job, None, (0, 1), &refs, &step(), t0())
        .await
        .unwrap());
    assert!(!store
        .advance_job(job, None, (0, 1), &refs, &step(), t0())
        .await
        .unwrap());
    assert!(wake.has_changed().unwrap());
    assert_eq!(store.query(&step_hook).await.unwrap().len(), 2);
    assert!(store.park_job(job, None, (1, 2), &[], t0()).await.unwrap());
    assert!(store
        .start_step(job, 2, t0())
        .await
        .unwrap()
        .job()
        .is_none());
    assert!(store.resume_job(job, &step(), t0()).await.unwrap());
    assert!(!store.resume_job(job, &step(), t0()).await.unwrap());
    let j = store.get_job(job).await.unwrap().unwrap();
    assert_eq!((j.status, j.step_index), (JobStatus::Processing, 2));
    assert_eq!(store.query(&step_hook).await.unwrap().len(), 3);

    let (data, v) = store.engine_data(job).await.unwrap().unwrap();
    assert_eq!((data, v), (json!({"n": 0}), 0));
    assert!(store
        .cas_engine_data(job, 0, &json!({"n": 1}))
        .await
        .unwrap());
    assert!(!store
        .cas_engine_data(job, 0, &json!({"n": 2}))
        .await
        .unwrap());
    assert_eq!(
        store.engine_data(job).await.unwrap().unwrap(),
        (json!({"n": 1}), 1)
    );

    let other = new_job(&store).await;
    let filter = JobFilter {
        statuses: vec![JobStatus::Pending],
        ..JobFilter::default()
    };
    let listed = store.list_jobs(&filter).await.unwrap();
    assert_eq!(listed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![other]);
    let all = store.list_jobs(&JobFilter::default()).await.unwrap();
    assert_eq!(
        all.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![other, job]
    );

    let p = crate::jobs::packets::encode(&json!({"a": 1})).unwrap();
    store
        .put_packets(&[p.clone(), p.clone()], t0())
        .await
        .unwrap();
    let body = store.packet_body(&p.hash).await.unwrap();
    assert_eq!(
        crate::jobs::packets::verify(&p.reference, body).unwrap(),
        json!({"a": 1})
    );
    assert!(store.packet_body("nope").await.unwrap().is_none());
}
