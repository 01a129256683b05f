//! Item claims: races, takeovers, stale tokens, the tracked-items ledger and failing
//! completion handlers.

use super::{claimed, cleanup, fresh, req, t0, tracked};
use crate::claims::ledger::TrackedItems;
use crate::claims::{
    ClaimFilter, ClaimOutcome, ClaimStatus, CompleteOutcome, CompletionConfig, CompletionContext,
    CompletionHandler, CompletionTx, Descriptor, Identity,
};
use crate::store::Store;
use async_trait::async_trait;
use chrono::Duration;
use std::sync::Arc;

/// Writes the tracked-items row, then fails.
struct WriteThenFail;

#[async_trait]
impl CompletionHandler for WriteThenFail {
    async fn complete(
        &self,
        tx: CompletionTx<'_>,
        ctx: &CompletionContext,
    ) -> crate::claims::CompletionResult {
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
