//! Batches, first half: fan-out (created, adopted, rejected), row leases under concurrency,
//! child creation with its claim hand-over, and settling rows that did not become children.

use super::{
    active_keys, child, cleanup, fresh, holder, invalid, new_job, parent_with_items, req, t0,
};
use crate::batch::{ChildOutcome, FanOutOutcome, RowSettle};
use crate::state::JobStatus;
use crate::store::test_lease::running_lease;
use crate::store::Store;
use chrono::Duration;
use std::collections::BTreeSet;
use std::sync::Arc;

#[tokio::test]
async fn fan_out_created_adopted_rejected() {
    let Some((s, url, schema)) = fresh("fan_out").await else {
        return;
    };
    let now = t0();
    let (p, items) = parent_with_items(&s, 3).await;
    let e = s
        .fan_out(p, None, &[], (2, 1), "c1", now)
        .await
        .unwrap_err();
    assert_eq!(invalid(e), "packets");
    let e = s
        .fan_out(p, None, &items, (0, 1), "c1", now)
        .await
        .unwrap_err();
    assert_eq!(invalid(e), "chunk_size");
    let e = s
        .fan_out(999, None, &items, (2, 1), "c1", now)
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
    assert_eq!(
        s.batch_state(p).await.unwrap(),
        None,
        "not a batch parent yet"
    );
    assert_eq!(s.batch_state(999).await.unwrap(), None);

    let created = s.fan_out(p, None, &items, (2, 1), "c1", now).await.unwrap();
    assert_eq!(created, FanOutOutcome::Created);
    let st = s.batch_state(p).await.unwrap().unwrap();
    assert_eq!(st.status, Some(JobStatus::Pending));
    assert_eq!(
        (st.items_total, st.ready, st.chunk_size, st.child_step),
        (3, 3, 2, 1)
    );
    assert!(!st.fenced && st.outcome.is_none());
    let adopted = s.fan_out(p, None, &items, (2, 1), "c1", now).await.unwrap();
    assert_eq!(adopted, FanOutOutcome::Adopted);
    let rejected = s
        .fan_out(p, None, &items[..1], (2, 1), "c2", now)
        .await
        .unwrap();
    assert_eq!(
        rejected,
        FanOutOutcome::Rejected {
            existing: "c1".into()
        }
    );
    assert_eq!(
        s.batch_state(p).await.unwrap().unwrap(),
        st,
        "nothing rewritten"
    );

    // The sidecar round-trips through the worklist.
    let rows = s
        .lease_work(
            p,
            10,
            running_lease(&s, "w", now).await,
            now + Duration::minutes(5),
            now,
        )
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.idx).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(rows[1].payload_ref, items[1].payload_ref);
    assert_eq!(rows[1].sidecar, items[1].sidecar);
    assert_eq!((rows[1].sidecar_error.clone(), rows[1].attempts), (None, 0));

    // Chunk actions: unique per (parent, offset), due now, waking runners.
    let mut rx = s.wakeups();
    rx.borrow_and_update();
    s.schedule_chunk(p, 0, 5, now).await.unwrap();
    s.schedule_chunk(p, 0, 5, now).await.unwrap();
    s.schedule_chunk(p, 2, 5, now).await.unwrap();
    assert!(rx.has_changed().unwrap());
    let keys = active_keys(&s).await;
    assert_eq!(
        keys,
        [format!("j:{p}:0"), format!("b:{p}:0"), format!("b:{p}:2")]
    );
    cleanup(s, &url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_leasers_get_disjoint_rows() {
    let Some((s, url, schema)) = fresh("lease_work").await else {
        return;
    };
    let s = Arc::new(s);
    let now = t0();
    let until = now + Duration::minutes(5);
    let (p, items) = parent_with_items(&s, 40).await;
    s.fan_out(p, None, &items, (5, 1), "c", now).await.unwrap();
    assert!(s
        .lease_work(p, 0, running_lease(&*s, "w", now).await, until, now)
        .await
        .unwrap()
        .is_empty());

    // Rows locked by another transaction are skipped, not waited for.
    let mut tx = s.pool().begin().await.unwrap();
    sqlx::query("SELECT idx FROM dockhand_worklist WHERE parent_id = $1 AND idx < 3 FOR UPDATE")
        .bind(p)
        .execute(&mut *tx)
        .await
        .unwrap();
    let got = s
        .lease_work(p, 2, running_lease(&*s, "w0", now).await, until, now)
        .await
        .unwrap();
    assert_eq!(got.iter().map(|r| r.idx).collect::<Vec<_>>(), [3, 4]);
    tx.rollback().await.unwrap();

    // Eight leasers at once: no row is handed out twice.
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (s, barrier) = (s.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let owner = format!("w{}", i + 1);
                s.lease_work(p, 5, running_lease(&*s, &owner, now).await, until, now)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    for t in tasks {
        for row in t.await.unwrap() {
            assert!(seen.insert(row.idx), "row {} leased twice", row.idx);
        }
    }
    assert!(seen.len() <= 38 && !seen.contains(&3) && !seen.contains(&4));
    // Whatever the race left over is still leasable; then nothing is.
    let rest = s
        .lease_work(p, 100, running_lease(&*s, "w9", now).await, until, now)
        .await
        .unwrap();
    for row in &rest {
        assert!(seen.insert(row.idx), "row {} leased twice", row.idx);
    }
    assert_eq!(seen.len(), 38);
    assert!(s
        .lease_work(p, 100, running_lease(&*s, "w9", now).await, until, now)
        .await
        .unwrap()
        .is_empty());

    // Expired leases are leased again, in idx order; an undecodable sidecar is reported.
    sqlx::query(
        "UPDATE dockhand_worklist SET sidecar = '{\"bad\": 1}' WHERE parent_id = $1 AND idx = 1",
    )
    .bind(p)
    .execute(s.pool())
    .await
    .unwrap();
    let later = until + Duration::seconds(1);
    let again = s
        .lease_work(
            p,
            3,
            running_lease(&*s, "late", later).await,
            later + Duration::minutes(5),
            later,
        )
        .await;
    let again = again.unwrap();
    assert_eq!(again.iter().map(|r| r.idx).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(again[1].sidecar.is_empty() && again[1].sidecar_error.is_some());
    assert_eq!(again[0].sidecar.len(), 1);
    let s = Arc::into_inner(s).unwrap();
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn create_child_hands_over_claims_and_adopts_repeats() {
    let Some((s, url, schema)) = fresh("create_child").await else {
        return;
    };
    let now = t0();
    let (p, items) = parent_with_items(&s, 2).await;
    s.fan_out(p, None, &items, (10, 1), "c", now).await.unwrap();
    s.lease_work(
        p,
        10,
        running_lease(&s, "w", now).await,
        now + Duration::minutes(5),
        now,
    )
    .await
    .unwrap();
    let tokens = vec![items[0].sidecar[0].token.clone()];
    let mut rx = s.wakeups();
    rx.borrow_and_update();
    let ChildOutcome::Created(c) = s
        .create_child(
            &child(p, 0, tokens.clone()),
            running_lease(&s, "w", now).await,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("expected a new child");
    };
    assert!(rx.has_changed().unwrap(), "the child's step wakes runners");
    let job = s.get_job(c).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.parent_id, job.step_index, job.input_refs),
        (
            JobStatus::Pending,
            Some(p),
            1,
            vec![format!("v1:{:064}", 0)]
        )
    );
    let index: Option<i32> =
        sqlx::query_scalar("SELECT child_index FROM dockhand_jobs WHERE id = $1")
            .bind(c)
            .fetch_one(s.pool())
            .await
            .unwrap();
    assert_eq!(index, Some(0));
    assert_eq!(holder(&s, &items[0].sidecar[0].identity).await, Some(c));
    assert_eq!(holder(&s, &items[1].sidecar[0].identity).await, Some(p));
    let st = s.batch_state(p).await.unwrap().unwrap();
    assert_eq!((st.children_total, st.completed_rows, st.leased), (1, 1, 1));

    // A duplicate delivery adopts the child: no second child, counter or step action.
    let again = s
        .create_child(&child(p, 0, tokens), running_lease(&s, "w", now).await, now)
        .await
        .unwrap();
    assert_eq!(again, ChildOutcome::Adopted(c));
    assert_eq!(s.batch_state(p).await.unwrap().unwrap().children_total, 1);
    assert_eq!(
        active_keys(&s).await,
        [format!("j:{p}:0"), format!("j:{c}:1")]
    );

    let e = s
        .create_child(
            &child(p, 99, vec![]),
            running_lease(&s, "w", now).await,
            now,
        )
        .await
        .unwrap_err();
    assert_eq!(invalid(e), "idx");
    let e = s
        .create_child(
            &child(999, 0, vec![]),
            running_lease(&s, "w", now).await,
            now,
        )
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
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn settle_retries_up_to_the_bound_then_discards_and_releases() {
    let Some((s, url, schema)) = fresh("settle_work").await else {
        return;
    };
    let now = t0();
    let until = now + Duration::minutes(5);
    let (p, mut items) = parent_with_items(&s, 2).await;
    // Row 1's sidecar also names a claim another job holds: discarding must not touch it.
    let other = new_job(&s).await;
    let foreign = super::claimed(
        s.claim_item(&req("foreign", Some(other), Default::default()), now)
            .await
            .unwrap(),
    );
    items[1].sidecar.push(foreign.clone());
    s.fan_out(p, None, &items, (10, 1), "c", now).await.unwrap();
    s.lease_work(p, 10, running_lease(&s, "w", now).await, until, now)
        .await
        .unwrap();

    let retry = RowSettle::Retry {
        error: "db hiccup".into(),
        max_attempts: 2,
    };
    s.settle_work(p, 0, running_lease(&s, "w", now).await, &retry, now)
        .await
        .unwrap();
    let row: (String, i32, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT state, attempts, error, lease_owner FROM dockhand_worklist
         WHERE parent_id = $1 AND idx = 0",
    )
    .bind(p)
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!(row, ("ready".into(), 1, Some("db hiccup".into()), None));
    assert_eq!(holder(&s, &items[0].sidecar[0].identity).await, Some(p));
    // Another chunk action (another owner): only the ready row.
    let leased = s
        .lease_work(p, 10, running_lease(&s, "w2", now).await, until, now)
        .await
        .unwrap();
    assert_eq!((leased.len(), leased[0].attempts), (1, 1));
    s.settle_work(p, 0, running_lease(&s, "w2", now).await, &retry, now)
        .await
        .unwrap();
    let row: (String, i32, Option<String>) = sqlx::query_as(
        "SELECT state, attempts, error FROM dockhand_worklist WHERE parent_id = $1 AND idx = 0",
    )
    .bind(p)
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!(row, ("discarded".into(), 2, Some("db hiccup".into())));
    assert_eq!(
        holder(&s, &items[0].sidecar[0].identity).await,
        None,
        "released"
    );
    assert!(s
        .get_claim(&items[0].sidecar[0].identity)
        .await
        .unwrap()
        .is_none());

    let discard = RowSettle::Discard {
        reason: "hydration failed".into(),
    };
    s.settle_work(p, 1, running_lease(&s, "w2", now).await, &discard, now)
        .await
        .unwrap();
    assert_eq!(holder(&s, &items[1].sidecar[0].identity).await, None);
    assert_eq!(
        holder(&s, &foreign.identity).await,
        Some(other),
        "not the parent's"
    );
    // Settling a settled row does nothing; a missing row is an input error.
    s.settle_work(p, 1, running_lease(&s, "w2", now).await, &retry, now)
        .await
        .unwrap();
    let st = s.batch_state(p).await.unwrap().unwrap();
    assert_eq!((st.ready, st.leased, st.discarded_rows), (0, 0, 2));
    let e = s
        .settle_work(p, 7, running_lease(&s, "w2", now).await, &discard, now)
        .await
        .unwrap_err();
    assert_eq!(invalid(e), "idx");
    cleanup(s, &url, &schema).await;
}
