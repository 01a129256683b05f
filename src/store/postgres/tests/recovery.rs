//! Recovery: what drives each stale job (liveness), and the invariant audit finding planted
//! violations (and nothing on a healthy database).

use super::{
    active_keys, child, claimed, cleanup, complete_actions, fresh, new_job, parent_with_items, req,
    t0, PgStore,
};
use crate::batch::{ChildOutcome, JobLiveness, RowSettle};
use crate::claims::CompletionRegistry;
use crate::state::JobStatus;
use crate::store::test_lease::running_lease;
use crate::store::{ClaimRequest, Store};
use crate::ActionSpec;
use chrono::Duration;
use serde_json::json;

/// Sets a job's status behind the bridge's back.
async fn force_status(s: &PgStore, job: i64, status: &str) {
    sqlx::query("UPDATE dockhand_jobs SET status = $2 WHERE id = $1")
        .bind(job)
        .bind(status)
        .execute(s.pool())
        .await
        .unwrap();
}

fn by_id(all: &[JobLiveness], id: i64) -> &JobLiveness {
    all.iter().find(|l| l.job_id == id).expect("job listed")
}

#[tokio::test]
async fn job_liveness_reports_what_drives_each_job() {
    let Some((s, url, schema)) = fresh("job_liveness").await else {
        return;
    };
    let now = t0();
    let reg = CompletionRegistry::with_builtins();
    // Plain: its first step action is pending.
    let plain = new_job(&s).await;
    // Failed step: the step action of its current step ended failed, nothing else drives it.
    let failed = new_job(&s).await;
    s.start_step(failed, 0, now).await.unwrap();
    sqlx::query("UPDATE dockhand_actions SET status = 'failed' WHERE unique_key = $1")
        .bind(format!("j:{failed}:0"))
        .execute(s.pool())
        .await
        .unwrap();
    // A batch parent driven by a chunk action only.
    let (chunked, items) = parent_with_items(&s, 1).await;
    s.start_step(chunked, 0, now).await.unwrap();
    s.fan_out(chunked, None, &items, (10, 1), "c", now)
        .await
        .unwrap();
    complete_actions(&s, &format!("j:{chunked}:")).await;
    s.schedule_chunk(chunked, 0, 0, now).await.unwrap();
    // A fenced parent waiting on one active child.
    let (waiting, items) = parent_with_items(&s, 1).await;
    s.fan_out(waiting, None, &items, (10, 1), "c", now)
        .await
        .unwrap();
    complete_actions(&s, &format!("j:{waiting}:")).await;
    s.lease_work(
        waiting,
        10,
        running_lease(&s, "w", now).await,
        now + Duration::minutes(5),
        now,
    )
    .await
    .unwrap();
    let ChildOutcome::Created(kid) = s
        .create_child(
            &child(waiting, 0, vec![]),
            running_lease(&s, "w", now).await,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("expected a new child");
    };
    s.fence_batch(waiting, now).await.unwrap();
    // Final jobs are not listed.
    let done = new_job(&s).await;
    s.finish_job(done, JobStatus::Completed, None, &reg, now)
        .await
        .unwrap();

    let later = now + Duration::seconds(1);
    assert!(
        s.job_liveness(now, 100).await.unwrap().is_empty(),
        "strictly older"
    );
    let all = s.job_liveness(later, 100).await.unwrap();
    let ids: Vec<i64> = all.iter().map(|l| l.job_id).collect();
    assert_eq!(ids, [plain, failed, chunked, waiting, kid]);
    let p = by_id(&all, plain);
    assert_eq!(
        (p.pipeline.as_str(), p.status, p.step_index),
        ("feed", JobStatus::Pending, 0)
    );
    assert_eq!(p.updated_at, crate::clock::to_millis(now));
    assert!(p.has_action && !p.is_batch_parent && !p.step_failed && !p.stranded());
    let f = by_id(&all, failed);
    assert_eq!(f.status, JobStatus::Processing);
    assert!(!f.has_action && f.step_failed && f.stranded());
    let c = by_id(&all, chunked);
    assert!(c.has_action && c.is_batch_parent && !c.fenced && c.active_children == 0);
    let w = by_id(&all, waiting);
    assert!(!w.has_action && w.is_batch_parent && w.fenced);
    assert_eq!(w.active_children, 1);
    assert!(!w.stranded());
    assert!(by_id(&all, kid).has_action, "the child's step action");
    let page = s.job_liveness(later, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        [plain, failed]
    );
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn audit_finds_planted_violations() {
    let Some((s, url, schema)) = fresh("audit").await else {
        return;
    };
    let now = t0();
    let grace = Duration::minutes(1);
    let reg = CompletionRegistry::with_builtins();
    // A healthy database: a job, a finished batch with one child, a live claim.
    let healthy = new_job(&s).await;
    claimed(
        s.claim_item(&req("ok", Some(healthy), Default::default()), now)
            .await
            .unwrap(),
    );
    let (batch, items) = parent_with_items(&s, 1).await;
    s.fan_out(batch, None, &items, (10, 1), "c", now)
        .await
        .unwrap();
    s.lease_work(
        batch,
        10,
        running_lease(&s, "w", now).await,
        now + Duration::minutes(5),
        now,
    )
    .await
    .unwrap();
    let token = items[0].sidecar[0].token.clone();
    let ChildOutcome::Created(kid) = s
        .create_child(
            &child(batch, 0, vec![token]),
            running_lease(&s, "w", now).await,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("expected a new child");
    };
    s.finish_job(kid, JobStatus::Completed, None, &reg, now)
        .await
        .unwrap();
    assert!(s.audit(now, grace).await.unwrap().is_empty());

    // (1) A claim held by a final job, with a long item id (shown cut to 60 characters).
    let long = "x".repeat(100);
    let holder = new_job(&s).await;
    claimed(
        s.claim_item(&req(&long, Some(holder), Default::default()), now)
            .await
            .unwrap(),
    );
    force_status(&s, holder, "completed").await;
    // (2) A processing job whose step action completed without moving it on.
    let stuck = new_job(&s).await;
    s.start_step(stuck, 0, now).await.unwrap();
    complete_actions(&s, &format!("j:{stuck}:")).await;
    // (3) A fenced parent, no child, whose finalize action was cancelled.
    let (fenced, items) = parent_with_items(&s, 1).await;
    s.fan_out(fenced, None, &items, (10, 1), "c", now)
        .await
        .unwrap();
    complete_actions(&s, &format!("j:{fenced}:")).await;
    let discard = RowSettle::Discard { reason: "x".into() };
    s.settle_work(fenced, 0, running_lease(&s, "w", now).await, &discard, now)
        .await
        .unwrap();
    s.fence_batch(fenced, now).await.unwrap();
    let fin: i64 = sqlx::query_scalar("SELECT id FROM dockhand_actions WHERE unique_key = $1")
        .bind(format!("f:{fenced}"))
        .fetch_one(s.pool())
        .await
        .unwrap();
    // Behind the store (it refuses an operator's cancel of a finalize action since session
    // 25), as a database from before can hold it.
    let done = sqlx::query(
        "UPDATE dockhand_actions SET status = 'canceled', finished_at = $1 WHERE id = $2",
    )
    .bind(now)
    .bind(fin)
    .execute(s.pool())
    .await
    .unwrap();
    assert_eq!(done.rows_affected(), 1);
    // (4) A running action whose lease expired (found only once the grace has passed).
    let lone = ActionSpec::new("lone", json!({})).prepare(now).unwrap();
    let lone = s.enqueue(&lone, now).await.unwrap().id;
    let hooks = ["lone".to_string()];
    let until = now + Duration::seconds(30);
    let r = ClaimRequest {
        owner: "w1",
        limit: 1,
        now,
        lease_until: until,
        hooks: Some(&hooks[..]),
        routing: None,
    };
    assert_eq!(s.claim(&r).await.unwrap().len(), 1);
    // (5) Counters that do not match the child rows.
    sqlx::query("UPDATE dockhand_jobs SET children_completed = 5 WHERE id = $1")
        .bind(batch)
        .execute(s.pool())
        .await
        .unwrap();

    let within = s.audit(until + Duration::seconds(30), grace).await.unwrap();
    assert!(within
        .iter()
        .all(|v| v.invariant != "running_without_live_lease"));
    let found = s.audit(until + Duration::minutes(2), grace).await.unwrap();
    let got: Vec<(&str, String)> = found
        .iter()
        .map(|v| (v.invariant, v.subject.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (
                "claim_held_by_final_job",
                format!("claim step-a/rss/{}", "x".repeat(60))
            ),
            ("processing_job_without_path", format!("job {stuck}")),
            ("fenced_parent_not_final", format!("job {fenced}")),
            ("running_without_live_lease", format!("action {lone}")),
            ("parent_counters_mismatch", format!("job {batch}")),
        ],
        "{found:#?}"
    );
    assert!(
        found[0].detail.contains(&format!("job {holder}")),
        "{}",
        found[0].detail
    );
    let counters = &found[4].detail;
    assert!(
        counters.contains("children_completed = 5 but 1 child rows"),
        "{counters}"
    );
    assert!(!counters.contains("children_total"), "{counters}");
    assert!(active_keys(&s).await.contains(&format!("j:{healthy}:0")));
    cleanup(s, &url, &schema).await;
}
