//! Focused tests of the SQLite fence, abort, cleanup and the children's counters.

use super::batch_tests::{action, fresh, holder, new_job, parent_with, spec, state, t0};
use crate::batch::{BatchAbort, ChildOutcome, FenceOutcome};
use crate::claims::CompletionRegistry;
use crate::state::JobStatus;
use crate::store::test_lease::running_lease;
use crate::store::Store;
use chrono::Duration;

#[tokio::test]
async fn fence_and_terminal_children_enqueue_finalize() {
    let (store, _dir) = fresh().await;
    let reg = CompletionRegistry::with_builtins();
    let until = t0() + Duration::minutes(5);

    // Children terminal before the fence: the fence enqueues finalize.
    let (a, ca) = parent_with(&store, 1).await;
    assert_eq!(
        store.fence_batch(a, t0()).await.unwrap(),
        FenceOutcome::Outstanding {
            ready: 1,
            leased: 0
        }
    );
    store
        .lease_work(a, 10, running_lease(&store, "o", t0()).await, until, t0())
        .await
        .unwrap();
    let Ok(ChildOutcome::Created(child)) = store
        .create_child(
            &spec(a, 0, &[&ca[0]]),
            running_lease(&store, "o", t0()).await,
            t0(),
        )
        .await
    else {
        panic!("child not created")
    };
    store
        .finish_job(child, JobStatus::Completed, None, &reg, t0())
        .await
        .unwrap();
    assert_eq!(action(&store, &format!("f:{a}")).await, None);
    let fenced = store.fence_batch(a, t0()).await.unwrap();
    assert_eq!(
        fenced,
        FenceOutcome::Fenced {
            finalize_enqueued: true
        }
    );
    assert_eq!(
        action(&store, &format!("f:{a}")).await.as_deref(),
        Some("pending")
    );
    let st = state(&store, a).await;
    assert!(st.fenced);
    assert_eq!((st.children_terminal, st.children_completed), (1, 1));
    assert!(store.cleanup_worklist(a).await.is_err());
    store
        .finish_job(a, JobStatus::Completed, None, &reg, t0())
        .await
        .unwrap();
    assert_eq!(store.cleanup_worklist(a).await.unwrap(), 1);

    // Fence first: the last child's terminal transaction enqueues finalize.
    let (b, _) = parent_with(&store, 2).await;
    store
        .lease_work(b, 10, running_lease(&store, "o", t0()).await, until, t0())
        .await
        .unwrap();
    let mut kids = Vec::new();
    for idx in 0..2 {
        match store
            .create_child(
                &spec(b, idx, &[]),
                running_lease(&store, "o", t0()).await,
                t0(),
            )
            .await
            .unwrap()
        {
            ChildOutcome::Created(id) => kids.push(id),
            other => panic!("{other:?}"),
        }
    }
    let fenced = store.fence_batch(b, t0()).await.unwrap();
    assert_eq!(
        fenced,
        FenceOutcome::Fenced {
            finalize_enqueued: false
        }
    );
    store
        .finish_job(kids[0], JobStatus::Failed, Some("x"), &reg, t0())
        .await
        .unwrap();
    assert_eq!(action(&store, &format!("f:{b}")).await, None);
    store
        .finish_job(kids[1], JobStatus::Skipped, None, &reg, t0())
        .await
        .unwrap();
    assert_eq!(
        action(&store, &format!("f:{b}")).await.as_deref(),
        Some("pending")
    );
    let st = state(&store, b).await;
    assert_eq!(
        (
            st.children_terminal,
            st.children_completed,
            st.children_failed,
            st.children_skipped
        ),
        (2, 0, 1, 1)
    );
    // A child finishing twice counts once.
    store
        .finish_job(kids[1], JobStatus::Completed, None, &reg, t0())
        .await
        .unwrap();
    assert_eq!(state(&store, b).await.children_terminal, 2);
    assert!(store
        .fence_batch(new_job(&store).await, t0())
        .await
        .is_err());
}

#[tokio::test]
async fn abort_discards_ready_rows_and_releases_only_their_claims() {
    let (store, _dir) = fresh().await;
    let (parent, claims) = parent_with(&store, 3).await;
    store
        .lease_work(
            parent,
            1,
            running_lease(&store, "o", t0()).await,
            t0() + Duration::minutes(5),
            t0(),
        )
        .await
        .unwrap();
    let st = store
        .abort_batch(parent, BatchAbort::ScheduleFailed, t0())
        .await
        .unwrap();
    assert_eq!(st.outcome.as_deref(), Some("batch_schedule_failed"));
    assert!(st.fenced);
    assert_eq!((st.ready, st.leased, st.discarded_rows), (0, 1, 2));
    assert_eq!(holder(&store, &claims[0]).await, Some(Some(parent)));
    assert_eq!(holder(&store, &claims[1]).await, None);
    assert_eq!(holder(&store, &claims[2]).await, None);
    let st = store
        .abort_batch(parent, BatchAbort::cancel(), t0())
        .await
        .unwrap();
    assert_eq!(st.outcome.as_deref(), Some("batch_schedule_failed"));

    let (other, _) = parent_with(&store, 1).await;
    let st = store
        .abort_batch(other, BatchAbort::cancel(), t0())
        .await
        .unwrap();
    assert_eq!(
        (st.outcome.as_deref(), st.discarded_rows),
        (Some("cancel_requested"), 1)
    );
    assert!(store
        .abort_batch(999, BatchAbort::cancel(), t0())
        .await
        .is_err());
}
