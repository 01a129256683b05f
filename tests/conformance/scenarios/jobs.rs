//! Terminal bridge and job scenarios (S-T1 … S-T4, S-B12, J1–J7).

use super::claims::{tracked, WriteThenFail};
use crate::harness::TestDb;
use dockhand::claims::ClaimStatus;
use dockhand::jobs::JobEvent;
use dockhand::Clock;
use dockhand::{HandlerError, Identity, JobStatus, Packet, Pipeline, Runtime, StepOutput};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Events = Arc<Mutex<Vec<JobEvent>>>;

fn ident(item: &str) -> Identity {
    Identity::new("shared:t", "src", item).unwrap()
}

/// A pipeline whose one step claims `args.item`, then behaves as `args.mode` says.
fn routes_pipeline() -> Pipeline {
    Pipeline::new("route")
        .step("work", |ctx| async move {
            let item = ctx.input()["item"].as_str().unwrap_or("none").to_string();
            ctx.claim_in("shared:t", "src", &item, tracked("t", 1, true))
                .await
                .map_err(HandlerError::retry)?;
            match ctx.input()["mode"].as_str() {
                Some("fatal") => Err(HandlerError::fatal("bad data")),
                Some("flaky") => Err(HandlerError::retry("still flaky")),
                Some("hold") => Ok(StepOutput::Park(vec![])),
                _ => Ok(StepOutput::one(json!({"done": item}))),
            }
        })
        .max_attempts(2)
}

async fn routes_runtime(db: &TestDb, events: &Events) -> Runtime {
    let e = events.clone();
    db.runtime()
        .pipeline(routes_pipeline())
        .completion_handler("write_then_fail", Arc::new(WriteThenFail))
        .on_job_finished(move |ev| {
            let e = e.clone();
            async move { e.lock().unwrap().push(ev) }
        })
        .build()
        .await
        .unwrap()
}

pub async fn s_t1_every_final_route_passes_the_bridge_once(db: TestDb) {
    let events: Events = Arc::default();
    let rt = routes_runtime(&db, &events).await;
    let jobs = rt.jobs();
    let start = |item: &str, mode: &str| {
        let jobs = jobs.clone();
        let (item, mode) = (item.to_string(), mode.to_string());
        async move {
            jobs.start("route", json!({"item": item, "mode": mode}))
                .await
                .unwrap()
        }
    };
    let success = start("ok", "ok").await;
    let fatal = start("fatal", "fatal").await;
    let exhausted = start("flaky", "flaky").await;
    let manual = start("manual", "hold").await;
    let stale = start("stale", "hold").await;
    let cancelled = start("cancel", "hold").await;
    rt.drain(100).await.unwrap();
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(100).await.unwrap(); // the flaky step's second (last) attempt
    jobs.manual_fail(manual, Some("operator said so"))
        .await
        .unwrap();
    jobs.finish(stale, JobStatus::Failed, Some("stale"))
        .await
        .unwrap();
    jobs.cancel(cancelled).await.unwrap();
    rt.run_maintenance_once().await.unwrap();

    let expect = [
        (success, "ok", JobStatus::Completed, None),
        (fatal, "fatal", JobStatus::Failed, Some("step_failed")),
        (
            exhausted,
            "flaky",
            JobStatus::Failed,
            Some("retry_exhausted"),
        ),
        (
            manual,
            "manual",
            JobStatus::Failed,
            Some("operator said so"),
        ),
        (stale, "stale", JobStatus::Failed, Some("stale")),
        (cancelled, "cancel", JobStatus::Cancelled, Some("manual")),
    ];
    for (job, item, status, reason) in expect {
        let j = jobs.get(job).await.unwrap();
        assert_eq!(
            (j.status, j.reason.as_deref()),
            (status, reason),
            "job for {item}"
        );
        let claim = jobs.claim_state(&ident(item)).await.unwrap();
        if status.is_success() {
            assert_eq!(
                claim.unwrap().status,
                ClaimStatus::Processed,
                "{item}: completed on success"
            );
            assert!(db.store.tracked_item("t", item).await.unwrap().is_some());
        } else {
            assert!(claim.is_none(), "{item}: released on {status}");
            assert!(db.store.tracked_item("t", item).await.unwrap().is_none());
        }
    }
    let mut per_job: HashMap<i64, usize> = HashMap::new();
    for e in events.lock().unwrap().iter() {
        *per_job.entry(e.job_id).or_default() += 1;
    }
    assert_eq!(per_job.len(), 6);
    assert!(
        per_job.values().all(|&n| n == 1),
        "hook once per job: {per_job:?}"
    );
    // Sweeping again delivers nothing new.
    rt.run_maintenance_once().await.unwrap();
    assert_eq!(events.lock().unwrap().len(), 6);
}

pub async fn s_t2_finishing_a_final_job_again(db: TestDb) {
    let events: Events = Arc::default();
    let rt = routes_runtime(&db, &events).await;
    let jobs = rt.jobs();
    let job = jobs
        .start("route", json!({"item": "a", "mode": "ok"}))
        .await
        .unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(events.lock().unwrap().len(), 1);
    let again = jobs.finish(job, JobStatus::Completed, None).await.unwrap();
    assert_eq!(
        (again.status, again.changed),
        (JobStatus::Completed, false),
        "same status: success, unchanged"
    );
    let other = jobs.manual_fail(job, None).await.unwrap();
    assert_eq!(
        (other.status, other.changed),
        (JobStatus::Completed, false),
        "another status: refused"
    );
    assert_eq!(
        jobs.get(job).await.unwrap().status,
        JobStatus::Completed,
        "the first status stands"
    );
    rt.run_maintenance_once().await.unwrap();
    assert_eq!(events.lock().unwrap().len(), 1, "hooks not re-run");
    assert!(
        jobs.finish(job, JobStatus::Processing, None).await.is_err(),
        "a non-final target is refused"
    );
}

pub async fn s_t3_crash_before_delivery_replays_once(db: TestDb) {
    let events: Events = Arc::default();
    let rt = routes_runtime(&db, &events).await;
    let job = rt
        .jobs()
        .start("route", json!({"item": "a", "mode": "hold"}))
        .await
        .unwrap();
    // The terminal transaction commits, then the process "dies" before delivering hooks.
    let registry = dockhand::claims::CompletionRegistry::with_builtins();
    dockhand::jobs::bridge::finish(
        &db.store,
        &registry,
        job,
        JobStatus::Failed,
        Some("stale"),
        db.clock.now(),
    )
    .await
    .unwrap();
    assert!(events.lock().unwrap().is_empty());
    assert_eq!(
        rt.jobs().deliver_events().await.unwrap(),
        1,
        "replay delivers once"
    );
    assert_eq!(events.lock().unwrap().len(), 1);
    assert_eq!(
        rt.jobs().deliver_events().await.unwrap(),
        0,
        "a second replay does nothing"
    );
    assert_eq!(events.lock().unwrap()[0].status, JobStatus::Failed);
}

fn two_packet_pipeline(fail_second_step: bool) -> Pipeline {
    Pipeline::new("pair")
        .step("split", |ctx| async move {
            let mut out = Vec::new();
            for item in ["left", "right"] {
                let d = ctx
                    .claim_in("shared:t", "src", item, tracked("t", 1, true))
                    .await
                    .map_err(HandlerError::retry)?
                    .ok_or_else(|| HandlerError::fatal("item held"))?;
                out.push(Packet::new(json!({"item": item})).with_claim(d));
            }
            Ok(StepOutput::Packets(out))
        })
        .inline()
        .step("join", move |ctx| async move {
            assert_eq!(ctx.inputs.len(), 2, "both packets arrive inline");
            if fail_second_step {
                Err(HandlerError::fatal("join failed"))
            } else {
                Ok(StepOutput::one(json!({"joined": ctx.inputs})))
            }
        })
}

pub async fn s_t4_inline_continuation_carries_both_claims(db: TestDb) {
    for fail in [false, true] {
        let rt = db
            .runtime()
            .pipeline(two_packet_pipeline(fail))
            .build()
            .await
            .unwrap();
        let job = rt.jobs().start("pair", json!({})).await.unwrap();
        rt.drain(10).await.unwrap();
        let j = rt.jobs().get(job).await.unwrap();
        for item in ["left", "right"] {
            let c = rt.jobs().claim_state(&ident(item)).await.unwrap();
            if fail {
                assert_eq!(j.status, JobStatus::Failed);
                assert!(c.is_none(), "{item} released on failure");
            } else {
                assert_eq!(j.status, JobStatus::Completed);
                assert_eq!(
                    c.unwrap().status,
                    ClaimStatus::Processed,
                    "{item} completed on success"
                );
            }
        }
        if !fail {
            // Make the items claimable again for the failing round.
            for item in ["left", "right"] {
                let d = rt
                    .jobs()
                    .claim(
                        ident(item),
                        None,
                        chrono::Duration::minutes(5),
                        Default::default(),
                        true,
                    )
                    .await
                    .unwrap()
                    .unwrap();
                assert!(rt.jobs().release(&d, false).await.unwrap());
            }
        }
    }
}

pub async fn s_b12_engine_data_compare_and_swap(db: TestDb) {
    let rt = db
        .runtime()
        .pipeline(Pipeline::new("hold").step("only", |_c| async { Ok(StepOutput::none()) }))
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let job = jobs.start("hold", json!({})).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let jobs = jobs.clone();
        tasks.push(tokio::spawn(async move {
            jobs.mutate(job, move |d| {
                d[format!("k{i}")] = json!(i);
            })
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let data = jobs.engine_data(job).await.unwrap();
    for i in 0..8 {
        assert_eq!(
            data[format!("k{i}")],
            json!(i),
            "every concurrent mutation landed"
        );
    }
    let (_, version) = db.store.engine_data(job).await.unwrap().unwrap();
    assert_eq!(version, 8);
    assert!(!db
        .store
        .cas_engine_data(job, version - 1, &json!({"stale": true}))
        .await
        .unwrap());
    assert_eq!(
        jobs.engine_data(job).await.unwrap(),
        data,
        "a stale version never overwrites"
    );
}

pub async fn jobs_park_resume_and_retries_keep_claims(db: TestDb) {
    let attempts = Arc::new(Mutex::new(0));
    let a = attempts.clone();
    let rt = db
        .runtime()
        .pipeline(
            Pipeline::new("wait")
                .step("ask", |ctx| async move {
                    ctx.claim_in("shared:t", "src", "w", Default::default())
                        .await
                        .map_err(HandlerError::retry)?;
                    Ok(StepOutput::Park(vec![Packet::new(json!({"question": 42}))]))
                })
                .step("answer", move |ctx| {
                    let a = a.clone();
                    async move {
                        let mut n = a.lock().unwrap();
                        *n += 1;
                        if *n == 1 {
                            return Err(HandlerError::retry("not yet"));
                        }
                        assert_eq!(ctx.input()["question"], json!(42));
                        Ok(StepOutput::one(json!({})))
                    }
                }),
        )
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let job = jobs.start("wait", json!({})).await.unwrap();
    assert_eq!(jobs.get(job).await.unwrap().status, JobStatus::Pending);
    rt.drain(10).await.unwrap();
    let j = jobs.get(job).await.unwrap();
    assert_eq!((j.status, j.step_index), (JobStatus::Waiting, 1));
    assert!(jobs.resume(job).await.unwrap());
    assert!(
        !jobs.resume(job).await.unwrap(),
        "only a waiting job resumes"
    );
    rt.drain(10).await.unwrap();
    assert_eq!(
        jobs.get(job).await.unwrap().status,
        JobStatus::Processing,
        "retrying"
    );
    let held = jobs.claim_state(&ident("w")).await.unwrap().unwrap();
    assert_eq!(
        (held.status, held.job_id),
        (ClaimStatus::Claimed, Some(job)),
        "retries keep the claim"
    );
    db.clock.advance(chrono::Duration::seconds(10));
    rt.drain(10).await.unwrap();
    assert_eq!(jobs.get(job).await.unwrap().status, JobStatus::Completed);
    assert_eq!(
        jobs.claim_state(&ident("w")).await.unwrap().unwrap().status,
        ClaimStatus::Processed
    );
    // Bad input: unknown pipeline, invalid pipeline definitions.
    assert!(jobs
        .start("nope", json!({}))
        .await
        .unwrap_err()
        .to_string()
        .contains("nope"));
    let bad = db.runtime().pipeline(Pipeline::new("empty")).build().await;
    assert!(bad.unwrap_err().to_string().contains("no steps"));
}

/// R1: a step whose worker died on its last attempt is failed by the lease reaper, and its job
/// follows through the bridge (`failed / retry_exhausted`, hook delivered once) without waiting
/// for `recover-stuck`.
pub async fn r1_reaped_step_finishes_its_job_through_the_bridge(db: TestDb) {
    use dockhand::store::ClaimRequest;
    let events: Events = Arc::default();
    let rt = routes_runtime(&db, &events).await;
    let jobs = rt.jobs();
    let job = jobs
        .start("route", json!({"item": "dead", "mode": "ok"}))
        .await
        .unwrap();
    // A worker claims the step twice (the pipeline allows 2 attempts) and dies each time.
    for attempt in 1..=2 {
        let now = db.clock.now();
        let claimed = db
            .store
            .claim(&ClaimRequest {
                owner: "dead-worker",
                limit: 10,
                now,
                lease_until: now + chrono::Duration::seconds(30),
                hooks: None,
                routing: None,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "attempt {attempt}: the step action");
        assert_eq!(claimed[0].attempt, attempt);
        db.clock.advance(chrono::Duration::seconds(31));
        rt.run_maintenance_once().await.unwrap();
    }
    // The reaper failed the step action and, in the same transaction, enqueued the job's
    // finish action; running it finishes the job through the bridge.
    rt.run_due_once().await.unwrap();
    let j = jobs.get(job).await.unwrap();
    assert_eq!(
        (j.status, j.reason.as_deref()),
        (JobStatus::Failed, Some("retry_exhausted"))
    );
    rt.run_maintenance_once().await.unwrap();
    let delivered: Vec<i64> = events.lock().unwrap().iter().map(|e| e.job_id).collect();
    assert_eq!(delivered, vec![job], "the lifecycle hook ran once");
    assert!(jobs.check().await.unwrap().is_empty(), "audit clean");
}
