//! Grouped step starts and bridge finishes (issue 16 item 3, W4): `Store::start_steps` and
//! `Store::finish_jobs` put several jobs' transitions in one transaction; a batch parent's
//! counters take the summed deltas once, its finalize action is enqueued once, a job already
//! final stays so, a lost step lease leaves its job alone, and a claim completion failure
//! rolls the group back for the bridge's single path to finish each job alone.

use super::batches::{actions, assert_clean, batch_pipeline, children, ok_child, runtime};
use super::claims::{claims_runtime, failing, tracked, WriteThenFail};
use super::listeners::run_batch;
use crate::harness::TestDb;
use dockhand::batch::{BatchAbort, CHUNK_HOOK, FINALIZE_HOOK};
use dockhand::claims::CompletionRegistry;
use dockhand::jobs::bridge::{finish_runs, RunFinished};
use dockhand::jobs::{BridgeOutcome, FinishRequest, GroupFinished, StepStart, STEP_HOOK};
use dockhand::store::Lease;
use dockhand::{ActionStatus, Clock, Identity, JobStatus};
use serde_json::json;
use std::sync::Arc;

fn registry() -> CompletionRegistry {
    let mut reg = CompletionRegistry::with_builtins();
    reg.insert("write_then_fail", Arc::new(WriteThenFail));
    reg
}

fn req(job_id: i64, status: JobStatus) -> FinishRequest {
    FinishRequest {
        job_id,
        status,
        reason: None,
        lease: None,
        complete_run: false,
        superseded: None,
        event_delivered: false,
    }
}

/// `reqs` through `Store::finish_jobs` with the test registry, at the test clock's now.
async fn finish_group(db: &TestDb, reqs: &[FinishRequest]) -> GroupFinished {
    db.store
        .finish_jobs(reqs, &registry(), db.clock.now())
        .await
        .unwrap()
}

/// A fenced batch parent (4 items, one chunk) whose 4 children are created and pending.
async fn fenced_batch(db: &TestDb) -> (dockhand::Runtime, i64, Vec<i64>) {
    let rt = runtime(db, db.store.clone(), batch_pipeline(4, 10, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    while !actions(&rt, CHUNK_HOOK)
        .await
        .iter()
        .all(|a| a.status.is_final())
    {
        rt.run_due_once().await.unwrap(); // the chunk
    }
    let mut kids: Vec<i64> = children(&rt, parent).await.iter().map(|j| j.id).collect();
    kids.sort_unstable();
    assert_eq!(kids.len(), 4);
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert!(st.fenced, "one chunk made every child: the batch is fenced");
    assert_eq!(st.children_terminal, 0);
    (rt, parent, kids)
}

/// Several children of one parent finished in one group: the parent's counters are right and
/// its finalize action is enqueued exactly once; the batch then ends clean.
pub async fn grouped_finish_counts_children_and_enqueues_finalize_once(db: TestDb) {
    let (rt, parent, kids) = fenced_batch(&db).await;
    let reqs = [
        req(kids[2], JobStatus::Skipped),
        req(kids[0], JobStatus::Completed),
        req(kids[3], JobStatus::Failed),
        req(kids[1], JobStatus::Completed),
    ];
    let got = finish_group(&db, &reqs).await;
    assert_eq!(
        got,
        GroupFinished::Committed(vec![BridgeOutcome::Finished; 4])
    );
    for r in &reqs {
        assert_eq!(rt.jobs().get(r.job_id).await.unwrap().status, r.status);
    }
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(
        (
            st.children_terminal,
            st.children_completed,
            st.children_failed,
            st.children_skipped
        ),
        (4, 2, 1, 1)
    );
    assert_eq!(
        actions(&rt, FINALIZE_HOOK).await.len(),
        1,
        "the finalize action is enqueued once"
    );
    rt.drain(100).await.unwrap();
    assert!(rt.jobs().get(parent).await.unwrap().status.is_final());
    assert_clean(&rt).await;
}

/// A job already final in the group stays as it is (`AlreadyFinal`, not counted again) while
/// the others finish.
pub async fn grouped_finish_leaves_a_final_job_and_finishes_the_others(db: TestDb) {
    let (rt, parent, kids) = fenced_batch(&db).await;
    let reg = registry();
    let first = db
        .store
        .finish_job(kids[0], JobStatus::Completed, None, &reg, db.clock.now())
        .await
        .unwrap();
    assert_eq!(first, BridgeOutcome::Finished);
    let reqs = [
        req(kids[1], JobStatus::Completed),
        req(kids[0], JobStatus::Failed),
        req(kids[2], JobStatus::Completed),
    ];
    let got = db
        .store
        .finish_jobs(&reqs, &reg, db.clock.now())
        .await
        .unwrap();
    assert_eq!(
        got,
        GroupFinished::Committed(vec![
            BridgeOutcome::Finished,
            BridgeOutcome::AlreadyFinal {
                status: JobStatus::Completed,
                reason: None
            },
            BridgeOutcome::Finished,
        ])
    );
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!((st.children_terminal, st.children_completed), (3, 3));
    assert!(
        actions(&rt, FINALIZE_HOOK).await.is_empty(),
        "one child left"
    );
    assert_eq!(
        rt.jobs().get(kids[0]).await.unwrap().status,
        JobStatus::Completed
    );
}

/// One job's claim completion fails: the group writes nothing and says which job; the bridge's
/// grouped finish then finishes each alone: only that job ends
/// `failed / item_claim_completion_failed`, another `completed`, and one whose step lease was
/// lost stays unfinished (the fallback keeps the guard).
pub async fn grouped_finish_claim_failure_falls_back_to_single_finishes(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let mut jobs = Vec::new();
    for (n, bad) in [("a", false), ("b", true), ("c", false)] {
        let job = rt.jobs().start("hold", json!({})).await.unwrap();
        let cfg = if bad {
            failing("g")
        } else {
            tracked("g", 1, true)
        };
        let got = rt
            .jobs()
            .claim(
                Identity::new("shared:g", "rss", n).unwrap(),
                Some(job),
                chrono::Duration::minutes(5),
                cfg,
                false,
            )
            .await
            .unwrap();
        assert!(got.is_some());
        jobs.push(job);
    }
    // The first job's step run lost its lease (another token than the running action's).
    let lease =
        super::batch_regressions::claim_as_worker(&db, STEP_HOOK, chrono::Duration::seconds(30))
            .await;
    let stale = Lease {
        id: lease.id,
        token: lease.token + 1,
    };
    let mut reqs: Vec<FinishRequest> = jobs.iter().map(|j| req(*j, JobStatus::Completed)).collect();
    reqs[0].lease = Some(stale);
    let reg = registry();
    let got = db
        .store
        .finish_jobs(&reqs, &reg, db.clock.now())
        .await
        .unwrap();
    match got {
        GroupFinished::RolledBack { job_id, error } => {
            assert_eq!(job_id, jobs[1]);
            assert!(error.contains("refused"), "{error}");
        }
        other => panic!("expected a rolled back group, got {other:?}"),
    }
    for j in &jobs {
        assert_eq!(
            rt.jobs().get(*j).await.unwrap().status,
            JobStatus::Pending,
            "nothing written"
        );
    }
    let out = finish_runs(&db.store, &reg, &reqs, db.clock.now()).await;
    let out: Vec<RunFinished> = out.into_iter().map(|r| r.unwrap()).collect();
    let downgraded = Some("item_claim_completion_failed".to_string());
    let done = |status, reason| RunFinished::Done {
        finished: dockhand::jobs::bridge::Finished {
            status,
            reason,
            changed: true,
        },
        run_completed: false,
    };
    assert_eq!(
        out,
        vec![
            RunFinished::LeaseLost {
                action_id: stale.id,
                token: stale.token
            },
            done(JobStatus::Failed, downgraded.clone()),
            done(JobStatus::Completed, None),
        ],
        "the fallback keeps the lease guard"
    );
    for (j, want) in jobs.iter().zip([
        (JobStatus::Pending, None),
        (JobStatus::Failed, downgraded),
        (JobStatus::Completed, None),
    ]) {
        let got = rt.jobs().get(*j).await.unwrap();
        assert_eq!((got.status, got.reason), want);
    }
    let b = Identity::new("shared:g", "rss", "b").unwrap();
    assert!(
        rt.jobs().claim_state(&b).await.unwrap().is_none(),
        "the failed job's claim is released"
    );
}

/// A request whose step lease is lost (another token) is not finished and says so; the rest
/// of the group finishes.
pub async fn grouped_finish_with_a_lost_lease_leaves_that_job(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let a = rt.jobs().start("hold", json!({})).await.unwrap();
    let b = rt.jobs().start("hold", json!({})).await.unwrap();
    let lease =
        super::batch_regressions::claim_as_worker(&db, STEP_HOOK, chrono::Duration::seconds(30))
            .await;
    let stale = Lease {
        id: lease.id,
        token: lease.token + 1,
    };
    let reqs = [
        FinishRequest {
            lease: Some(lease),
            ..req(a, JobStatus::Completed)
        },
        FinishRequest {
            lease: Some(stale),
            ..req(b, JobStatus::Completed)
        },
    ];
    let got = finish_group(&db, &reqs).await;
    assert_eq!(
        got,
        GroupFinished::Committed(vec![
            BridgeOutcome::Finished,
            BridgeOutcome::LeaseLost {
                action_id: stale.id,
                token: stale.token
            },
        ])
    );
    assert_eq!(rt.jobs().get(a).await.unwrap().status, JobStatus::Completed);
    assert_eq!(rt.jobs().get(b).await.unwrap().status, JobStatus::Pending);
}

/// `start_steps` decides as `start_step` does, for a mix: a pending child (started), a
/// wrong step (stale), a missing job (stale), a fanned-out parent, and children whose parent
/// an operator stopped.
pub async fn grouped_start_steps_decide_as_start_step(db: TestDb) {
    let (_rt, parent, kids) = fenced_batch(&db).await;
    let reqs = vec![
        (kids[1], 1),
        (kids[0], 0),
        (parent, 0),
        (999_999_999, 0),
        (kids[2], 1),
    ];
    let now = db.clock.now();
    let grouped = db.store.start_steps(&reqs, now).await.unwrap();
    let kind = |s: &StepStart| match s {
        StepStart::Run(j) => ("run", Some((j.id, j.status))),
        StepStart::FannedOut(j) => ("fanned_out", Some((j.id, j.status))),
        StepStart::ParentStopped(j) => ("parent_stopped", Some((j.id, j.status))),
        StepStart::Stale => ("stale", None),
    };
    let want = vec![
        ("run", Some((kids[1], JobStatus::Processing))),
        ("stale", None),
        ("fanned_out", Some((parent, JobStatus::Processing))),
        ("stale", None),
        ("run", Some((kids[2], JobStatus::Processing))),
    ];
    assert_eq!(grouped.iter().map(kind).collect::<Vec<_>>(), want);
    // The single path, now (the started ones are processing at their step): the same.
    let mut single = Vec::new();
    for (job, step) in &reqs {
        single.push(db.store.start_step(*job, *step, now).await.unwrap());
    }
    assert_eq!(single.iter().map(kind).collect::<Vec<_>>(), want);
    // The operator's stop marks the batch (the first step of a cancel): a pending child is
    // not started, in a group as alone.
    db.store
        .abort_batch(parent, BatchAbort::cancel(), now)
        .await
        .unwrap();
    let after = db
        .store
        .start_steps(&[(kids[3], 1), (kids[0], 1)], now)
        .await
        .unwrap();
    let one = db.store.start_step(kids[3], 1, now).await.unwrap();
    assert_eq!(kind(&after[0]), kind(&one));
    assert_eq!(
        kind(&after[1]),
        ("parent_stopped", Some((kids[0], JobStatus::Pending)))
    );
    assert!(
        matches!(one, StepStart::ParentStopped(ref j) if j.status == JobStatus::Pending),
        "{one:?}"
    );
}

/// A request with `complete_run` completes its step action under the lease in the group's
/// transaction (the run's acknowledgement, issue 16 W4); a request whose lease is lost
/// completes nothing and leaves its job. Run by the runtime, a step that finishes its job
/// leaves its action complete with no second acknowledgement (no `lease_lost` entry).
pub async fn grouped_finish_completes_the_step_run_in_its_transaction(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let a = rt.jobs().start("hold", json!({})).await.unwrap();
    let b = rt.jobs().start("hold", json!({})).await.unwrap();
    let held = chrono::Duration::seconds(30);
    let first = super::batch_regressions::claim_as_worker(&db, STEP_HOOK, held).await;
    let second = super::batch_regressions::claim_as_worker(&db, STEP_HOOK, held).await;
    let job_of = |lease: Lease| {
        let q = rt.queue().clone();
        async move { q.get(lease.id).await.unwrap().args["job"].as_i64().unwrap() }
    };
    let (job_first, job_second) = (job_of(first).await, job_of(second).await);
    assert_eq!(
        {
            let mut v = vec![job_first, job_second];
            v.sort_unstable();
            v
        },
        {
            let mut v = vec![a, b];
            v.sort_unstable();
            v
        }
    );
    db.store
        .start_step(job_first, 0, db.clock.now())
        .await
        .unwrap();
    db.store
        .start_step(job_second, 0, db.clock.now())
        .await
        .unwrap();
    let stale = Lease {
        id: second.id,
        token: second.token + 1,
    };
    let reqs = [
        FinishRequest {
            lease: Some(first),
            complete_run: true,
            ..req(job_first, JobStatus::Completed)
        },
        FinishRequest {
            lease: Some(stale),
            complete_run: true,
            ..req(job_second, JobStatus::Completed)
        },
    ];
    let out = finish_runs(&db.store, &registry(), &reqs, db.clock.now()).await;
    let out: Vec<RunFinished> = out.into_iter().map(|r| r.unwrap()).collect();
    assert!(
        matches!(out[0], RunFinished::Done { run_completed: true, ref finished } if finished.changed),
        "{out:?}"
    );
    assert_eq!(
        out[1],
        RunFinished::LeaseLost {
            action_id: stale.id,
            token: stale.token
        }
    );
    let q = rt.queue();
    assert_eq!(
        q.get(first.id).await.unwrap().status,
        ActionStatus::Complete
    );
    assert_eq!(
        q.get(second.id).await.unwrap().status,
        ActionStatus::Running,
        "a lost lease completes nothing"
    );
    assert_eq!(
        rt.jobs().get(job_first).await.unwrap().status,
        JobStatus::Completed
    );
    assert_eq!(
        rt.jobs().get(job_second).await.unwrap().status,
        JobStatus::Processing
    );
    // Through the runtime: the step finishes its job and completes its own action; the
    // runner writes nothing after it.
    let c = rt.jobs().start("hold", json!({})).await.unwrap();
    assert_eq!(rt.run_due_once().await.unwrap(), 1);
    assert_eq!(
        rt.jobs().get(c).await.unwrap().status,
        JobStatus::CompletedNoItems,
        "`hold`'s one step outputs nothing"
    );
    let step = actions(&rt, STEP_HOOK)
        .await
        .into_iter()
        .find(|x| x.args["job"].as_i64() == Some(c))
        .expect("the new job's step action");
    assert_eq!(step.status, ActionStatus::Complete);
    let events: Vec<String> = q
        .logs(step.id)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.event)
        .collect();
    assert!(
        !events.iter().any(|e| e == "lease_lost"),
        "no second acknowledgement: {events:?}"
    );
    assert_eq!(
        events.iter().filter(|e| *e == "completed").count(),
        1,
        "{events:?}"
    );
}

/// A group finish writes a request's lifecycle event delivered when the request asks
/// (`FinishRequest::event_delivered`: a runtime with no hook to run) and undelivered
/// otherwise; both events are there.
pub async fn grouped_finish_writes_an_event_delivered_when_asked(db: TestDb) {
    let (_rt, _parent, kids) = fenced_batch(&db).await;
    let reqs = [
        FinishRequest {
            event_delivered: true,
            ..req(kids[0], JobStatus::Completed)
        },
        req(kids[1], JobStatus::Failed),
    ];
    let got = finish_group(&db, &reqs).await;
    assert_eq!(
        got,
        GroupFinished::Committed(vec![BridgeOutcome::Finished; 2])
    );
    let undelivered: Vec<i64> = db
        .store
        .undelivered_events(100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.job_id)
        .collect();
    assert!(!undelivered.contains(&kids[0]), "{undelivered:?}");
    assert!(undelivered.contains(&kids[1]), "{undelivered:?}");
    let (a, b) = (kids[0], kids[1]);
    let counts = db
        .count_all(&[
            &format!(
                "SELECT COUNT(*) FROM dockhand_job_events WHERE job_id = {a}
                 AND status = 'completed' AND delivered_at IS NOT NULL"
            ),
            &format!(
                "SELECT COUNT(*) FROM dockhand_job_events WHERE job_id = {b}
                 AND status = 'failed' AND delivered_at IS NULL"
            ),
        ])
        .await;
    assert_eq!(counts, vec![1, 1], "both events are recorded");
}

/// A runtime that registers no lifecycle hook writes its step runs' events delivered in
/// their finishing transaction: nothing is left for the outbox sweep (maintenance never runs
/// here), whether the children run on runners or in their chunk.
pub async fn runtime_without_hooks_leaves_no_event_to_sweep(db: TestDb) {
    for in_chunk in [false, true] {
        let mut p = batch_pipeline(4, 10, ok_child);
        if in_chunk {
            p = p.children_in_chunk(4);
        }
        let rt = runtime(&db, db.store.clone(), p).await;
        let parent = run_batch(&db, &rt).await;
        let counts = db
            .count_all(&[
                &format!(
                    "SELECT COUNT(*) FROM dockhand_job_events e JOIN dockhand_jobs j
                     ON j.id = e.job_id WHERE j.parent_id = {parent}"
                ),
                &format!(
                    "SELECT COUNT(*) FROM dockhand_job_events e JOIN dockhand_jobs j
                     ON j.id = e.job_id WHERE j.parent_id = {parent}
                     AND e.delivered_at IS NULL"
                ),
            ])
            .await;
        assert_eq!(counts, vec![4, 0], "in chunk: {in_chunk}");
    }
}
