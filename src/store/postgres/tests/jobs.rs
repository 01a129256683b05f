//! Jobs: step transitions, engine data, packets, listing, and the terminal bridge (claims
//! completed or released, idempotent repeats, the lifecycle outbox).

use super::{claimed, cleanup, fresh, new_job, req, step, t0, tracked};
use crate::action::{ActionFilter, ActionQuery};
use crate::claims::{ClaimStatus, CompletionConfig, CompletionRegistry};
use crate::jobs::{packets, BridgeOutcome, JobFilter, NewJob, STEP_HOOK};
use crate::state::JobStatus;
use crate::store::Store;
use serde_json::json;

#[tokio::test]
async fn bridge_completes_releases_and_is_idempotent() {
    let Some((s, url, schema)) = fresh("bridge").await else {
        return;
    };
    let now = t0();
    let reg = CompletionRegistry::with_builtins();
    let e = s
        .finish_job(1, JobStatus::Processing, None, &reg, now)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            crate::Error::InvalidInput {
                field: "job status",
                ..
            }
        ),
        "{e}"
    );
    let e = s
        .finish_job(999, JobStatus::Failed, None, &reg, now)
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

    // Success: every claim of the job completes (ledger row, processed / deleted).
    let ok = new_job(&s).await;
    let other = new_job(&s).await;
    let a = claimed(
        s.claim_item(&req("a", Some(ok), tracked("feed")), now)
            .await
            .unwrap(),
    );
    let drop_cfg = CompletionConfig {
        retain_processed: false,
        ..Default::default()
    };
    let b = claimed(
        s.claim_item(&req("b", Some(ok), drop_cfg), now)
            .await
            .unwrap(),
    );
    let c = claimed(
        s.claim_item(&req("c", Some(other), tracked("feed")), now)
            .await
            .unwrap(),
    );
    let out = s
        .finish_job(ok, JobStatus::Completed, None, &reg, now)
        .await
        .unwrap();
    assert_eq!(out, BridgeOutcome::Finished);
    let job = s.get_job(ok).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.finished_at),
        (JobStatus::Completed, Some(crate::clock::to_millis(now)))
    );
    assert_eq!(
        s.get_claim(&a.identity).await.unwrap().unwrap().status,
        ClaimStatus::Processed
    );
    assert!(s.get_claim(&b.identity).await.unwrap().is_none());
    assert_eq!(
        s.tracked_item("feed", "a").await.unwrap().unwrap().last_job,
        Some(ok)
    );
    // Repeats change nothing and report the standing status.
    for st in [JobStatus::Completed, JobStatus::Failed] {
        let again = s
            .finish_job(ok, st, Some("manual"), &reg, now)
            .await
            .unwrap();
        assert_eq!(
            again,
            BridgeOutcome::AlreadyFinal {
                status: JobStatus::Completed,
                reason: None
            }
        );
    }

    // A missing handler rolls everything back; failing then releases the claims.
    let mut missing = tracked("feed");
    missing.handler = Some("nope".into());
    let d = claimed(
        s.claim_item(&req("d", Some(other), missing), now)
            .await
            .unwrap(),
    );
    let out = s
        .finish_job(other, JobStatus::Completed, None, &reg, now)
        .await
        .unwrap();
    let BridgeOutcome::ClaimCompletionFailed { error } = out else {
        panic!("{out:?}")
    };
    assert!(
        error.contains("nope") && error.contains("item d"),
        "{error}"
    );
    assert_eq!(
        s.get_claim(&c.identity).await.unwrap().unwrap().status,
        ClaimStatus::Claimed
    );
    assert!(s.tracked_item("feed", "c").await.unwrap().is_none());
    assert_eq!(
        s.get_job(other).await.unwrap().unwrap().status,
        JobStatus::Pending
    );
    let out = s.finish_job(
        other,
        JobStatus::Failed,
        Some("item_claim_completion_failed"),
        &reg,
        now,
    );
    assert_eq!(out.await.unwrap(), BridgeOutcome::Finished);
    assert!(s.get_claim(&c.identity).await.unwrap().is_none());
    assert!(s.get_claim(&d.identity).await.unwrap().is_none());
    // The items are free again.
    claimed(
        s.claim_item(&req("c", None, Default::default()), now)
            .await
            .unwrap(),
    );

    // One outbox event per finished job, delivered once.
    let events = s.undelivered_events(10).await.unwrap();
    let got: Vec<_> = events
        .iter()
        .map(|e| (e.job_id, e.status, e.reason.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (ok, JobStatus::Completed, None),
            (
                other,
                JobStatus::Failed,
                Some("item_claim_completion_failed")
            )
        ]
    );
    assert_eq!(events[0].pipeline, "feed");
    assert!(s.mark_event_delivered(events[0].id, now).await.unwrap());
    assert!(!s.mark_event_delivered(events[0].id, now).await.unwrap());
    assert_eq!(s.undelivered_events(10).await.unwrap().len(), 1);
    cleanup(s, &url, &schema).await;
}

#[tokio::test]
async fn job_steps_engine_data_and_packets() {
    let Some((s, url, schema)) = fresh("job_steps").await else {
        return;
    };
    let now = t0();
    let mut rx = s.wakeups();
    rx.borrow_and_update();
    let id = s
        .create_job(
            &NewJob {
                pipeline: "feed".into(),
                input_refs: vec!["v1:abc".into()],
                engine_data: json!({"cursor": 1}),
                step: step(),
                idempotency_key: None,
            },
            now,
        )
        .await
        .unwrap();
    assert!(rx.has_changed().unwrap(), "create_job wakes runners");
    let steps = |n: usize| {
        let s = &s;
        async move {
            let f = ActionFilter {
                hook: Some(STEP_HOOK.into()),
                ..Default::default()
            };
            let q = ActionQuery {
                filter: f,
                ..Default::default()
            };
            let all = s.query(&q).await.unwrap();
            assert_eq!(all.len(), n);
            all
        }
    };
    assert_eq!(steps(1).await[0].args, json!({"job": id, "step": 0}));
    let job = s.get_job(id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.step_index, job.input_refs.clone()),
        (JobStatus::Pending, 0, vec!["v1:abc".to_string()])
    );

    assert!(
        s.start_step(id, 1, now).await.unwrap().job().is_none(),
        "stale step"
    );
    let j = s.start_step(id, 0, now).await.unwrap().into_job().unwrap();
    assert_eq!(j.status, JobStatus::Processing);
    assert_eq!(
        s.start_step(id, 0, now)
            .await
            .unwrap()
            .into_job()
            .unwrap()
            .status,
        JobStatus::Processing
    );
    let refs = vec!["v1:def".to_string()];
    assert!(s
        .advance_job(id, None, (0, 1), &refs, &step(), now)
        .await
        .unwrap());
    assert!(
        !s.advance_job(id, None, (0, 1), &refs, &step(), now)
            .await
            .unwrap(),
        "moved on"
    );
    assert_eq!(steps(2).await[1].args, json!({"job": id, "step": 1}));
    assert!(s.park_job(id, None, (1, 2), &[], now).await.unwrap());
    assert!(!s.park_job(id, None, (1, 2), &[], now).await.unwrap());
    assert!(
        s.start_step(id, 2, now).await.unwrap().job().is_none(),
        "waiting"
    );
    assert!(s.resume_job(id, &step(), now).await.unwrap());
    assert!(!s.resume_job(id, &step(), now).await.unwrap());
    assert_eq!(steps(3).await[2].args, json!({"job": id, "step": 2}));
    let job = s.get_job(id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.step_index, job.input_refs),
        (JobStatus::Processing, 2, vec![])
    );

    // Engine data: compare-and-swap on the version.
    assert_eq!(
        s.engine_data(id).await.unwrap(),
        Some((json!({"cursor": 1}), 0))
    );
    assert!(s
        .cas_engine_data(id, 0, &json!({"cursor": 2}))
        .await
        .unwrap());
    assert!(
        !s.cas_engine_data(id, 0, &json!({"cursor": 3}))
            .await
            .unwrap(),
        "conflict"
    );
    assert_eq!(
        s.engine_data(id).await.unwrap(),
        Some((json!({"cursor": 2}), 1))
    );
    assert_eq!(s.engine_data(12345).await.unwrap(), None);

    // Packets: stored once, duplicates in one batch included.
    let p = packets::encode(&json!({"b": 1, "a": [1, 2]})).unwrap();
    let q = packets::encode(&json!("x")).unwrap();
    s.put_packets(&[p.clone(), q.clone(), p.clone()], now)
        .await
        .unwrap();
    s.put_packets(std::slice::from_ref(&p), now).await.unwrap();
    s.put_packets(&[], now).await.unwrap();
    let body = s.packet_body(&p.hash).await.unwrap();
    assert_eq!(
        packets::verify(&p.reference, body).unwrap(),
        json!({"a": [1, 2], "b": 1})
    );
    assert_eq!(s.packet_body("0".repeat(64).as_str()).await.unwrap(), None);

    // Listing: newest first, filtered, paged.
    let second = new_job(&s).await;
    let all = s.list_jobs(&JobFilter::default()).await.unwrap();
    assert_eq!(all.iter().map(|j| j.id).collect::<Vec<_>>(), [second, id]);
    let f = JobFilter {
        statuses: vec![JobStatus::Pending],
        ..Default::default()
    };
    assert_eq!(s.list_jobs(&f).await.unwrap()[0].id, second);
    let f = JobFilter {
        pipeline: Some("other".into()),
        ..Default::default()
    };
    assert!(s.list_jobs(&f).await.unwrap().is_empty());
    let f = JobFilter {
        limit: 1,
        offset: 1,
        ..Default::default()
    };
    assert_eq!(s.list_jobs(&f).await.unwrap()[0].id, id);
    cleanup(s, &url, &schema).await;
}
