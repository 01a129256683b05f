//! Completion handlers that fail in the ways a database fails (issue 15): a transient error
//! re-runs the whole claim transaction instead of failing the job for good (defect 7); a panic
//! rolls back and is an error, and the runtime and its connections keep working.

use super::claims::tracked;
use crate::harness::TestDb;
use async_trait::async_trait;
use chrono::Duration;
use dockhand::claims::ledger::TrackedItems;
use dockhand::claims::{
    ClaimStatus, CompleteOutcome, CompletionContext, CompletionError, CompletionHandler,
    CompletionResult, CompletionTx,
};
use dockhand::{CompletionConfig, HandlerError, Identity, JobStatus, Pipeline, StepOutput};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn feed(item: &str) -> Identity {
    Identity::new("shared:feed", "rss", item).unwrap()
}

/// Writes the tracked item, then fails transiently (as a deadlock inside the transaction
/// would) on its first `transient_calls` runs; afterwards it writes and succeeds.
struct Flaky {
    calls: AtomicUsize,
    transient_calls: usize,
}

#[async_trait]
impl CompletionHandler for Flaky {
    async fn complete(&self, tx: CompletionTx<'_>, ctx: &CompletionContext) -> CompletionResult {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        TrackedItems.complete(tx, ctx).await?;
        if n < self.transient_calls {
            return Err(CompletionError::transient("deadlock detected (simulated)"));
        }
        Ok(())
    }
}

/// Writes the tracked item, then panics.
struct Panicky;

#[async_trait]
impl CompletionHandler for Panicky {
    async fn complete(&self, tx: CompletionTx<'_>, ctx: &CompletionContext) -> CompletionResult {
        TrackedItems.complete(tx, ctx).await?;
        panic!("completion handler bug (simulated)");
    }
}

fn with(handler: &str) -> CompletionConfig {
    CompletionConfig {
        handler: Some(handler.into()),
        ..tracked("feed", 1, true)
    }
}

/// Defect 7: a completion handler that fails transiently once, on the claim's own completion
/// and inside the terminal bridge: the store runs the transaction again and the claim
/// completes (the job `completed`, not `failed / item_claim_completion_failed`). One that
/// keeps failing transiently is a transient error, never a final verdict: the claim stays
/// claimed and the job stays live for a later retry.
pub async fn regression_transient_completion_error_reruns_the_transaction(db: TestDb) {
    let once = Arc::new(Flaky {
        calls: AtomicUsize::new(0),
        transient_calls: 1,
    });
    let bridge_once = Arc::new(Flaky {
        calls: AtomicUsize::new(0),
        transient_calls: 1,
    });
    let always = Arc::new(Flaky {
        calls: AtomicUsize::new(0),
        transient_calls: usize::MAX,
    });
    let rt = db
        .runtime()
        .pipeline(Pipeline::new("hold").step("only", |_ctx| async { Ok(StepOutput::none()) }))
        .completion_handler("once", once.clone())
        .completion_handler("bridge_once", bridge_once.clone())
        .completion_handler("always", always.clone())
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let ttl = Duration::minutes(5);
    // Completing the claim directly.
    let d = jobs
        .claim(feed("direct"), Some(9_999_999), ttl, with("once"), false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(jobs.complete(&d).await.unwrap(), CompleteOutcome::Completed);
    assert_eq!(
        once.calls.load(Ordering::SeqCst),
        2,
        "run again after the transient error"
    );
    assert_eq!(
        db.store
            .get_claim(&feed("direct"))
            .await
            .unwrap()
            .unwrap()
            .status,
        ClaimStatus::Processed
    );
    assert!(db
        .store
        .tracked_item("feed", "direct")
        .await
        .unwrap()
        .is_some());
    // Inside the terminal bridge.
    let job = jobs.start("hold", json!({})).await.unwrap();
    jobs.claim(feed("bridged"), Some(job), ttl, with("bridge_once"), false)
        .await
        .unwrap()
        .unwrap();
    let done = jobs.finish(job, JobStatus::Completed, None).await.unwrap();
    assert_eq!(
        (done.status, done.reason.as_deref()),
        (JobStatus::Completed, None)
    );
    assert_eq!(bridge_once.calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        db.store
            .get_claim(&feed("bridged"))
            .await
            .unwrap()
            .unwrap()
            .status,
        ClaimStatus::Processed
    );
    // Transient every time: a transient error, nothing persists, nothing is decided.
    let d = jobs
        .claim(feed("stuck"), Some(9_999_998), ttl, with("always"), false)
        .await
        .unwrap()
        .unwrap();
    let e = jobs.complete(&d).await.unwrap_err();
    assert!(e.is_transient() && e.to_string().contains("stuck"), "{e}");
    let c = db.store.get_claim(&feed("stuck")).await.unwrap().unwrap();
    assert_eq!((c.status, c.token), (ClaimStatus::Claimed, Some(d.token)));
    assert!(db
        .store
        .tracked_item("feed", "stuck")
        .await
        .unwrap()
        .is_none());
    let job = jobs.start("hold", json!({})).await.unwrap();
    jobs.claim(feed("stuck-job"), Some(job), ttl, with("always"), false)
        .await
        .unwrap()
        .unwrap();
    let e = jobs
        .finish(job, JobStatus::Completed, None)
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    let j = jobs.get(job).await.unwrap();
    assert!(!j.status.is_final(), "not downgraded: {:?}", j.status);
    assert_eq!(
        db.store
            .get_claim(&feed("stuck-job"))
            .await
            .unwrap()
            .unwrap()
            .status,
        ClaimStatus::Claimed
    );
}

/// A completion handler that panics: completing the claim is an error naming the panic, the
/// handler's write and the claim's transition roll back; in the bridge the job ends
/// `failed / item_claim_completion_failed` with its claims released; a step whose bridge hits
/// it does not poison the runtime; afterwards the store (SQLite's single writer included) and
/// the runtime keep working.
pub async fn completion_handler_panic_rolls_back_and_is_an_error(db: TestDb) {
    let rt = db
        .runtime()
        .pipeline(Pipeline::new("hold").step("only", |_ctx| async { Ok(StepOutput::none()) }))
        .pipeline(Pipeline::new("claimer").step("take", |ctx| async move {
            let item = ctx.input()["item"].as_str().unwrap_or_default().to_string();
            let handler = ctx.input()["handler"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            ctx.claim_in("shared:feed", "rss", &item, with(&handler))
                .await
                .map_err(HandlerError::retry)?;
            Ok(StepOutput::one(json!({})))
        }))
        .completion_handler("panicky", Arc::new(Panicky))
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let ttl = Duration::minutes(5);
    let d = jobs
        .claim(feed("direct"), Some(9_999_999), ttl, with("panicky"), false)
        .await
        .unwrap()
        .unwrap();
    let e = jobs.complete(&d).await.unwrap_err().to_string();
    assert!(e.contains("panicked") && e.contains("direct"), "{e}");
    let c = db.store.get_claim(&feed("direct")).await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.token.as_deref()),
        (ClaimStatus::Claimed, Some(d.token.as_str())),
        "still claimed by the same token"
    );
    assert!(db
        .store
        .tracked_item("feed", "direct")
        .await
        .unwrap()
        .is_none());
    // In the bridge: the other claim's write rolls back too, both are released.
    let job = jobs.start("hold", json!({})).await.unwrap();
    for (item, cfg) in [("fine", tracked("feed", 1, true)), ("bad", with("panicky"))] {
        jobs.claim(feed(item), Some(job), ttl, cfg, false)
            .await
            .unwrap()
            .unwrap();
    }
    let done = jobs.finish(job, JobStatus::Completed, None).await.unwrap();
    assert_eq!(
        (done.status, done.reason.as_deref()),
        (JobStatus::Failed, Some("item_claim_completion_failed"))
    );
    for item in ["fine", "bad"] {
        assert!(
            db.store.get_claim(&feed(item)).await.unwrap().is_none(),
            "{item}"
        );
        assert!(db.store.tracked_item("feed", item).await.unwrap().is_none());
    }
    // A step whose job's bridge runs the panicking handler, then a healthy job, on the runtime.
    let step_job = jobs
        .start("claimer", json!({"item": "in-step", "handler": "panicky"}))
        .await
        .unwrap();
    let healthy = jobs
        .start(
            "claimer",
            json!({"item": "healthy", "handler": "dockhand.tracked_items"}),
        )
        .await
        .unwrap();
    rt.drain(20).await.unwrap();
    let j = jobs.get(step_job).await.unwrap();
    assert_eq!(
        (j.status, j.reason.as_deref()),
        (JobStatus::Failed, Some("item_claim_completion_failed"))
    );
    assert_eq!(
        jobs.get(healthy).await.unwrap().status,
        JobStatus::Completed
    );
    assert!(db
        .store
        .tracked_item("feed", "healthy")
        .await
        .unwrap()
        .is_some());
    // More transactions than the pool has connections: none was leaked.
    for i in 0..12 {
        let d = jobs
            .claim(
                feed(&format!("after-{i}")),
                None,
                ttl,
                tracked("feed", 1, true),
                false,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(jobs.complete(&d).await.unwrap(), CompleteOutcome::Completed);
    }
    assert!(jobs.check().await.unwrap().is_empty(), "audit clean");
}
