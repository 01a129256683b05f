//! Item claims over time (issue 15): claims of live jobs renewed past their TTL, a step's own
//! TTL (defect 6, S-C12), and the exact TTL boundary on the database clock.

use super::claims::claims_runtime;
use crate::harness::TestDb;
use chrono::Duration;
use dockhand::claims::ClaimStatus;
use dockhand::{
    Clock, CompletionConfig, HandlerError, Identity, JobStatus, Packet, Pipeline, Runtime,
    StepOutput,
};
use serde_json::json;
use std::sync::Arc;

fn feed(item: &str) -> Identity {
    Identity::new("shared:feed", "rss", item).unwrap()
}

/// S-C12 (defect 6): a live job's claim is renewed by maintenance once half its TTL has
/// passed, so past its original TTL another owner cannot take it over, and keeps being renewed
/// while the job lives. The claims of a final job and of a job id with no row are not renewed
/// and are taken over after their TTL; the renewal stops when the job is final.
pub async fn s_c12_live_jobs_claims_are_renewed_past_their_ttl(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let t0 = db.clock.now();
    let ttl = Duration::minutes(10);
    let live = jobs.start("hold", json!({})).await.unwrap();
    let orphaned = jobs.start("hold", json!({})).await.unwrap();
    let claim = |item: &'static str, job: i64| {
        let jobs = jobs.clone();
        async move {
            jobs.claim(
                feed(item),
                Some(job),
                ttl,
                CompletionConfig::default(),
                false,
            )
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{item} claimed"))
        }
    };
    claim("live", live).await;
    claim("dead", 9_999_999).await;
    claim("orphan", orphaned).await;
    // A final job still holding a claim (as the race defect 4 closed could leave one): made
    // final behind the bridge's back.
    db.exec_sql(&format!(
        "UPDATE dockhand_jobs SET status = 'failed' WHERE id = {orphaned}"
    ))
    .await;
    let expiry = |item: &'static str| {
        let store = db.store.clone();
        async move {
            store
                .get_claim(&feed(item))
                .await
                .unwrap()
                .unwrap()
                .expires_at
        }
    };
    db.clock.advance(Duration::minutes(4));
    let r = rt.run_maintenance_once().await.unwrap();
    assert_eq!(r.claims_renewed, 0, "less than half the TTL used");
    assert_eq!(expiry("live").await, Some(t0 + ttl));
    db.clock.advance(Duration::minutes(2));
    let r = rt.run_maintenance_once().await.unwrap();
    assert_eq!(r.claims_renewed, 1, "only the live job's claim");
    assert_eq!(expiry("live").await, Some(t0 + Duration::minutes(16)));
    assert_eq!(expiry("dead").await, Some(t0 + ttl));
    assert_eq!(expiry("orphan").await, Some(t0 + ttl));
    db.clock.advance(Duration::minutes(5)); // t0 + 11 min: past the original TTL
    let other = jobs.start("hold", json!({})).await.unwrap();
    let take = |item: &'static str| {
        let jobs = jobs.clone();
        async move {
            jobs.claim(
                feed(item),
                Some(other),
                ttl,
                CompletionConfig::default(),
                false,
            )
            .await
            .unwrap()
        }
    };
    assert!(take("live").await.is_none(), "renewed: not taken over");
    assert!(take("dead").await.is_some(), "no job row: taken over");
    assert!(take("orphan").await.is_some(), "final job: taken over");
    rt.run_maintenance_once().await.unwrap();
    assert_eq!(
        expiry("live").await,
        Some(t0 + Duration::minutes(21)),
        "renewed again while the job lives"
    );
    jobs.manual_fail(live, None).await.unwrap();
    assert!(
        db.store.get_claim(&feed("live")).await.unwrap().is_none(),
        "released by the bridge"
    );
    assert!(jobs.check().await.unwrap().is_empty(), "audit clean");
}

/// A step chooses its claims' TTL (`Pipeline::claim_ttl`); a parked (waiting) job is live and
/// its claims are renewed; a non-positive TTL is refused when the runtime is built.
pub async fn claim_ttl_is_a_step_option_and_parked_jobs_keep_their_claims(db: TestDb) {
    let rt = db
        .runtime()
        .pipeline(
            Pipeline::new("ask")
                .step("take", |ctx| async move {
                    let d = ctx
                        .claim("rss", "question")
                        .await
                        .map_err(HandlerError::retry)?
                        .ok_or_else(|| HandlerError::fatal("not claimed"))?;
                    Ok(StepOutput::Park(vec![Packet::new(json!({})).with_claim(d)]))
                })
                .scope("shared:feed")
                .claim_ttl(std::time::Duration::from_secs(120))
                .step("answer", |_ctx| async { Ok(StepOutput::one(json!({}))) }),
        )
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let t0 = db.clock.now();
    let job = jobs.start("ask", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(jobs.get(job).await.unwrap().status, JobStatus::Waiting);
    let c = db
        .store
        .get_claim(&feed("question"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.status, c.job_id, c.expires_at),
        (
            ClaimStatus::Claimed,
            Some(job),
            Some(t0 + Duration::minutes(2))
        ),
        "the step's TTL"
    );
    db.clock.advance(Duration::seconds(90));
    assert_eq!(rt.run_maintenance_once().await.unwrap().claims_renewed, 1);
    db.clock.advance(Duration::seconds(60)); // past the original 2 minutes
    assert!(jobs
        .claim(
            feed("question"),
            Some(9_999_999),
            Duration::minutes(5),
            CompletionConfig::default(),
            false
        )
        .await
        .unwrap()
        .is_none());
    assert!(jobs.resume(job).await.unwrap());
    rt.drain(10).await.unwrap();
    assert_eq!(jobs.get(job).await.unwrap().status, JobStatus::Completed);
    assert_eq!(
        db.store
            .get_claim(&feed("question"))
            .await
            .unwrap()
            .unwrap()
            .status,
        ClaimStatus::Processed
    );
    let bad = db
        .runtime()
        .pipeline(
            Pipeline::new("bad")
                .step("s", |_ctx| async { Ok(StepOutput::none()) })
                .claim_ttl(std::time::Duration::ZERO),
        )
        .build()
        .await;
    let e = bad.unwrap_err().to_string();
    assert!(e.contains("claim_ttl") && e.contains("bad"), "{e}");
}

/// The TTL boundary, on the database clock (the runtime's default): a claim holds while
/// `now < expires_at`; at `now == expires_at` it is expired and another owner takes it over.
/// Renewal is due from `now == expires_at - ttl / 2` on. The same on every backend.
pub async fn claim_ttl_boundary_on_the_database_clock(db: TestDb) {
    let rt = Runtime::with_store(db.store.clone())
        .database_clock(Arc::new(db.clock.clone()))
        .migrate(false)
        .pipeline(Pipeline::new("hold").step("only", |_ctx| async { Ok(StepOutput::none()) }))
        .build()
        .await
        .unwrap();
    let clock = rt.database_clock().expect("database clock").clone();
    let jobs = rt.jobs();
    let ttl = Duration::minutes(4);
    let claim = |item: &'static str, job: i64| {
        let jobs = jobs.clone();
        async move {
            jobs.claim(
                feed(item),
                Some(job),
                ttl,
                CompletionConfig::default(),
                false,
            )
            .await
            .unwrap()
        }
    };
    // Takeover boundary: free-standing owners (no job rows), so nothing renews them.
    let start = dockhand::clock::to_millis(clock.now());
    let first = claim("edge", 9_000_001).await.expect("first owner");
    let c = db.store.get_claim(&feed("edge")).await.unwrap().unwrap();
    assert_eq!(
        c.expires_at,
        Some(start + ttl),
        "expires_at = claim time + ttl"
    );
    db.clock.advance(ttl - Duration::milliseconds(1));
    assert!(
        claim("edge", 9_000_002).await.is_none(),
        "one millisecond before expires_at: still held"
    );
    db.clock.advance(Duration::milliseconds(1));
    let second = claim("edge", 9_000_002)
        .await
        .expect("at expires_at: expired, taken over");
    assert_ne!(first.token, second.token);
    // Renewal boundary: a live job's claim is due once half its TTL has passed, not before.
    let job = jobs.start("hold", json!({})).await.unwrap();
    let start = dockhand::clock::to_millis(clock.now());
    claim("renew", job).await.expect("claimed");
    db.clock.advance(ttl / 2 - Duration::milliseconds(1));
    assert_eq!(rt.run_maintenance_once().await.unwrap().claims_renewed, 0);
    db.clock.advance(Duration::milliseconds(1));
    assert_eq!(rt.run_maintenance_once().await.unwrap().claims_renewed, 1);
    let c = db.store.get_claim(&feed("renew")).await.unwrap().unwrap();
    assert_eq!(c.expires_at, Some(start + ttl / 2 + ttl));
}

/// S-C12 as a batch: the split step claims three items (default 30-minute TTL) and fans them
/// out; the chunks reach the items 35 minutes later. Maintenance renewed the parent's claims
/// meanwhile, so a second pipeline cannot take an item over, and each child's success marks
/// its item processed.
pub async fn s_c12_batch_child_reaches_an_item_after_the_ttl(db: TestDb) {
    use super::batches::{batch_pipeline, children, ok_child, runtime};
    let rt = runtime(&db, db.store.clone(), batch_pipeline(3, 1, ok_child)).await;
    let jobs = rt.jobs();
    let parent = jobs.start("batch", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    let item = |i: usize| Identity::new("shared:b", "src", format!("item-{i}")).unwrap();
    db.clock.advance(Duration::minutes(20));
    assert_eq!(rt.run_maintenance_once().await.unwrap().claims_renewed, 3);
    db.clock.advance(Duration::minutes(15));
    for i in 0..3 {
        assert!(
            jobs.claim(
                item(i),
                Some(9_999_999),
                Duration::minutes(5),
                Default::default(),
                false
            )
            .await
            .unwrap()
            .is_none(),
            "item {i}: held by the live batch past its original TTL"
        );
    }
    rt.drain(100).await.unwrap();
    assert_eq!(jobs.get(parent).await.unwrap().status, JobStatus::Completed);
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 3);
    for i in 0..3 {
        let c = db.store.get_claim(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.status, ClaimStatus::Processed, "item {i}");
        assert!(
            kids.iter().any(|k| Some(k.id) == c.job_id),
            "item {i} completed by its child"
        );
    }
    assert!(jobs.check().await.unwrap().is_empty(), "audit clean");
}
