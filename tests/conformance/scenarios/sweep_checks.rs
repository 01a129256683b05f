//! The invariant checks of the fault-point sweep (RELIABILITY.md §3), run against the database
//! after a sweep point was healed and drained, and the reads they and the driver share.

use super::sweep_workload::{items, NS, PLAIN, PLAIN_HOOK, SCOPE};
use crate::harness::TestDb;
use dockhand::claims::{ClaimFilter, ClaimStatus};
use dockhand::jobs::JobFilter;
use dockhand::{ActionFilter, ActionQuery, ActionStatus, Clock, JobStatus};

pub async fn all_jobs(db: &TestDb) -> Vec<dockhand::jobs::Job> {
    db.store
        .list_jobs(&JobFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

pub async fn actions(
    db: &TestDb,
    hook: Option<&str>,
    statuses: Vec<ActionStatus>,
) -> Vec<dockhand::action::Action> {
    db.store
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: hook.map(String::from),
                ..Default::default()
            },
            statuses,
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Every job final and no action pending or running.
pub async fn settled(db: &TestDb) -> bool {
    all_jobs(db).await.iter().all(|j| j.status.is_final())
        && actions(db, None, vec![ActionStatus::Pending, ActionStatus::Running])
            .await
            .is_empty()
}

/// The invariants (RELIABILITY.md §3) after the drain; one line per broken one.
pub async fn invariants(db: &TestDb) -> Vec<String> {
    let mut v = Vec::new();
    // `dockhand check` (DESIGN §11).
    let now = db.clock.now();
    for x in db
        .store
        .audit(now, chrono::Duration::minutes(1))
        .await
        .unwrap()
    {
        v.push(format!(
            "check: {} {}: {}",
            x.invariant, x.subject, x.detail
        ));
    }
    // I5/I7: every job final; nothing pending or running.
    let jobs = all_jobs(db).await;
    for j in jobs.iter().filter(|j| !j.status.is_final()) {
        v.push(format!(
            "job {} not final: {} at step {}",
            j.id, j.status, j.step_index
        ));
    }
    for a in actions(db, None, vec![ActionStatus::Pending, ActionStatus::Running]).await {
        v.push(format!("action {} `{}` left {}", a.id, a.hook, a.status));
    }
    // I4: no claim still held after the drain (every owner is final).
    let held = db
        .store
        .list_claims(&ClaimFilter {
            status: Some(ClaimStatus::Claimed),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    for c in held {
        v.push(format!(
            "claim {} still held by job {:?}",
            c.identity.item_id, c.job_id
        ));
    }
    // I6: parent counters equal children by status; worklist rows add up.
    for p in &jobs {
        let Some(st) = db.store.batch_state(p.id).await.unwrap() else {
            continue;
        };
        let kids: Vec<_> = jobs.iter().filter(|k| k.parent_id == Some(p.id)).collect();
        let count =
            |f: &dyn Fn(JobStatus) -> bool| kids.iter().filter(|k| f(k.status)).count() as i64;
        let want = (
            kids.len() as i64,
            count(&|s| s.is_final()),
            count(&|s| s == JobStatus::Completed),
            count(&|s| matches!(s, JobStatus::Failed | JobStatus::Cancelled)),
            count(&|s| matches!(s, JobStatus::Skipped | JobStatus::CompletedNoItems)),
        );
        let got = (
            st.children_total,
            st.children_terminal,
            st.children_completed,
            st.children_failed,
            st.children_skipped,
        );
        if got != want {
            v.push(format!(
                "parent {} counters {got:?} != children {want:?}",
                p.id
            ));
        }
        let rows = st.ready + st.leased + st.completed_rows + st.discarded_rows;
        if st.ready + st.leased > 0 || (rows != 0 && rows != st.items_total) {
            v.push(format!("parent {} worklist does not add up: {st:?}", p.id));
        }
    }
    // I2: each item's side effect at most once, and exactly when its claim is processed.
    let items = items();
    let queries: Vec<String> = items
        .iter()
        .map(|i| format!("SELECT COUNT(*) FROM sweep_ledger WHERE item_id = '{i}'"))
        .collect();
    let queries: Vec<&str> = queries.iter().map(String::as_str).collect();
    let ledger = db.count_all(&queries).await;
    for (item, rows) in items.iter().zip(ledger) {
        if rows > 1 {
            v.push(format!("ledger: {item} written {rows} times"));
        }
        let identity = dockhand::Identity::new(SCOPE, "src", item.as_str()).unwrap();
        let processed = db
            .store
            .get_claim(&identity)
            .await
            .unwrap()
            .is_some_and(|c| c.status == ClaimStatus::Processed);
        let tracked = db.store.tracked_item(NS, item).await.unwrap().is_some();
        if (rows == 1) != processed || tracked != processed {
            v.push(format!(
                "{item}: {rows} ledger row(s), tracked {tracked}, claim processed {processed}"
            ));
        }
    }
    // I1: each plain action exactly once, complete.
    let plain = actions(db, Some(PLAIN_HOOK), Vec::new()).await;
    for key in PLAIN {
        let mine: Vec<_> = plain.iter().filter(|a| a.args["key"] == key).collect();
        if mine.len() != 1 || mine[0].status != ActionStatus::Complete {
            let st: Vec<_> = mine.iter().map(|a| a.status.to_string()).collect();
            v.push(format!("plain action {key}: {st:?}, want one complete"));
        }
    }
    v
}
