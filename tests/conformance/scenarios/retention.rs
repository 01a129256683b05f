//! Idempotent job starts and job/packet retention (issue 15 "also missing"; Q11, B8).

use super::batches::{batch_pipeline, children};
use super::claims::tracked;
use crate::harness::TestDb;
use chrono::Duration;
use dockhand::claims::ClaimStatus;
use dockhand::jobs::packets;
use dockhand::maintenance::MaintenanceReport;
use dockhand::store::faulty::{FaultMode, FaultyStore};
use dockhand::store::PruneCutoffs;
use dockhand::{
    Clock, DynStore, Error, HandlerError, Identity, JobStatus, Pipeline, Runtime, StartOptions,
    StepOutput,
};
use serde_json::{json, Value};

/// `one` claims the item its input names (when it names one) and completes; `boom` fails for
/// good.
fn pipelines(db: &TestDb) -> dockhand::RuntimeBuilder {
    pipelines_on(db, db.store.clone())
}

fn pipelines_on(db: &TestDb, store: DynStore) -> dockhand::RuntimeBuilder {
    db.runtime_on(store)
        .pipeline(Pipeline::new("one").step("only", |ctx| async move {
            if let Some(item) = ctx.input()["item"].as_str() {
                ctx.claim_in("shared:r", "src", item, tracked("r", 1, true))
                    .await
                    .map_err(HandlerError::retry)?
                    .ok_or_else(|| HandlerError::fatal("item held"))?;
            }
            Ok(StepOutput::one(json!({"done": true})))
        }))
        .pipeline(
            Pipeline::new("boom")
                .step("only", |_| async { Err(HandlerError::fatal("boom")) })
                .max_attempts(1),
        )
}

async fn job_count(rt: &Runtime) -> usize {
    rt.jobs()
        .list(&dockhand::jobs::JobFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .len()
}

async fn stored(rt: &Runtime, id: i64) -> bool {
    match rt.jobs().get(id).await {
        Ok(_) => true,
        Err(Error::NotFound { .. }) => false,
        Err(e) => panic!("reading job {id}: {e}"),
    }
}

async fn packet_stored(db: &TestDb, input: &Value) -> bool {
    let p = packets::encode(input).unwrap();
    db.store.packet_body(&p.hash).await.unwrap().is_some()
}

async fn prune(rt: &Runtime) -> MaintenanceReport {
    let mut report = MaintenanceReport::default();
    rt.maintenance().prune(&mut report).await.unwrap();
    report
}

pub async fn jobs_start_with_idempotency_key_returns_the_existing_job(db: TestDb) {
    let rt = pipelines(&db).build().await.unwrap();
    let jobs = rt.jobs();
    let key = StartOptions::idempotency_key("order-42");
    let first = jobs.start_with("one", json!({"n": 1}), &key).await.unwrap();
    // A retried start (its acknowledgement was lost), even with other input, is the same job.
    let again = jobs.start_with("one", json!({"n": 2}), &key).await.unwrap();
    assert_eq!(first, again, "the key's job is returned, not a second one");
    // The key is per pipeline; no key means no dedupe.
    let other_pipeline = jobs.start_with("boom", json!({}), &key).await.unwrap();
    assert_ne!(other_pipeline, first);
    let plain_a = jobs.start("one", json!({"n": 1})).await.unwrap();
    let plain_b = jobs.start("one", json!({"n": 1})).await.unwrap();
    assert_ne!(plain_a, plain_b);
    assert_eq!(job_count(&rt).await, 4);
    // One step action per job: the repeated start enqueued nothing.
    let steps = super::batches::actions(&rt, "dockhand.job.step").await;
    assert_eq!(steps.len(), 4, "{steps:?}");
    // A key that is empty or too long is refused, naming the field; nothing is created.
    for bad in [
        String::new(),
        "k".repeat(dockhand::jobs::api::MAX_IDEMPOTENCY_KEY + 1),
    ] {
        let e = jobs
            .start_with("one", json!({}), &StartOptions::idempotency_key(bad))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("idempotency_key"), "{e}");
    }
    assert_eq!(job_count(&rt).await, 4);
    rt.drain(100).await.unwrap();
    assert_eq!(
        rt.jobs().get(first).await.unwrap().status,
        JobStatus::Completed
    );
    // Still the same job once final.
    assert_eq!(
        jobs.start_with("one", json!({}), &key).await.unwrap(),
        first
    );
}

pub async fn jobs_concurrent_starts_with_one_key_make_one_job(db: TestDb) {
    let rt = pipelines(&db).build().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let jobs = rt.jobs();
        tasks.push(tokio::spawn(async move {
            jobs.start_with(
                "one",
                json!({"i": i}),
                &StartOptions::idempotency_key("same"),
            )
            .await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every caller got the one job: {ids:?}");
    assert_eq!(job_count(&rt).await, 1);
}

pub async fn retention_prunes_final_jobs_with_events_and_unreferenced_packets(db: TestDb) {
    let faulty = FaultyStore::wrap(db.store.clone());
    // A lifecycle hook: the events are delivered (marked) after each finish, not written
    // delivered (a runtime without hooks writes them so).
    let rt = pipelines_on(&db, faulty.clone())
        .on_job_finished(|_| async {})
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let (a_in, b_in, c_in, d_in) = (
        json!({"item": "x"}),
        json!({"b": 1}),
        json!({"c": 1}),
        json!({"d": 1}),
    );
    let a = jobs.start("one", a_in.clone()).await.unwrap();
    let b = jobs.start("boom", b_in.clone()).await.unwrap();
    rt.drain(100).await.unwrap();
    jobs.deliver_events().await.unwrap();
    // d finishes with its lifecycle event not yet delivered (marking it delivered fails);
    // c never runs.
    faulty.fail_from("mark_event_delivered", 1, FaultMode::FailBefore);
    let d = jobs.start("one", d_in.clone()).await.unwrap();
    rt.run_due_once().await.unwrap();
    faulty.heal();
    let c = jobs
        .start_with("one", c_in.clone(), &StartOptions::idempotency_key("c"))
        .await
        .unwrap();
    assert_eq!(jobs.get(a).await.unwrap().status, JobStatus::Completed);
    assert_eq!(jobs.get(b).await.unwrap().status, JobStatus::Failed);
    assert_eq!(jobs.get(d).await.unwrap().status, JobStatus::Completed);

    db.clock.advance(Duration::days(8));
    // A packet written a moment ago that nothing references yet (a start between its packet
    // and its job row) is not collected.
    let fresh = json!({"fresh": true});
    db.store
        .put_packets(&[packets::encode(&fresh).unwrap()], db.clock.now())
        .await
        .unwrap();
    let r = prune(&rt).await;
    assert_eq!(r.jobs_pruned, 1, "only a: {r:?}");
    assert_eq!(r.job_events_pruned, 1, "a's delivered event: {r:?}");
    assert!(!stored(&rt, a).await, "completed 8 days ago: deleted");
    assert!(stored(&rt, b).await, "failed jobs are kept 30 days");
    assert!(stored(&rt, c).await, "not final: kept");
    assert!(stored(&rt, d).await, "undelivered event: kept");
    assert!(
        !packet_stored(&db, &a_in).await,
        "a's input: no job refers to it"
    );
    for (input, who) in [(&b_in, "b"), (&c_in, "c"), (&d_in, "d")] {
        assert!(
            packet_stored(&db, input).await,
            "{who}'s input is referenced"
        );
    }
    assert!(
        packet_stored(&db, &fresh).await,
        "unused for less than an hour"
    );
    // The claim a processed stays: claims and the ledger are the record of what was done.
    let x = Identity::new("shared:r", "src", "x").unwrap();
    let claim = jobs.claim_state(&x).await.unwrap().unwrap();
    assert_eq!(claim.status, ClaimStatus::Processed);
    // c's key is still held while c is stored.
    assert_eq!(
        jobs.start_with("one", json!({}), &StartOptions::idempotency_key("c"))
            .await
            .unwrap(),
        c
    );

    db.clock.advance(Duration::days(31));
    jobs.deliver_events().await.unwrap();
    let r = prune(&rt).await;
    assert_eq!(r.jobs_pruned, 2, "b and d: {r:?}");
    assert!(!stored(&rt, b).await && !stored(&rt, d).await);
    assert!(stored(&rt, c).await);
    assert!(!packet_stored(&db, &b_in).await && !packet_stored(&db, &fresh).await);
    assert!(packet_stored(&db, &c_in).await, "c is still pending");
    let v = jobs.check().await.unwrap();
    assert!(v.is_empty(), "{v:?}");
}

fn child_fails_first(i: i64) -> Result<StepOutput, HandlerError> {
    if i == 0 {
        Err(HandlerError::fatal("child 0 fails"))
    } else {
        Ok(StepOutput::one(json!({})))
    }
}

pub async fn retention_keeps_children_while_their_parent_is_stored(db: TestDb) {
    let rt = db
        .runtime()
        .pipeline(batch_pipeline(5, 2, child_fails_first).max_attempts(1))
        .build()
        .await
        .unwrap();
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.drain(1000).await.unwrap();
    rt.jobs().deliver_events().await.unwrap();
    assert_eq!(
        rt.jobs().get(parent).await.unwrap().status,
        JobStatus::Completed
    );
    let kids = children(&rt, parent).await;
    assert_eq!(kids.len(), 5);
    db.clock.advance(Duration::days(8));
    let cutoffs = PruneCutoffs {
        finished_before: db.clock.now() - Duration::days(7),
        failed_before: db.clock.now() - Duration::days(30),
        batch: 2,
    };
    // Batches of two: whatever order they take, no child goes while its parent is stored
    // (the parent's counters count it).
    let mut rounds = 0;
    loop {
        let done = db.store.prune_jobs(&cutoffs).await.unwrap();
        if stored(&rt, parent).await {
            assert_eq!(children(&rt, parent).await.len(), 5, "round {rounds}");
        }
        rounds += 1;
        if done.jobs == 0 {
            break;
        }
        assert!(rounds < 10, "retention does not end");
    }
    assert!(!stored(&rt, parent).await);
    let left: Vec<i64> = {
        let mut v = Vec::new();
        for k in &kids {
            if stored(&rt, k.id).await {
                v.push(k.id);
            }
        }
        v
    };
    let failed: Vec<i64> = kids
        .iter()
        .filter(|k| k.status == JobStatus::Failed)
        .map(|k| k.id)
        .collect();
    assert_eq!(left, failed, "the failed child is kept 30 days");
    let v = rt.jobs().check().await.unwrap();
    assert!(v.is_empty(), "{v:?}");
    db.clock.advance(Duration::days(31));
    let r = prune(&rt).await;
    assert_eq!(r.jobs_pruned, 1, "{r:?}");
}
