//! A step run that loses its lease after its last checked write and before its output write
//! (it stalls there; the reaper requeues its step action) writes nothing: `advance_job`,
//! `park_job` and `fan_out` are fenced by the run's lease (issue 15's zombie step runs, the
//! window the superseded-claims check left open). The step's next attempt decides what the job
//! does, with its own output. Without the fence the stale run moved the job on with its output
//! and the next attempt found the job gone past its step.

use super::batch_regressions::drain_rounds;
use super::batches::{assert_clean, children};
use crate::harness::TestDb;
use chrono::Duration;
use dockhand::store::faulty::{CallHook, FaultyStore};
use dockhand::{Clock, DynStore, JobStatus, Packet, Pipeline, StepOutput};
use serde_json::json;
use std::sync::{Arc, Mutex};

/// The output whose write the stale run reaches.
#[derive(Clone, Copy, Debug)]
enum Output {
    /// One packet: the job moves on to its next step (`advance_job`).
    Advance,
    /// `StepOutput::Park` (`park_job`).
    Park,
    /// Two packets: a batch of two children (`fan_out`).
    FanOut,
}

impl Output {
    fn method(self) -> &'static str {
        match self {
            Output::Advance => "advance_job",
            Output::Park => "park_job",
            Output::FanOut => "fan_out",
        }
    }
}

/// `make` outputs packets stamped with its attempt; `use` records the attempt it was given.
fn pipeline(out: Output, seen: Arc<Mutex<Vec<i64>>>) -> Pipeline {
    Pipeline::new("stale")
        .step("make", move |ctx| async move {
            let packets: Vec<Packet> = match out {
                Output::FanOut => (0..2)
                    .map(|i| Packet::new(json!({ "attempt": ctx.attempt, "i": i })))
                    .collect(),
                _ => vec![Packet::new(json!({ "attempt": ctx.attempt }))],
            };
            Ok(match out {
                Output::Park => StepOutput::Park(packets),
                _ => StepOutput::Packets(packets),
            })
        })
        .step("use", move |ctx| {
            let seen = seen.clone();
            async move {
                let attempt = ctx.input()["attempt"].as_i64().unwrap_or(-1);
                seen.lock().unwrap().push(attempt);
                Ok(StepOutput::one(json!({})))
            }
        })
}

async fn stale_output_is_fenced(db: TestDb, out: Output) {
    let faulty = FaultyStore::wrap(db.store.clone());
    // Right before the first run's output write: its lease runs out and the reaper requeues
    // its step action (through the wrapped store: not a counted call).
    let (store, clock): (DynStore, _) = (db.store.clone(), db.clock.clone());
    let stall: CallHook = Arc::new(move || {
        let (store, clock) = (store.clone(), clock.clone());
        Box::pin(async move {
            clock.advance(Duration::seconds(31));
            let reaped = store.reap_expired(clock.now(), 100).await.unwrap();
            assert_eq!(
                reaped.requeued, 1,
                "the stalled run's step action is requeued"
            );
        })
    });
    faulty.before_call(out.method(), 1, stall);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .lease(
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(10),
        )
        .concurrency(1)
        .pipeline(pipeline(out, seen.clone()))
        .build()
        .await
        .unwrap();
    let jobs = rt.jobs();
    let job = jobs.start("stale", json!({})).await.unwrap();
    assert_eq!(
        rt.run_due_once().await.unwrap(),
        1,
        "{out:?}: the first run"
    );
    assert_eq!(
        faulty.injected(),
        1,
        "{out:?}: the lease ran out before its write"
    );
    let j = jobs.get(job).await.unwrap();
    assert_eq!(
        (j.status, j.step_index),
        (JobStatus::Processing, 0),
        "{out:?}: the stale run moved nothing on"
    );
    assert!(
        db.store.batch_state(job).await.unwrap().is_none(),
        "{out:?}: the stale run wrote no worklist"
    );

    // The step's next attempt runs with its own output.
    drain_rounds(&rt, &db, 3).await;
    if matches!(out, Output::Park) {
        assert_eq!(jobs.get(job).await.unwrap().status, JobStatus::Waiting);
        assert!(jobs.resume(job).await.unwrap());
        drain_rounds(&rt, &db, 2).await;
    }
    let n = match out {
        Output::FanOut => 2,
        _ => 1,
    };
    assert_eq!(
        *seen.lock().unwrap(),
        vec![2; n],
        "{out:?}: the next step ran once per packet of attempt 2, never on the stale run's"
    );
    assert_eq!(jobs.get(job).await.unwrap().status, JobStatus::Completed);
    if matches!(out, Output::FanOut) {
        assert_eq!(children(&rt, job).await.len(), 2);
    }
    assert_clean(&rt).await;
}

/// A step run that lost its lease before `advance_job` does not move the job on.
pub async fn regression_stale_step_run_does_not_advance_the_job(db: TestDb) {
    stale_output_is_fenced(db, Output::Advance).await;
}

/// A step run that lost its lease before `park_job` does not park the job.
pub async fn regression_stale_step_run_does_not_park_the_job(db: TestDb) {
    stale_output_is_fenced(db, Output::Park).await;
}

/// A step run that lost its lease before `fan_out` writes no worklist.
pub async fn regression_stale_step_run_does_not_fan_out(db: TestDb) {
    stale_output_is_fenced(db, Output::FanOut).await;
}
