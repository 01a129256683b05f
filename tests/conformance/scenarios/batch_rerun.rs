//! Re-running a finished batch's failed children (`Jobs::rerun_failed`): a new batch parent
//! runs only what failed, with the items claimed again; the old batch stays as it was.

use super::batches::{assert_clean, children, runtime};
use super::claims::tracked;
use crate::harness::TestDb;
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, ClaimStatus};
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::Clock;
use dockhand::{Error, HandlerError, Identity, JobStatus, Packet, Pipeline, StepOutput};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn item(i: i64) -> Identity {
    Identity::new("shared:rerun", "src", format!("item-{i}")).unwrap()
}

/// `split` claims 6 items and emits one packet per item; `child` (the child step) turns item
/// `i` into `{"parsed": i}`; `upload` fails items 1 and 4 for good until `healed` is set. A
/// failed child is thus past its child step, and its own input_refs have moved on.
fn pipeline(healed: Arc<AtomicBool>) -> Pipeline {
    Pipeline::new("rerun")
        .step("split", |ctx| async move {
            let mut out = Vec::new();
            for i in 0..6 {
                let d = ctx
                    .claim_in(
                        "shared:rerun",
                        "src",
                        &format!("item-{i}"),
                        tracked("rerun", 1, true),
                    )
                    .await
                    .map_err(HandlerError::retry)?
                    .ok_or_else(|| HandlerError::fatal("item held"))?;
                out.push(Packet::new(json!({ "i": i })).with_claim(d));
            }
            Ok(StepOutput::Packets(out))
        })
        .step("child", |ctx| async move {
            let i = ctx.input()["i"]
                .as_i64()
                .ok_or_else(|| HandlerError::fatal(format!("child step got {}", ctx.input())))?;
            Ok(StepOutput::one(json!({ "parsed": i })))
        })
        .step("upload", move |ctx| {
            let healed = healed.clone();
            async move {
                let i = ctx.input()["parsed"].as_i64().unwrap_or(-1);
                if (i == 1 || i == 4) && !healed.load(Ordering::SeqCst) {
                    return Err(HandlerError::fatal(format!("item {i} is broken")));
                }
                Ok(StepOutput::one(json!({})))
            }
        })
        .chunk_size(4)
}

pub async fn batch_rerun_runs_only_failed_children_with_their_items_claimed(db: TestDb) {
    let healed = Arc::new(AtomicBool::new(false));
    let rt = runtime(&db, db.store.clone(), pipeline(healed.clone())).await;
    let parent = rt.jobs().start("rerun", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    let before = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        before.status,
        JobStatus::Completed,
        "some children completed"
    );
    let st_before = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(
        (st_before.children_total, st_before.children_failed),
        (6, 2)
    );
    let failed: Vec<_> = children(&rt, parent)
        .await
        .into_iter()
        .filter(|c| c.status == JobStatus::Failed)
        .collect();
    assert_eq!(failed.len(), 2);
    for i in [1, 4] {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "a failed child's claim is released"
        );
    }

    healed.store(true, Ordering::SeqCst);
    let rerun = rt.jobs().rerun_failed(parent).await.unwrap();
    assert_ne!(rerun, parent);
    // A batch is re-run once (items without claims would otherwise run twice).
    let refused = |r: dockhand::Result<i64>, want: &str| match r {
        Err(e @ Error::InvalidInput { .. }) => assert!(e.to_string().contains(want), "{e}"),
        other => panic!("{want}: expected a refusal, got {other:?}"),
    };
    refused(
        rt.jobs().rerun_failed(parent).await,
        &format!("was re-run already by job {rerun}"),
    );
    rt.drain(1000).await.unwrap();
    let r = rt.jobs().get(rerun).await.unwrap();
    assert_eq!(r.status, JobStatus::Completed, "{r:?}");
    let kids = children(&rt, rerun).await;
    assert_eq!(kids.len(), 2, "only the failed children run again");
    let mut got: Vec<_> = kids.iter().map(|k| k.input_refs.clone()).collect();
    let mut want: Vec<_> = failed.iter().map(|k| k.input_refs.clone()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "the same input packets");
    for k in &kids {
        assert_eq!(k.status, JobStatus::Completed);
        assert_eq!(k.step_index, failed[0].step_index, "the same child step");
    }
    for i in [1, 4] {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.status, ClaimStatus::Processed, "item {i}");
        let owner = c.job_id.unwrap();
        assert!(
            kids.iter().any(|k| k.id == owner),
            "item {i} owned by a re-run child"
        );
    }
    // The old batch is untouched: its children are still final and counted as they were.
    let after = rt.jobs().get(parent).await.unwrap();
    assert_eq!(
        (after.status, after.reason.clone()),
        (before.status, before.reason)
    );
    let st_after = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(
        (
            st_after.children_total,
            st_after.children_failed,
            st_after.children_completed
        ),
        (6, 2, 4)
    );
    for f in &failed {
        assert_eq!(rt.jobs().get(f.id).await.unwrap().status, JobStatus::Failed);
    }
    // What failed in the re-run would be re-run from the re-run; here nothing did.
    refused(
        rt.jobs().rerun_failed(rerun).await,
        "has no failed children",
    );
    refused(rt.jobs().rerun_failed(parent).await, "was re-run already");
    assert_clean(&rt).await;
}

pub async fn batch_rerun_is_refused_with_the_reason(db: TestDb) {
    let healed = Arc::new(AtomicBool::new(false));
    let rt = runtime(&db, db.store.clone(), pipeline(healed.clone())).await;
    let refused = |r: dockhand::Result<i64>, want: &str| match r {
        Err(e @ Error::InvalidInput { .. }) => {
            assert!(e.to_string().contains(want), "{want}: {e}")
        }
        other => panic!("{want}: expected a refusal, got {other:?}"),
    };
    let parent = rt.jobs().start("rerun", json!({})).await.unwrap();
    refused(rt.jobs().rerun_failed(parent).await, "not a batch parent");
    assert_eq!(rt.run_due_once().await.unwrap(), 1, "the split step");
    refused(rt.jobs().rerun_failed(parent).await, "once it is final");
    healed.store(true, Ordering::SeqCst);
    rt.drain(1000).await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    refused(rt.jobs().rerun_failed(parent).await, "no failed children");
    match rt.jobs().rerun_failed(987_654).await {
        Err(Error::NotFound { what: "job", id }) => assert_eq!(id, 987_654),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert_clean(&rt).await;
}

/// An item another job holds is left out of the re-run (its holder keeps it); a claim whose
/// acknowledgement is lost mid-re-run makes the step retry, which claims the same item again
/// under the same token and fans out once.
pub async fn batch_rerun_leaves_out_held_items_and_survives_a_lost_claim_ack(db: TestDb) {
    let healed = Arc::new(AtomicBool::new(false));
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), pipeline(healed.clone())).await;
    let parent = rt.jobs().start("rerun", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    assert_eq!(
        rt.jobs()
            .batch_state(parent)
            .await
            .unwrap()
            .unwrap()
            .children_failed,
        2
    );
    // Another owner takes item 4 meanwhile.
    let other = ClaimItemRequest {
        identity: item(4),
        job_id: Some(999_999),
        ttl: chrono::Duration::hours(1),
        completion: tracked("rerun", 1, true),
        reprocess: false,
        run: None,
    };
    assert!(matches!(
        db.store.claim_item(&other, db.clock.now()).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    healed.store(true, Ordering::SeqCst);
    // The re-run step's first claim (item 1) commits but its acknowledgement is lost.
    faulty.fail_nth("claim_item", 1, FaultMode::ExecuteThenFail);
    let rerun = rt.jobs().rerun_failed(parent).await.unwrap();
    for _ in 0..6 {
        rt.drain(1000).await.unwrap();
        db.clock.advance(chrono::Duration::seconds(15));
    }
    assert_eq!(faulty.injected(), 1, "the fault fired");
    let r = rt.jobs().get(rerun).await.unwrap();
    assert_eq!(r.status, JobStatus::Completed, "{r:?}");
    let kids = children(&rt, rerun).await;
    assert_eq!(kids.len(), 1, "item 4 is left out");
    let one = rt.jobs().claim_state(&item(1)).await.unwrap().unwrap();
    assert_eq!(
        (one.status, one.job_id),
        (ClaimStatus::Processed, Some(kids[0].id))
    );
    let four = rt.jobs().claim_state(&item(4)).await.unwrap().unwrap();
    assert_eq!(
        (four.status, four.job_id),
        (ClaimStatus::Claimed, Some(999_999)),
        "the other owner keeps item 4"
    );
    assert_clean(&rt).await;
}

/// Two re-runs requested at the same moment: both pass the checks, and the one transaction
/// that creates the job and marks the parent (compare-and-swap) lets one through; the other
/// creates nothing and is refused.
pub async fn batch_rerun_twice_at_once_starts_one(db: TestDb) {
    let healed = Arc::new(AtomicBool::new(false));
    let faulty = FaultyStore::wrap(db.store.clone());
    let rt = runtime(&db, faulty.clone(), pipeline(healed.clone())).await;
    let parent = rt.jobs().start("rerun", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    healed.store(true, Ordering::SeqCst);
    // The first request's write waits, so the second reads the same version and writes first.
    faulty.fail_nth(
        "create_rerun_job",
        1,
        FaultMode::Delay(std::time::Duration::from_millis(500)),
    );
    let jobs = rt.jobs();
    let (a, b) = tokio::join!(jobs.rerun_failed(parent), jobs.rerun_failed(parent));
    let (won, lost) = match (a, b) {
        (Ok(w), Err(e)) | (Err(e), Ok(w)) => (w, e),
        other => panic!("expected one re-run and one refusal, got {other:?}"),
    };
    assert!(lost.to_string().contains("at the same moment"), "{lost}");
    let (data, _) = db.store.engine_data(parent).await.unwrap().unwrap();
    assert_eq!(data["dockhand_rerun_by"], json!(won));
    let reruns: Vec<_> = rt
        .jobs()
        .list(&dockhand::jobs::JobFilter {
            pipeline: Some("rerun".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.id > parent && j.parent_id.is_none())
        .collect();
    assert_eq!(
        reruns.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![won],
        "the refused request created no job"
    );
    rt.drain(1000).await.unwrap();
    assert_eq!(
        rt.jobs().get(won).await.unwrap().status,
        JobStatus::Completed
    );
    assert_eq!(children(&rt, won).await.len(), 2);
    assert_clean(&rt).await;
}
