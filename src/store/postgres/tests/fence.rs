//! Batches, second half: the fence, the child counters the terminal bridge bumps (and the
//! finalize action they enqueue), aborts, and worklist cleanup.

use super::{active_keys, child, cleanup, fresh, holder, invalid, new_job, parent_with_items, t0};
use crate::batch::{BatchAbort, ChildOutcome, FenceOutcome, RowSettle};
use crate::claims::CompletionRegistry;
use crate::state::JobStatus;
use crate::store::test_lease::running_lease;
use crate::store::Store;
use chrono::Duration;

#[tokio::test]
async fn fence_and_the_child_counters_enqueue_finalize_once() {
    let Some((s, url, schema)) = fresh("fence").await else {
        return;
    };
    let now = t0();
    let until = now + Duration::minutes(5);
    let reg = CompletionRegistry::with_builtins();
    let e = s.fence_batch(new_job(&s).await, now).await.unwrap_err();
    assert_eq!(invalid(e), "job");
    let e = s.fence_batch(999, now).await.unwrap_err();
    assert!(matches!(e, crate::Error::NotFound { .. }), "{e}");

    // A: fenced while both children are active; the last child's bridge enqueues finalize.
    let (a, items) = parent_with_items(&s, 2).await;
    s.fan_out(a, None, &items, (10, 1), "c", now).await.unwrap();
    s.lease_work(a, 10, running_lease(&s, "w", now).await, until, now)
        .await
        .unwrap();
    let out = s.fence_batch(a, now).await.unwrap();
    assert_eq!(
        out,
        FenceOutcome::Outstanding {
            ready: 0,
            leased: 2
        }
    );
    let mut kids = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let spec = child(a, i as i32, vec![item.sidecar[0].token.clone()]);
        match s
            .create_child(&spec, running_lease(&s, "w", now).await, now)
            .await
            .unwrap()
        {
            ChildOutcome::Created(c) => kids.push(c),
            other => panic!("{other:?}"),
        }
    }
    let out = s.fence_batch(a, now).await.unwrap();
    assert_eq!(
        out,
        FenceOutcome::Fenced {
            finalize_enqueued: false
        }
    );
    let finalize = format!("f:{a}");
    s.finish_job(kids[0], JobStatus::Completed, None, &reg, now)
        .await
        .unwrap();
    let st = s.batch_state(a).await.unwrap().unwrap();
    assert_eq!((st.children_terminal, st.children_completed), (1, 1));
    assert!(!active_keys(&s).await.contains(&finalize));
    assert_eq!(st.decision(), None);
    let mut rx = s.wakeups();
    rx.borrow_and_update();
    s.finish_job(kids[1], JobStatus::Failed, Some("boom"), &reg, now)
        .await
        .unwrap();
    assert!(rx.has_changed().unwrap(), "finalize wakes runners");
    let st = s.batch_state(a).await.unwrap().unwrap();
    assert_eq!(
        (st.children_terminal, st.children_failed, st.fenced),
        (2, 1, true)
    );
    assert_eq!(st.decision(), Some((JobStatus::Completed, None)));
    assert!(active_keys(&s).await.contains(&finalize));
    let claim = s
        .get_claim(&items[0].sidecar[0].identity)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        claim.status,
        crate::claims::ClaimStatus::Processed,
        "completed by its child"
    );
    assert!(s
        .get_claim(&items[1].sidecar[0].identity)
        .await
        .unwrap()
        .is_none());

    // B: no child at all (the row was discarded): the fence enqueues finalize itself, once.
    let (b, items) = parent_with_items(&s, 1).await;
    s.fan_out(b, None, &items, (10, 1), "c", now).await.unwrap();
    let discard = RowSettle::Discard { reason: "x".into() };
    s.settle_work(b, 0, running_lease(&s, "w", now).await, &discard, now)
        .await
        .unwrap();
    for _ in 0..2 {
        let out = s.fence_batch(b, now).await.unwrap();
        assert_eq!(
            out,
            FenceOutcome::Fenced {
                finalize_enqueued: true
            }
        );
    }
    let keys = active_keys(&s).await;
    assert_eq!(keys.iter().filter(|k| **k == format!("f:{b}")).count(), 1);

    // C: every child terminal before the fence (not fenced then: no finalize from the bridge).
    let (c, items) = parent_with_items(&s, 1).await;
    s.fan_out(c, None, &items, (10, 1), "c", now).await.unwrap();
    s.lease_work(c, 10, running_lease(&s, "w", now).await, until, now)
        .await
        .unwrap();
    let ChildOutcome::Created(k) = s
        .create_child(&child(c, 0, vec![]), running_lease(&s, "w", now).await, now)
        .await
        .unwrap()
    else {
        panic!("expected a new child");
    };
    s.finish_job(k, JobStatus::Skipped, None, &reg, now)
        .await
        .unwrap();
    let st = s.batch_state(c).await.unwrap().unwrap();
    assert_eq!((st.children_terminal, st.children_skipped), (1, 1));
    assert!(!active_keys(&s).await.contains(&format!("f:{c}")));
    let out = s.fence_batch(c, now).await.unwrap();
    assert_eq!(
        out,
        FenceOutcome::Fenced {
            finalize_enqueued: true
        }
    );
    assert!(active_keys(&s).await.contains(&format!("f:{c}")));
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn abort_discards_ready_rows_and_cleanup_waits_for_final() {
    let Some((s, url, schema)) = fresh("abort").await else {
        return;
    };
    let now = t0();
    let (p, items) = parent_with_items(&s, 3).await;
    s.fan_out(p, None, &items, (10, 1), "c", now).await.unwrap();
    let e = s
        .abort_batch(new_job(&s).await, BatchAbort::cancel(), now)
        .await
        .unwrap_err();
    assert_eq!(invalid(e), "job");
    s.lease_work(
        p,
        1,
        running_lease(&s, "w", now).await,
        now + Duration::minutes(5),
        now,
    )
    .await
    .unwrap();
    let st = s.abort_batch(p, BatchAbort::cancel(), now).await.unwrap();
    assert_eq!(st.outcome.as_deref(), Some("cancel_requested"));
    assert!(st.fenced);
    assert_eq!((st.ready, st.leased, st.discarded_rows), (0, 1, 2));
    assert_eq!(
        holder(&s, &items[0].sidecar[0].identity).await,
        Some(p),
        "leased: kept"
    );
    for item in &items[1..] {
        assert!(s
            .get_claim(&item.sidecar[0].identity)
            .await
            .unwrap()
            .is_none());
    }
    let errors: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT error FROM dockhand_worklist WHERE parent_id = $1 AND state = 'discarded'",
    )
    .bind(p)
    .fetch_all(s.pool())
    .await
    .unwrap();
    assert_eq!(
        errors,
        [Some("cancelled".to_string()), Some("cancelled".to_string())]
    );
    // The first outcome stands.
    let st = s
        .abort_batch(p, BatchAbort::ScheduleFailed, now)
        .await
        .unwrap();
    assert_eq!(st.outcome.as_deref(), Some("cancel_requested"));

    let e = s.cleanup_worklist(p).await.unwrap_err();
    assert_eq!(invalid(e), "job");
    let reg = CompletionRegistry::with_builtins();
    s.finish_job(p, JobStatus::Cancelled, Some("manual"), &reg, now)
        .await
        .unwrap();
    assert_eq!(s.cleanup_worklist(p).await.unwrap(), 3);
    assert_eq!(s.cleanup_worklist(p).await.unwrap(), 0);
    assert_eq!(s.cleanup_worklist(999).await.unwrap(), 0, "orphans only");

    // A schedule failure on a fresh batch.
    let (q, items) = parent_with_items(&s, 2).await;
    s.fan_out(q, None, &items, (10, 1), "c", now).await.unwrap();
    let st = s
        .abort_batch(q, BatchAbort::ScheduleFailed, now)
        .await
        .unwrap();
    assert_eq!(st.outcome.as_deref(), Some("batch_schedule_failed"));
    assert_eq!(
        st.decision(),
        Some((JobStatus::Failed, Some("batch_schedule_failed")))
    );
    cleanup(s, &url, &schema).await;
}

/// The parent lock `create_children` and the step starts hold (`FOR KEY SHARE`, so the
/// children's counter updates do not queue behind the next chunk's creation): a child's
/// finish and its counter update go through while it is held, and a stop, the fence and the
/// parent's own finish wait for it (they lock `FOR UPDATE`), so no child is created or started
/// after a stop committed.
#[tokio::test]
async fn parent_key_share_lets_counters_through_and_holds_stops() {
    let Some((s, url, schema)) = fresh("key_share").await else {
        return;
    };
    let now = t0();
    let until = now + Duration::minutes(5);
    let reg = CompletionRegistry::with_builtins();
    let (a, items) = parent_with_items(&s, 2).await;
    s.fan_out(a, None, &items, (10, 1), "c", now).await.unwrap();
    s.lease_work(a, 10, running_lease(&s, "w", now).await, until, now)
        .await
        .unwrap();
    let spec = child(a, 0, vec![items[0].sidecar[0].token.clone()]);
    let ChildOutcome::Created(kid) = s
        .create_child(&spec, running_lease(&s, "w", now).await, now)
        .await
        .unwrap()
    else {
        panic!("child not created");
    };
    let mut holder_tx = s.pool().begin().await.unwrap();
    sqlx::query("SELECT status FROM dockhand_jobs WHERE id = $1 FOR KEY SHARE")
        .bind(a)
        .execute(&mut *holder_tx)
        .await
        .unwrap();
    let wait = std::time::Duration::from_millis(500);
    let finished = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.finish_job(kid, JobStatus::Completed, None, &reg, now),
    )
    .await
    .expect("a child's finish waited for the parent's key share lock");
    finished.unwrap();
    let stop = BatchAbort::cancel();
    assert!(
        tokio::time::timeout(wait, s.abort_batch(a, stop.clone(), now))
            .await
            .is_err(),
        "a stop went through while the parent was key-share locked"
    );
    assert!(
        tokio::time::timeout(wait, s.fence_batch(a, now))
            .await
            .is_err(),
        "the fence went through while the parent was key-share locked"
    );
    assert!(
        tokio::time::timeout(wait, s.finish_job(a, JobStatus::Failed, None, &reg, now))
            .await
            .is_err(),
        "the parent's finish went through while it was key-share locked"
    );
    holder_tx.rollback().await.unwrap();
    let st = s.abort_batch(a, stop, now).await.unwrap();
    assert_eq!((st.children_terminal, st.children_completed), (1, 1));
    cleanup(s, &url, &schema).await;
}
