//! Item-claim scenarios (S-C1 … S-C11).

use crate::harness::TestDb;
use async_trait::async_trait;
use chrono::Duration;
use dockhand::claims::ledger::{TrackedItems, TRACKED_ITEMS};
use dockhand::claims::{
    ClaimStatus, CompleteOutcome, CompletionContext, CompletionHandler, CompletionTx,
};
use dockhand::jobs::engine::ReprocessContext;
use dockhand::{Clock, CompletionConfig, Identity, JobStatus, Pipeline, Runtime, StepOutput};
use serde_json::json;
use std::sync::{Arc, Mutex};

/// Writes the tracked item, then fails: proves the write is rolled back with the claim.
pub struct WriteThenFail;

#[async_trait]
impl CompletionHandler for WriteThenFail {
    async fn complete(
        &self,
        tx: CompletionTx<'_>,
        ctx: &CompletionContext,
    ) -> dockhand::claims::CompletionResult {
        TrackedItems.complete(tx, ctx).await?;
        Err("downstream system refused the item".into())
    }
}

pub fn tracked(ns: &str, revision: i64, retain: bool) -> CompletionConfig {
    CompletionConfig {
        handler: Some(TRACKED_ITEMS.into()),
        payload: json!({"namespace": ns, "revision": revision}),
        retain_processed: retain,
    }
}

pub fn failing(ns: &str) -> CompletionConfig {
    CompletionConfig {
        handler: Some("write_then_fail".into()),
        payload: json!({"namespace": ns}),
        retain_processed: true,
    }
}

/// A runtime with a `hold` pipeline (jobs that stay pending until drained) and the failing
/// completion handler registered.
pub async fn claims_runtime(db: &TestDb) -> Runtime {
    db.runtime()
        .pipeline(Pipeline::new("hold").step("only", |_ctx| async { Ok(StepOutput::none()) }))
        .completion_handler("write_then_fail", Arc::new(WriteThenFail))
        .build()
        .await
        .unwrap()
}

fn id(item: &str) -> Identity {
    Identity::new("shared:feed", "rss", item).unwrap()
}

pub async fn s_c1_two_pipelines_race_for_one_item(db: TestDb) {
    let winners: Arc<Mutex<Vec<String>>> = Arc::default();
    let mk = |name: &'static str| {
        let w = winners.clone();
        Pipeline::new(name)
            .step("ingest", move |ctx| {
                let w = w.clone();
                async move {
                    if ctx
                        .claim("rss", "item-1")
                        .await
                        .map_err(dockhand::HandlerError::retry)?
                        .is_some()
                    {
                        w.lock().unwrap().push(ctx.pipeline.clone());
                    }
                    Ok(StepOutput::one(json!({})))
                }
            })
            .scope("shared:feed")
    };
    let rt = db
        .runtime()
        .pipeline(mk("alpha"))
        .pipeline(mk("beta"))
        .build()
        .await
        .unwrap();
    rt.jobs().start("alpha", json!({})).await.unwrap();
    rt.jobs().start("beta", json!({})).await.unwrap();
    rt.drain(100).await.unwrap();
    assert_eq!(
        winners.lock().unwrap().len(),
        1,
        "exactly one pipeline got the item"
    );
    // And raw contention: 16 claimers at once, one descriptor, no error. The job ids are
    // unused ones (a claim taken for an existing final job, like alpha's or beta's, is given
    // back at once, which would leave no winner).
    let jobs = rt.jobs();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let jobs = jobs.clone();
        tasks.push(tokio::spawn(async move {
            jobs.claim(
                id("item-2"),
                Some(1000 + i),
                Duration::minutes(5),
                CompletionConfig::default(),
                false,
            )
            .await
        }));
    }
    let mut got = 0;
    for t in tasks {
        if t.await
            .unwrap()
            .expect("contention is never an error")
            .is_some()
        {
            got += 1;
        }
    }
    assert_eq!(got, 1);
}

pub async fn s_c2_takeover_fences_out_the_old_owner(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let a = jobs
        .claim(
            id("i"),
            Some(1),
            Duration::seconds(30),
            tracked("feed", 1, false),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    assert!(jobs
        .claim(
            id("i"),
            Some(2),
            Duration::seconds(30),
            tracked("feed", 2, false),
            false
        )
        .await
        .unwrap()
        .is_none());
    db.clock.advance(Duration::seconds(31));
    let b = jobs
        .claim(
            id("i"),
            Some(2),
            Duration::seconds(30),
            tracked("feed", 2, false),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    assert_ne!(a.token, b.token, "takeover gets a new token");
    assert_eq!(jobs.complete(&a).await.unwrap(), CompleteOutcome::Lost);
    assert!(!jobs.release(&a, false).await.unwrap());
    assert!(
        db.store.tracked_item("feed", "i").await.unwrap().is_none(),
        "A persisted nothing"
    );
    assert_eq!(jobs.complete(&b).await.unwrap(), CompleteOutcome::Completed);
    let t = db.store.tracked_item("feed", "i").await.unwrap().unwrap();
    assert_eq!((t.revision, t.last_job), (2, Some(2)));
    assert!(
        jobs.claim_state(&id("i")).await.unwrap().is_none(),
        "claim cleared (retain_processed = false)"
    );
    assert_eq!(
        jobs.complete(&b).await.unwrap(),
        CompleteOutcome::Lost,
        "completing twice is a no-op"
    );
}

pub async fn s_c3_expired_claim_nobody_took_can_still_complete(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let a = jobs
        .claim(
            id("i"),
            Some(1),
            Duration::seconds(30),
            tracked("feed", 1, true),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    db.clock.advance(Duration::hours(1));
    assert_eq!(jobs.complete(&a).await.unwrap(), CompleteOutcome::Completed);
    let c = jobs.claim_state(&id("i")).await.unwrap().unwrap();
    assert_eq!(c.status, ClaimStatus::Processed);
    assert!(db.store.tracked_item("feed", "i").await.unwrap().is_some());
}

pub async fn s_c4_processed_item_reclaimed_when_reprocessing(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let a = jobs
        .claim(
            id("i"),
            Some(1),
            Duration::minutes(5),
            CompletionConfig::default(),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(jobs.complete(&a).await.unwrap(), CompleteOutcome::Completed);
    assert!(
        jobs.claim(
            id("i"),
            Some(2),
            Duration::minutes(5),
            CompletionConfig::default(),
            false
        )
        .await
        .unwrap()
        .is_none(),
        "processed: not without reprocess"
    );
    let b = jobs
        .claim(
            id("i"),
            Some(2),
            Duration::minutes(5),
            CompletionConfig::default(),
            true,
        )
        .await
        .unwrap()
        .unwrap();
    assert_ne!(a.token, b.token);
    let c = jobs.claim_state(&id("i")).await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.job_id, c.token),
        (ClaimStatus::Claimed, Some(2), Some(b.token.clone()))
    );
}

pub async fn s_c5_failing_handler_rolls_back_its_write(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let a = jobs
        .claim(
            id("i"),
            Some(1),
            Duration::minutes(5),
            failing("feed"),
            false,
        )
        .await
        .unwrap()
        .unwrap();
    let e = jobs.complete(&a).await.unwrap_err().to_string();
    assert!(
        e.contains("downstream system refused") && e.contains('i'),
        "{e}"
    );
    assert!(
        db.store.tracked_item("feed", "i").await.unwrap().is_none(),
        "the handler's write was rolled back"
    );
    let c = jobs.claim_state(&id("i")).await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.token),
        (ClaimStatus::Claimed, Some(a.token.clone())),
        "still claimed by the same token"
    );
    // A descriptor naming an unregistered handler is an error, and nothing changes.
    let mut ghost = a.clone();
    ghost.completion.handler = Some("nobody".into());
    assert!(jobs
        .complete(&ghost)
        .await
        .unwrap_err()
        .to_string()
        .contains("nobody"));
    assert_eq!(
        jobs.claim_state(&id("i")).await.unwrap().unwrap().status,
        ClaimStatus::Claimed
    );
}

fn claiming_pipeline(items: &'static [(&'static str, bool)]) -> Pipeline {
    Pipeline::new("claimer").step("take", move |ctx| async move {
        for (item, fail) in items {
            let cfg = if *fail {
                failing("feed")
            } else {
                tracked("feed", 1, true)
            };
            ctx.claim_in("shared:feed", "rss", item, cfg)
                .await
                .map_err(dockhand::HandlerError::retry)?;
        }
        Ok(StepOutput::one(json!({})))
    })
}

pub async fn s_c6_completion_failure_downgrades_the_job(db: TestDb) {
    let rt = db
        .runtime()
        .pipeline(claiming_pipeline(&[("i", true)]))
        .completion_handler("write_then_fail", Arc::new(WriteThenFail))
        .build()
        .await
        .unwrap();
    let job = rt.jobs().start("claimer", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    let j = rt.jobs().get(job).await.unwrap();
    assert_eq!(
        (j.status, j.reason.as_deref()),
        (JobStatus::Failed, Some("item_claim_completion_failed"))
    );
    assert!(db.store.tracked_item("feed", "i").await.unwrap().is_none());
    assert!(
        rt.jobs()
            .claim(
                id("i"),
                Some(99),
                Duration::minutes(5),
                CompletionConfig::default(),
                false
            )
            .await
            .unwrap()
            .is_some(),
        "claimable again"
    );
}

pub async fn s_c7_second_handler_failure_undoes_both(db: TestDb) {
    let rt = db
        .runtime()
        .pipeline(claiming_pipeline(&[("one", false), ("two", true)]))
        .completion_handler("write_then_fail", Arc::new(WriteThenFail))
        .build()
        .await
        .unwrap();
    let job = rt.jobs().start("claimer", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(rt.jobs().get(job).await.unwrap().status, JobStatus::Failed);
    for item in ["one", "two"] {
        assert!(
            db.store.tracked_item("feed", item).await.unwrap().is_none(),
            "{item} not persisted"
        );
        assert!(
            rt.jobs().claim_state(&id(item)).await.unwrap().is_none(),
            "{item} released"
        );
    }
}

pub async fn s_c8_long_ids_sharing_a_prefix_are_independent(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let prefix = "p".repeat(300);
    let (x, y) = (format!("{prefix}-x"), format!("{prefix}-y"));
    let jobs = rt.jobs();
    let a = jobs
        .claim(
            id(&x),
            Some(1),
            Duration::minutes(5),
            CompletionConfig::default(),
            false,
        )
        .await
        .unwrap();
    let b = jobs
        .claim(
            id(&y),
            Some(2),
            Duration::minutes(5),
            CompletionConfig::default(),
            false,
        )
        .await
        .unwrap();
    assert!(a.is_some() && b.is_some());
    assert_eq!(
        jobs.claim_state(&id(&x))
            .await
            .unwrap()
            .unwrap()
            .identity
            .item_id,
        x,
        "full id stored"
    );
}

pub async fn s_c9_legacy_claims_follow_the_job(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let failing_job = jobs.start("hold", json!({})).await.unwrap();
    assert!(jobs
        .claim_item("legacy", "src", "a", failing_job)
        .await
        .unwrap());
    assert!(
        !jobs
            .claim_item("legacy", "src", "a", failing_job + 1000)
            .await
            .unwrap(),
        "held"
    );
    jobs.manual_fail(failing_job, None).await.unwrap();
    let legacy = |item: &str| Identity::new("legacy", "src", item).unwrap();
    assert!(
        jobs.claim_state(&legacy("a")).await.unwrap().is_none(),
        "released on final failure"
    );
    let ok_job = jobs.start("hold", json!({})).await.unwrap();
    assert!(jobs.claim_item("legacy", "src", "b", ok_job).await.unwrap());
    let done = jobs
        .finish(ok_job, JobStatus::Completed, None)
        .await
        .unwrap();
    assert!(done.changed);
    assert_eq!(
        jobs.claim_state(&legacy("b"))
            .await
            .unwrap()
            .unwrap()
            .status,
        ClaimStatus::Processed
    );
}

pub async fn s_c10_takeover_protects_the_new_owner(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    for final_status in [JobStatus::Failed, JobStatus::Completed] {
        let item = format!("x-{final_status}");
        let old = jobs.start("hold", json!({})).await.unwrap();
        let new = jobs.start("hold", json!({})).await.unwrap();
        assert!(jobs.claim_item("legacy", "src", &item, old).await.unwrap());
        db.clock.advance(Duration::minutes(31));
        assert!(
            jobs.claim_item("legacy", "src", &item, new).await.unwrap(),
            "taken over after expiry"
        );
        jobs.finish(old, final_status, None).await.unwrap();
        let c = jobs
            .claim_state(&Identity::new("legacy", "src", &item).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.status, c.job_id),
            (ClaimStatus::Claimed, Some(new)),
            "after old job {final_status}"
        );
    }
}

pub async fn s_c11_reprocess_callback_sees_the_step_id(db: TestDb) {
    let seen: Arc<Mutex<Vec<ReprocessContext>>> = Arc::default();
    let s = seen.clone();
    let rt = db
        .runtime()
        .pipeline(
            Pipeline::new("feed")
                .step("ingest", |ctx| async move {
                    let d = ctx
                        .claim("rss", "item-1")
                        .await
                        .map_err(dockhand::HandlerError::retry)?;
                    Ok(if d.is_some() {
                        StepOutput::one(json!({}))
                    } else {
                        StepOutput::Skip
                    })
                })
                .scope("shared:feed"),
        )
        .reprocess(move |c| {
            s.lock().unwrap().push(c.clone());
            true
        })
        .build()
        .await
        .unwrap();
    let first = rt.jobs().start("feed", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(
        rt.jobs().get(first).await.unwrap().status,
        JobStatus::Completed
    );
    assert!(seen.lock().unwrap().is_empty(), "nothing to reprocess yet");
    let second = rt.jobs().start("feed", json!({})).await.unwrap();
    rt.drain(10).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].step_id, "feed/ingest",
        "the executing step's id, not the scope"
    );
    assert_eq!(seen[0].scope, "shared:feed");
    assert_eq!(
        (
            seen[0].source_type.as_str(),
            seen[0].item_id.as_str(),
            seen[0].job_id
        ),
        ("rss", "item-1", second)
    );
    assert_eq!(
        rt.jobs().get(second).await.unwrap().status,
        JobStatus::Completed,
        "reprocessed"
    );
    let _ = db.clock.now();
}

pub async fn claims_for_a_final_job_are_given_back(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let job = jobs.start("hold", json!({})).await.unwrap();
    jobs.manual_fail(job, None).await.unwrap();
    // A step of that job still running tries to claim: refused, and nothing is left claimed.
    assert!(!jobs.claim_item("legacy", "src", "late", job).await.unwrap());
    assert!(jobs
        .claim_state(&Identity::new("legacy", "src", "late").unwrap())
        .await
        .unwrap()
        .is_none());
}
