//! Smoke tests of the PostgreSQL store against a live server, each in a fresh schema. Skipped
//! (with a printed line) unless `DOCKHAND_TEST_POSTGRES_URL` is set.
//!
//! By topic: `actions` (the queue), `claims` (item claims), `jobs` (steps and the terminal
//! bridge), `batch` (worklists, leases, children, settling), `fence` (the fence, child
//! counters, abort, cleanup) and `recovery` (liveness, audit).

mod actions;
mod batch;
mod claims;
mod fence;
mod jobs;
mod plans;
mod recovery;

use super::PgStore;
use crate::batch::{ChildSpec, WorkItem};
use crate::claims::ledger::TRACKED_ITEMS;
use crate::claims::{
    ClaimItemRequest, ClaimOutcome, ClaimStatus, CompletionConfig, Descriptor, Identity,
};
use crate::jobs::{NewJob, StepAction};
use crate::store::{ClaimRequest, Store};
use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;

/// An instant with sub-millisecond digits, to check that times are stored in whole ms.
pub(super) fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap() + Duration::nanoseconds(123_456_789)
}

/// A migrated store in a fresh schema, or `None` (skipped) without a server URL.
pub(super) async fn fresh(test: &str) -> Option<(PgStore, String, String)> {
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

/// Closes the store and drops its schema.
pub(super) async fn cleanup(store: PgStore, url: &str, schema: &str) {
    store.close().await;
    PgStore::drop_schema(url, schema).await.unwrap();
}

/// A completion config for the shipped tracked-items handler.
pub(super) fn tracked(namespace: &str) -> CompletionConfig {
    CompletionConfig {
        handler: Some(TRACKED_ITEMS.into()),
        payload: json!({ "namespace": namespace, "revision": 2 }),
        retain_processed: true,
    }
}

/// A five-minute claim request on `step-a/rss/{item}`.
pub(super) fn req(item: &str, job: Option<i64>, completion: CompletionConfig) -> ClaimItemRequest {
    ClaimItemRequest {
        identity: Identity::new("step-a", "rss", item).unwrap(),
        job_id: job,
        ttl: Duration::minutes(5),
        completion,
        reprocess: false,
        run: None,
    }
}

/// The descriptor of a won claim (panics otherwise).
pub(super) fn claimed(o: ClaimOutcome) -> Descriptor {
    match o {
        ClaimOutcome::Claimed(d) => d,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// A claim of up to `limit` actions by `owner` at `now`, leased for 30 s.
pub(super) fn claim_request(owner: &str, now: DateTime<Utc>, limit: i64) -> ClaimRequest<'_> {
    ClaimRequest {
        owner,
        limit,
        now,
        lease_until: now + Duration::seconds(30),
        hooks: None,
        routing: None,
    }
}

/// The step-action template of every test job.
pub(super) fn step() -> StepAction {
    StepAction {
        priority: 0,
        max_attempts: 3,
        group: None,
    }
}

/// A new `feed` job (pending, its first step action queued).
pub(super) async fn new_job(s: &PgStore) -> i64 {
    let job = NewJob {
        pipeline: "feed".into(),
        input_refs: vec![],
        engine_data: json!({}),
        step: step(),
        idempotency_key: None,
    };
    s.create_job(&job, t0()).await.unwrap()
}

/// A new job holding one claim per item (`p{job}-i{k}`), and its work items: item `k` has
/// packet ref `v1:{k:064}` and its claim as sidecar.
pub(super) async fn parent_with_items(s: &PgStore, n: usize) -> (i64, Vec<WorkItem>) {
    let parent = new_job(s).await;
    let mut items = Vec::new();
    for k in 0..n {
        let r = req(&format!("p{parent}-i{k}"), Some(parent), Default::default());
        let d = claimed(s.claim_item(&r, t0()).await.unwrap());
        items.push(WorkItem {
            payload_ref: format!("v1:{k:064}"),
            sidecar: vec![d],
        });
    }
    (parent, items)
}

/// The child spec for row `idx` of `parent`, taking over `tokens`.
pub(super) fn child(parent: i64, idx: i32, tokens: Vec<String>) -> ChildSpec {
    ChildSpec {
        parent_id: parent,
        idx,
        pipeline: "feed".into(),
        step_index: 1,
        input_refs: vec![format!("v1:{idx:064}")],
        claim_tokens: tokens,
        claim_ttl: chrono::Duration::minutes(30),
        step: step(),
        run_by: None,
    }
}

/// Unique keys of the pending and running actions, in id order.
pub(super) async fn active_keys(s: &PgStore) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT unique_key FROM dockhand_actions
         WHERE status IN ('pending', 'running') AND unique_key IS NOT NULL ORDER BY id",
    )
    .fetch_all(s.pool())
    .await
    .unwrap()
}

/// Marks every action whose unique key starts with `prefix` complete (behind the store's back).
pub(super) async fn complete_actions(s: &PgStore, prefix: &str) {
    sqlx::query("UPDATE dockhand_actions SET status = 'complete' WHERE unique_key LIKE $1")
        .bind(format!("{prefix}%"))
        .execute(s.pool())
        .await
        .unwrap();
}

/// The job that holds the claim on `identity`, while it is `claimed`.
pub(super) async fn holder(s: &PgStore, identity: &Identity) -> Option<i64> {
    let c = s.get_claim(identity).await.unwrap()?;
    (c.status == ClaimStatus::Claimed)
        .then_some(c.job_id)
        .flatten()
}

/// The field of an input error (panics on any other error).
pub(super) fn invalid(e: crate::Error) -> &'static str {
    match e {
        crate::Error::InvalidInput { field, .. } => field,
        other => panic!("expected an input error, got {other}"),
    }
}
