//! Focused tests of the SQLite batch methods — fan-out, leasing, child creation, settling —
//! on a temp file, and the helpers the `fence` and `recovery` tests share.

use super::SqliteStore;
use crate::batch::{BatchState, ChildOutcome, ChildSpec, FanOutOutcome, RowSettle, WorkItem};
use crate::claims::{ClaimItemRequest, ClaimOutcome, CompletionConfig, Descriptor, Identity};
use crate::error::Error;
use crate::jobs::{NewJob, StepAction};
use crate::state::JobStatus;
use crate::store::test_lease::running_lease;
use crate::store::Store;
use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;

pub(super) fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap()
}

pub(super) async fn fresh() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("b.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    (store, dir)
}

pub(super) fn step() -> StepAction {
    StepAction {
        priority: 0,
        max_attempts: 3,
        group: None,
    }
}

pub(super) async fn new_job(store: &SqliteStore) -> i64 {
    let job = NewJob {
        pipeline: "p".into(),
        input_refs: vec![],
        engine_data: json!({}),
        step: step(),
        idempotency_key: None,
    };
    store.create_job(&job, t0()).await.unwrap()
}

pub(super) async fn claim_for(store: &SqliteStore, job: i64, item: &str) -> Descriptor {
    let req = ClaimItemRequest {
        identity: Identity::new("step-a", "rss", item).unwrap(),
        job_id: Some(job),
        ttl: Duration::minutes(30),
        completion: CompletionConfig::default(),
        reprocess: false,
        run: None,
    };
    match store.claim_item(&req, t0()).await.unwrap() {
        ClaimOutcome::Claimed(d) => d,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// Who holds `d`'s claim now (`None`: the row is gone).
pub(super) async fn holder(store: &SqliteStore, d: &Descriptor) -> Option<Option<i64>> {
    let claim = store.get_claim(&d.identity).await.unwrap();
    claim.map(|c| c.job_id)
}

pub(super) fn item(n: usize, sidecar: Vec<Descriptor>) -> WorkItem {
    WorkItem {
        payload_ref: format!("v1:{n:064}"),
        sidecar,
    }
}

pub(super) fn spec(parent: i64, idx: i32, tokens: &[&Descriptor]) -> ChildSpec {
    ChildSpec {
        parent_id: parent,
        idx,
        pipeline: "p".into(),
        step_index: 2,
        input_refs: vec![format!("v1:{idx}")],
        claim_tokens: tokens.iter().map(|d| d.token.clone()).collect(),
        claim_ttl: chrono::Duration::minutes(30),
        step: step(),
        run_by: None,
    }
}

pub(super) async fn state(store: &SqliteStore, parent: i64) -> BatchState {
    store.batch_state(parent).await.unwrap().unwrap()
}

pub(super) async fn sql(store: &SqliteStore, q: &str) {
    sqlx::query(q).execute(store.pool()).await.unwrap();
}

/// The newest action with this unique key: its status.
pub(super) async fn action(store: &SqliteStore, key: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM dockhand_actions WHERE unique_key = ? ORDER BY id DESC")
        .bind(key)
        .fetch_optional(store.pool())
        .await
        .unwrap()
}

/// A parent with `n` items fanned out, each with one claim of its own in its sidecar.
pub(super) async fn parent_with(store: &SqliteStore, n: usize) -> (i64, Vec<Descriptor>) {
    let parent = new_job(store).await;
    let mut claims = Vec::new();
    for i in 0..n {
        claims.push(claim_for(store, parent, &format!("p{parent}-{i}")).await);
    }
    let items: Vec<_> = (0..n).map(|i| item(i, vec![claims[i].clone()])).collect();
    let r = store
        .fan_out(parent, None, &items, (10, 2), "c", t0())
        .await
        .unwrap();
    assert_eq!(r, FanOutOutcome::Created);
    (parent, claims)
}

#[tokio::test]
pub(super) async fn fan_out_creates_adopts_and_rejects() {
    let (store, _dir) = fresh().await;
    let (parent, claims) = parent_with(&store, 3).await;
    let st = state(&store, parent).await;
    assert_eq!(
        (
            st.items_total,
            st.ready,
            st.chunk_size,
            st.child_step,
            st.fenced
        ),
        (3, 3, 10, 2, false)
    );
    assert_eq!(st.status, Some(JobStatus::Pending));
    let again: Vec<_> = (0..5).map(|i| item(i, vec![])).collect();
    let r = store
        .fan_out(parent, None, &again, (10, 2), "c", t0())
        .await;
    assert_eq!(r.unwrap(), FanOutOutcome::Adopted);
    let r = store
        .fan_out(parent, None, &again, (10, 2), "other", t0())
        .await;
    assert_eq!(
        r.unwrap(),
        FanOutOutcome::Rejected {
            existing: "c".into()
        }
    );
    assert_eq!(state(&store, parent).await.items_total, 3);
    let rows = store
        .lease_work(
            parent,
            10,
            running_lease(&store, "o", t0()).await,
            t0(),
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(rows[1].sidecar, vec![claims[1].clone()]);

    let missing = store.fan_out(999, None, &again, (10, 2), "c", t0()).await;
    assert!(matches!(missing, Err(Error::NotFound { what: "job", .. })));
    let empty = store.fan_out(parent, None, &[], (10, 2), "c", t0()).await;
    assert!(matches!(
        empty,
        Err(Error::InvalidInput {
            field: "packets",
            ..
        })
    ));
    assert!(store.batch_state(999).await.unwrap().is_none());
    assert!(store
        .batch_state(new_job(&store).await)
        .await
        .unwrap()
        .is_none());

    // More rows than one multi-row INSERT holds.
    let big = new_job(&store).await;
    let many: Vec<_> = (0..8_100).map(|i| item(i, vec![])).collect();
    store
        .fan_out(big, None, &many, (100, 1), "big", t0())
        .await
        .unwrap();
    assert_eq!(state(&store, big).await.ready, 8_100);
}

#[tokio::test]
pub(super) async fn lease_work_in_idx_order_and_expired_leases_come_back() {
    let (store, _dir) = fresh().await;
    let (parent, _) = parent_with(&store, 5).await;
    sql(
        &store,
        "UPDATE dockhand_worklist SET sidecar = 'not json' WHERE idx = 4",
    )
    .await;
    let short = t0() + Duration::minutes(1);
    let long = t0() + Duration::minutes(10);
    let a = store
        .lease_work(
            parent,
            2,
            running_lease(&store, "a", t0()).await,
            short,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(a.iter().map(|r| r.idx).collect::<Vec<_>>(), [0, 1]);
    let b = store
        .lease_work(
            parent,
            2,
            running_lease(&store, "b", t0()).await,
            long,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(b.iter().map(|r| r.idx).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(state(&store, parent).await.leased, 4);

    // At +2m: a's leases expired, b's hold; row 4 is still ready.
    let later = t0() + Duration::minutes(2);
    let c = store
        .lease_work(
            parent,
            10,
            running_lease(&store, "c", later).await,
            long,
            later,
        )
        .await
        .unwrap();
    assert_eq!(c.iter().map(|r| r.idx).collect::<Vec<_>>(), [0, 1, 4]);
    assert!(c[0].sidecar_error.is_none() && c[0].sidecar.len() == 1);
    assert!(c[2].sidecar.is_empty() && c[2].sidecar_error.is_some());
    assert!(store
        .lease_work(
            parent,
            10,
            running_lease(&store, "d", later).await,
            long,
            later
        )
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .lease_work(
            parent,
            0,
            running_lease(&store, "d", later).await,
            long,
            later
        )
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
pub(super) async fn create_child_hands_over_claims_once() {
    let (store, _dir) = fresh().await;
    let (parent, claims) = parent_with(&store, 2).await;
    store
        .lease_work(
            parent,
            10,
            running_lease(&store, "o", t0()).await,
            t0() + Duration::minutes(5),
            t0(),
        )
        .await
        .unwrap();
    let r = store
        .create_child(
            &spec(parent, 0, &[&claims[0]]),
            running_lease(&store, "o", t0()).await,
            t0(),
        )
        .await
        .unwrap();
    let ChildOutcome::Created(child) = r else {
        panic!("expected Created, got {r:?}")
    };
    assert_eq!(holder(&store, &claims[0]).await, Some(Some(child)));
    assert_eq!(holder(&store, &claims[1]).await, Some(Some(parent)));
    let job = store.get_job(child).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.step_index, job.parent_id, job.input_refs),
        (
            JobStatus::Pending,
            2,
            Some(parent),
            vec!["v1:0".to_string()]
        )
    );
    assert_eq!(
        action(&store, &format!("j:{child}:2")).await.as_deref(),
        Some("pending")
    );
    let st = state(&store, parent).await;
    assert_eq!((st.children_total, st.completed_rows, st.leased), (1, 1, 1));

    // A duplicate delivery adopts; nothing else moves.
    let again = store
        .create_child(
            &spec(parent, 0, &[&claims[0]]),
            running_lease(&store, "o", t0()).await,
            t0(),
        )
        .await;
    assert_eq!(again.unwrap(), ChildOutcome::Adopted(child));
    assert_eq!(state(&store, parent).await.children_total, 1);

    // No child for a discarded row, a missing row, or a missing parent.
    let discard = RowSettle::Discard {
        reason: "bad".into(),
    };
    store
        .settle_work(
            parent,
            1,
            running_lease(&store, "o", t0()).await,
            &discard,
            t0(),
        )
        .await
        .unwrap();
    assert!(store
        .create_child(
            &spec(parent, 1, &[]),
            running_lease(&store, "o", t0()).await,
            t0()
        )
        .await
        .is_err());
    assert!(store
        .create_child(
            &spec(parent, 7, &[]),
            running_lease(&store, "o", t0()).await,
            t0()
        )
        .await
        .is_err());
    assert!(store
        .create_child(
            &spec(999, 0, &[]),
            running_lease(&store, "o", t0()).await,
            t0()
        )
        .await
        .is_err());
    assert_eq!(state(&store, parent).await.children_total, 1);
}

#[tokio::test]
pub(super) async fn settle_retries_up_to_the_bound_then_discards_and_releases() {
    let (store, _dir) = fresh().await;
    let (parent, claims) = parent_with(&store, 3).await;
    sql(
        &store,
        "UPDATE dockhand_worklist SET sidecar = '{oops' WHERE idx = 2",
    )
    .await;
    let until = t0() + Duration::minutes(5);
    store
        .lease_work(
            parent,
            10,
            running_lease(&store, "o", t0()).await,
            until,
            t0(),
        )
        .await
        .unwrap();
    let retry = RowSettle::Retry {
        error: "db busy".into(),
        max_attempts: 2,
    };
    store
        .settle_work(
            parent,
            0,
            running_lease(&store, "o", t0()).await,
            &retry,
            t0(),
        )
        .await
        .unwrap();
    let st = state(&store, parent).await;
    assert_eq!((st.ready, st.leased), (1, 2));
    // Another chunk action (another owner): only the ready row; rows 1 and 2 stay with "o".
    let rows = store
        .lease_work(
            parent,
            10,
            running_lease(&store, "o2", t0()).await,
            until,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!((rows.len(), rows[0].attempts), (1, 1));
    assert_eq!(holder(&store, &claims[0]).await, Some(Some(parent)));

    // Second failure reaches the bound: discarded, error kept, its claim released.
    store
        .settle_work(
            parent,
            0,
            running_lease(&store, "o2", t0()).await,
            &retry,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(holder(&store, &claims[0]).await, None);
    let (st_, error): (String, Option<String>) = sqlx::query_as(
        "SELECT state, error FROM dockhand_worklist WHERE parent_id = ? AND idx = 0",
    )
    .bind(parent)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        (st_.as_str(), error.as_deref()),
        ("discarded", Some("db busy"))
    );

    // Discard now; a corrupt sidecar is no error and releases by job id: every claim the
    // parent holds that no other live row names (here: row 2's own).
    let discard = RowSettle::Discard {
        reason: "hydration failed".into(),
    };
    store
        .settle_work(
            parent,
            1,
            running_lease(&store, "o2", t0()).await,
            &discard,
            t0(),
        )
        .await
        .unwrap();
    store
        .settle_work(
            parent,
            2,
            running_lease(&store, "o2", t0()).await,
            &discard,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(holder(&store, &claims[1]).await, None);
    assert_eq!(holder(&store, &claims[2]).await, None);
    let st = state(&store, parent).await;
    assert_eq!((st.discarded_rows, st.ready, st.leased), (3, 0, 0));
    // Settling a settled row changes nothing.
    store
        .settle_work(
            parent,
            1,
            running_lease(&store, "o2", t0()).await,
            &retry,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(state(&store, parent).await.discarded_rows, 3);
}
