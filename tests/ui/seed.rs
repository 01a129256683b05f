//! Larger seeds on top of [`Fixture::new`]: 120 actions over three hooks, four groups and
//! every status; jobs holding item claims; a batch parent with children in several states.

use crate::support::{t0, Fixture};
use chrono::Duration;
use dockhand::action::Action;
use dockhand::batch::{ChildOutcome, ChildSpec, FanOutOutcome, WorkItem};
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, CompletionConfig, CompletionRegistry};
use dockhand::jobs::{NewJob, StepAction};
use dockhand::store::{ClaimRequest, Finish, FinishResult};
use dockhand::{ActionQuery, ActionSpec, Identity, JobStatus};
use serde_json::json;
use std::collections::BTreeMap;

/// The hooks of the seeded actions, by `n % 3`.
pub const HOOKS: [&str; 3] = ["email.send", "sms.send", "report.build"];

/// What [`many`] seeded.
pub struct Many {
    /// The 120 actions, in enqueue order (`n` = index).
    pub ids: Vec<i64>,
    /// A pending `dockhand.test.internal` action (hidden unless `internal=1`).
    pub internal: i64,
}

/// 120 actions: hook `HOOKS[n % 3]`; group `mail`, `sms`, `reports` or none by `n % 4`;
/// priority `n % 5`; args `{"n": n, "tenant": "acme" | "globex"}` (even | odd); all with one
/// attempt. `n % 6 == 5` (all `report.build`) are due in an hour, the rest are due now. Then
/// 30 `sms.send` actions are claimed by `w2`: 10 complete, 10 fail (`boom <id>`), 10 stay
/// running; and the first 10 `email.send` actions are canceled.
pub async fn many(f: &Fixture) -> Many {
    let now = t0();
    let mut ids = Vec::with_capacity(120);
    for n in 0..120usize {
        let mut spec = ActionSpec::new(
            HOOKS[n % 3],
            json!({"n": n, "tenant": if n % 2 == 0 { "acme" } else { "globex" }}),
        )
        .priority((n % 5) as i32)
        .max_attempts(1);
        spec = match n % 4 {
            0 => spec.group("mail"),
            1 => spec.group("sms"),
            2 => spec.group("reports"),
            _ => spec,
        };
        spec = if n % 6 == 5 {
            spec.at(now + Duration::hours(1) + Duration::seconds(n as i64))
        } else {
            spec.at(now - Duration::seconds(n as i64))
        };
        let prepared = spec.prepare(now).expect("prepare");
        ids.push(f.store.enqueue(&prepared, now).await.expect("enqueue").id);
    }
    let prepared = ActionSpec::new("dockhand.test.internal", json!({}))
        .prepare(now)
        .expect("prepare");
    let internal = f.store.enqueue(&prepared, now).await.expect("enqueue").id;
    let hooks = ["sms.send".to_string()];
    let claimed = f
        .store
        .claim(&ClaimRequest {
            owner: "w2",
            limit: 30,
            now,
            lease_until: now + Duration::minutes(5),
            hooks: Some(&hooks),
            routing: None,
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 30);
    for (i, c) in claimed.iter().enumerate() {
        let finish = match i / 10 {
            0 => Finish::Complete,
            1 => Finish::Fail {
                error: format!("boom {}", c.id),
            },
            _ => continue,
        };
        let r = f
            .store
            .finish(c.lease(), &finish, now + Duration::seconds(1))
            .await
            .expect("finish");
        assert_eq!(r, FinishResult::Applied);
    }
    for n in (0..120).filter(|n| n % 3 == 0).take(10) {
        assert!(f.store.cancel(ids[n], now).await.expect("cancel"));
    }
    Many { ids, internal }
}

/// Every action in the store.
pub async fn all_actions(f: &Fixture) -> Vec<Action> {
    f.store
        .query(&ActionQuery {
            limit: 10_000,
            ..ActionQuery::default()
        })
        .await
        .expect("query")
}

/// Every action's status by id.
pub async fn statuses(f: &Fixture) -> BTreeMap<i64, String> {
    all_actions(f)
        .await
        .into_iter()
        .map(|a| (a.id, a.status.as_str().to_string()))
        .collect()
}

/// The ids whose status differs between two snapshots (or that are in only one).
pub fn changed(before: &BTreeMap<i64, String>, after: &BTreeMap<i64, String>) -> Vec<i64> {
    let mut ids: Vec<i64> = before
        .keys()
        .chain(after.keys())
        .copied()
        .filter(|id| before.get(id) != after.get(id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

pub fn step() -> StepAction {
    StepAction {
        priority: 0,
        max_attempts: 3,
        group: None,
    }
}

/// A pending job of `pipeline` (with its first step action).
pub async fn job(f: &Fixture, pipeline: &str) -> i64 {
    let job = NewJob {
        pipeline: pipeline.into(),
        input_refs: vec![],
        engine_data: json!({}),
        step: step(),
        idempotency_key: None,
    };
    f.store.create_job(&job, t0()).await.expect("create job")
}

/// Claims `item` in `scope` for `job`, held for `ttl`.
pub async fn claim(
    f: &Fixture,
    scope: &str,
    item: &str,
    job: i64,
    ttl: Duration,
) -> dockhand::Descriptor {
    let req = ClaimItemRequest {
        identity: Identity::new(scope, "rss", item).expect("identity"),
        job_id: Some(job),
        ttl,
        completion: CompletionConfig::default(),
        reprocess: false,
        run: None,
    };
    match f.store.claim_item(&req, t0()).await.expect("claim item") {
        ClaimOutcome::Claimed(d) => d,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// Finishes a job through the store's terminal bridge.
pub async fn finish_job(f: &Fixture, id: i64, status: JobStatus, reason: &str) {
    f.store
        .finish_job(
            id,
            status,
            Some(reason),
            &CompletionRegistry::with_builtins(),
            t0(),
        )
        .await
        .expect("finish job");
}

/// What [`batch`] seeded.
pub struct Batch {
    pub parent: i64,
    /// Children 0, 1, 2: completed, failed (`child broke`), still pending.
    pub children: Vec<i64>,
}

/// A `fanout` parent with 5 items in chunks of 2: 3 children created (one completed, one
/// failed, one pending), 2 items still ready.
pub async fn batch(f: &Fixture) -> Batch {
    let parent = job(f, "fanout").await;
    let items: Vec<WorkItem> = (0..5)
        .map(|n| WorkItem {
            payload_ref: format!("v1:{n:064}"),
            sidecar: vec![],
        })
        .collect();
    let r = f
        .store
        .fan_out(parent, None, &items, (2, 1), "c", t0())
        .await
        .expect("fan out");
    assert_eq!(r, FanOutOutcome::Created);
    // A chunk run leases the rows (the lease fences it), then finishes and is deleted so the
    // seeded action lists stay as the other tests count them.
    let runner = f
        .store
        .enqueue(
            &ActionSpec::new("seed.chunk", json!({}))
                .prepare(t0())
                .expect("prepare"),
            t0(),
        )
        .await
        .expect("enqueue");
    let hooks = ["seed.chunk".to_string()];
    let chunk = f
        .store
        .claim(&ClaimRequest {
            owner: "w",
            limit: 1,
            now: t0(),
            lease_until: t0() + Duration::minutes(1),
            hooks: Some(&hooks),
            routing: None,
        })
        .await
        .expect("claim")
        .first()
        .expect("the chunk run")
        .lease();
    let rows = f
        .store
        .lease_work(parent, 3, chunk, t0() + Duration::minutes(1), t0())
        .await
        .expect("lease");
    assert_eq!(rows.len(), 3);
    let mut children = Vec::new();
    for row in &rows {
        let spec = ChildSpec {
            parent_id: parent,
            idx: row.idx,
            pipeline: "fanout".into(),
            step_index: 1,
            input_refs: vec![row.payload_ref.clone()],
            claim_tokens: vec![],
            claim_ttl: Duration::minutes(30),
            step: step(),
            run_by: None,
        };
        match f
            .store
            .create_child(&spec, chunk, t0())
            .await
            .expect("child")
        {
            ChildOutcome::Created(id) => children.push(id),
            other => panic!("{other:?}"),
        }
    }
    let done = f
        .store
        .finish(chunk, &Finish::Complete, t0())
        .await
        .expect("finish");
    assert_eq!(done, FinishResult::Applied);
    let gone = f.store.delete_actions(&[runner.id]).await.expect("delete");
    assert_eq!(gone.changed, vec![runner.id]);
    finish_job(f, children[0], JobStatus::Completed, "done").await;
    finish_job(f, children[1], JobStatus::Failed, "child broke").await;
    Batch { parent, children }
}
