//! Set-based claims and children (issue 16 item 3): `Store::claim_items` gives each request
//! what `claim_item` one at a time would, writes nothing when a run lost its lease;
//! `StepContext::claim_many` asks the reprocess callback; `Store::create_children` adopts,
//! discards and creates a chunk's rows in one call with the parent's counters and step actions
//! right.

use super::batch_guards::spec_for;
use super::batch_regressions::{claim_as_worker, drain_rounds};
use super::batches::{actions, assert_clean, batch_pipeline, children, item, ok_child, runtime};
use super::claims::claims_runtime;
use crate::harness::TestDb;
use chrono::Duration;
use dockhand::batch::{ChildOutcome, DiscardCause, CHUNK_HOOK};
use dockhand::claims::{ClaimItemRequest, ClaimOutcome, ClaimRun, ClaimStatus};
use dockhand::jobs::{StepAction, STEP_HOOK};
use dockhand::store::Lease;
use dockhand::{Clock, CompletionConfig, Error, Identity, JobStatus, Jobs, Pipeline, StepOutput};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn request(scope: &str, item: &str, job: Option<i64>, reprocess: bool) -> ClaimItemRequest {
    ClaimItemRequest {
        identity: Identity::new(scope, "src", item).unwrap(),
        job_id: job,
        ttl: Duration::minutes(5),
        completion: CompletionConfig::default(),
        reprocess,
        run: None,
    }
}

/// Outcomes as comparable text: a claim is named by the first request whose claim has its
/// token (`mine` when it is the token `mine` held before the call).
fn shape(out: &[ClaimOutcome], mine: &str) -> Vec<String> {
    let mut tokens: Vec<&str> = Vec::new();
    out.iter()
        .map(|o| match o {
            ClaimOutcome::Claimed(d) if d.token == mine => "claimed:mine".to_string(),
            ClaimOutcome::Claimed(d) => {
                let first = tokens
                    .iter()
                    .position(|t| *t == d.token)
                    .unwrap_or_else(|| {
                        tokens.push(&d.token);
                        tokens.len() - 1
                    });
                format!("claimed:{first}")
            }
            ClaimOutcome::JobNotLive { status, .. } => format!("not_live:{status}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// A mix of every outcome, with repeated identities, taken by `claim_item` one at a time in
/// one scope and by one `claim_items` call in another: the same outcomes, the same rows.
pub async fn claim_items_give_each_request_what_claim_item_would(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let jobs = rt.jobs();
    let a = jobs.start("hold", json!({})).await.unwrap();
    let b = jobs.start("hold", json!({})).await.unwrap();
    let done = jobs.start("hold", json!({})).await.unwrap();
    jobs.cancel(done).await.unwrap();
    let store = &db.store;
    let now = db.clock.now();
    let items = [
        "new",
        "held",
        "processed",
        "again",
        "expired",
        "mine",
        "final",
        "free",
        "dup-free",
    ];
    let mut shapes = Vec::new();
    let mut rows = Vec::new();
    for scope in ["one:s", "many:s"] {
        let req =
            |item: &str, job: Option<i64>, reprocess: bool| request(scope, item, job, reprocess);
        let take = |r: ClaimItemRequest, at| async move {
            match store.claim_item(&r, at).await.unwrap() {
                ClaimOutcome::Claimed(d) => d,
                other => panic!("setup claim: {other:?}"),
            }
        };
        take(req("held", Some(b), false), now).await;
        for item in ["processed", "again"] {
            let d = take(req(item, Some(b), false), now).await;
            assert_eq!(
                store.complete_claim(&d, None, now).await.unwrap(),
                dockhand::claims::CompleteOutcome::Completed
            );
        }
        take(req("expired", Some(b), false), now - Duration::minutes(10)).await;
        let mine = take(req("mine", Some(a), false), now).await.token;
        let reqs = vec![
            req("new", Some(a), false),
            req("held", Some(a), false),
            req("processed", Some(a), false),
            req("again", Some(a), true),
            req("expired", Some(a), false),
            req("mine", Some(a), false),
            req("new", Some(a), false),
            req("new", None, false),
            req("final", Some(done), false),
            req("free", Some(9_999_999), false),
            req("dup-free", None, false),
            req("dup-free", None, false),
            req("processed", Some(a), true),
        ];
        let out = if scope == "one:s" {
            let mut out = Vec::new();
            for r in &reqs {
                out.push(store.claim_item(r, now).await.unwrap());
            }
            out
        } else {
            store.claim_items(&reqs, now).await.unwrap()
        };
        shapes.push(shape(&out, &mine));
        let mut state = Vec::new();
        for item in items {
            let c = store
                .get_claim(&Identity::new(scope, "src", item).unwrap())
                .await
                .unwrap()
                .map(|c| (c.status, c.job_id));
            state.push((item, c));
        }
        rows.push(state);
    }
    let expected = [
        "claimed:0",
        "HeldByOther",
        "AlreadyProcessed",
        "claimed:1",
        "claimed:2",
        "claimed:mine",
        "claimed:0",
        "HeldByOther",
        "not_live:cancelled",
        "claimed:3",
        "claimed:4",
        "HeldByOther",
        "claimed:5",
    ];
    assert_eq!(shapes[0], expected, "claim_item one at a time");
    assert_eq!(shapes[1], expected, "claim_items in one call");
    assert_eq!(rows[0], rows[1], "the same rows");
    assert_eq!(
        rows[1][6],
        ("final", None),
        "nothing written for a final job"
    );
    assert_eq!(
        rows[1][4],
        ("expired", Some((ClaimStatus::Claimed, Some(a))))
    );
    assert!(store.claim_items(&[], now).await.unwrap().is_empty());
}

/// One request of a call whose step run lost its lease: the whole call is refused with
/// `LeaseLost` and writes nothing, the other requests' claims included.
pub async fn claim_items_with_a_lost_lease_write_nothing(db: TestDb) {
    let rt = claims_runtime(&db).await;
    let a = rt.jobs().start("hold", json!({})).await.unwrap();
    let now = db.clock.now();
    let lost = Lease {
        id: 9_999_999,
        token: 7,
    };
    let mut reqs = vec![
        request("lease:s", "x", Some(a), false),
        request("lease:s", "y", None, false),
        request("lease:s", "z", Some(a), false),
    ];
    reqs[2].run = Some(ClaimRun {
        step: 0,
        lease: lost,
    });
    match db.store.claim_items(&reqs, now).await {
        Err(Error::LeaseLost { action_id, token }) => {
            assert_eq!((action_id, token), (lost.id, lost.token))
        }
        other => panic!("a lost lease fails the call, got {other:?}"),
    }
    for r in &reqs {
        assert!(
            db.store.get_claim(&r.identity).await.unwrap().is_none(),
            "{} not claimed",
            r.identity.item_id
        );
    }
    // Without the lost run, the same call claims all three.
    reqs[2].run = None;
    let out = db.store.claim_items(&reqs, now).await.unwrap();
    assert!(
        out.iter().all(|o| matches!(o, ClaimOutcome::Claimed(_))),
        "{out:?}"
    );
}

/// What a `claim_many` step saw, per job.
type SeenMany = Arc<Mutex<Vec<Vec<bool>>>>;

/// `StepContext::claim_many`: one result per id in order (a repeated id gets the claim again);
/// a processed item is put to the reprocess callback once, and taken again only when it says
/// so.
pub async fn claim_many_asks_the_reprocess_callback_and_claims_again(db: TestDb) {
    let seen: SeenMany = Arc::default();
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (s, q) = (seen.clone(), asked.clone());
    let rt = db
        .runtime()
        .pipeline(
            Pipeline::new("many")
                .step("take", move |ctx| {
                    let s = s.clone();
                    async move {
                        let ids: Vec<String> = ctx.input()["ids"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_str().unwrap().to_string())
                            .collect();
                        let got = ctx
                            .claim_many("rss", &ids)
                            .await
                            .map_err(dockhand::HandlerError::retry)?;
                        s.lock()
                            .unwrap()
                            .push(got.iter().map(Option::is_some).collect());
                        Ok(StepOutput::one(json!({})))
                    }
                })
                .scope("shared:many"),
        )
        .reprocess(move |c| {
            q.lock().unwrap().push(c.item_id.clone());
            c.item_id == "b"
        })
        .build()
        .await
        .unwrap();
    let first = rt
        .jobs()
        .start("many", json!({"ids": ["a", "b", "c", "a"]}))
        .await
        .unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(
        rt.jobs().get(first).await.unwrap().status,
        JobStatus::Completed
    );
    let second = rt
        .jobs()
        .start("many", json!({"ids": ["a", "b", "c", "d"]}))
        .await
        .unwrap();
    rt.drain(10).await.unwrap();
    assert_eq!(
        rt.jobs().get(second).await.unwrap().status,
        JobStatus::Completed
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![vec![true, true, true, true], vec![false, true, false, true]]
    );
    assert_eq!(
        *asked.lock().unwrap(),
        vec!["a", "b", "c"],
        "asked once each"
    );
    for (i, owner) in [("a", first), ("b", second), ("c", first), ("d", second)] {
        let c = rt
            .jobs()
            .claim_state(&Identity::new("shared:many", "rss", i).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.status, c.job_id),
            (ClaimStatus::Processed, Some(owner)),
            "{i}"
        );
    }
}

/// `create_children` on one chunk: a row whose child exists is adopted, a row whose claim was
/// taken over is discarded (its claim stays with the new owner), the others become children
/// with their claims handed over and renewed, the parent's `children_total` counts them once
/// and each child has exactly one step action. Delivered again, every row is adopted and
/// nothing more is written; a stale run is fenced out.
pub async fn create_children_adopts_discards_and_creates_in_one_call(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(6, 6, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split: the parent holds items 0..6 for 30 minutes
    let run = claim_as_worker(&db, CHUNK_HOOK, Duration::hours(2)).await;
    let now = db.clock.now();
    let rows = db
        .store
        .lease_work(parent, 6, run, now + Duration::hours(2), now)
        .await
        .unwrap();
    assert_eq!(rows.len(), 6);
    let mut specs = Vec::new();
    for i in 0..6 {
        let mut spec = spec_for(&rt, parent, i).await;
        spec.step.group = Some(StepAction::group_for("batch"));
        specs.push(spec);
    }
    let ChildOutcome::Created(first) = db.store.create_child(&specs[0], run, now).await.unwrap()
    else {
        panic!("row 0 becomes a child");
    };
    db.clock.advance(Duration::minutes(31));
    let other = rt
        .jobs()
        .claim(item(1), None, Duration::hours(1), Default::default(), false)
        .await
        .unwrap()
        .expect("an expired claim is taken over");
    let now = db.clock.now();
    let made = db.store.create_children(&specs, run, now).await.unwrap();
    assert_eq!(made[0], ChildOutcome::Adopted(first));
    assert_eq!(made[1], ChildOutcome::Discarded(DiscardCause::ClaimLost));
    let mut kids = HashMap::new();
    for (i, m) in made.iter().enumerate().skip(2) {
        match m {
            ChildOutcome::Created(child) => kids.insert(i, *child),
            other => panic!("row {i}: {other:?}"),
        };
    }
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(st.children_total, 5, "row 0 once, rows 2..6 once each");
    assert_eq!((st.completed_rows, st.discarded_rows), (5, 1));
    let steps = actions(&rt, STEP_HOOK).await;
    let mut ids: Vec<i64> = kids.values().copied().collect();
    ids.push(first);
    for child in &ids {
        let n = steps
            .iter()
            .filter(|a| a.args["job"] == json!(child))
            .count();
        assert_eq!(n, 1, "child {child}: one step action");
    }
    for (&i, &child) in &kids {
        let c = rt.jobs().claim_state(&item(i)).await.unwrap().unwrap();
        assert_eq!(c.job_id, Some(child), "item {i} handed over");
        assert_eq!(
            c.expires_at,
            Some(now + Duration::minutes(30)),
            "item {i} renewed"
        );
    }
    let c1 = rt.jobs().claim_state(&item(1)).await.unwrap().unwrap();
    assert_eq!(
        (c1.token.as_deref(), c1.job_id),
        (Some(other.token.as_str()), None),
        "the new owner keeps item 1"
    );
    // Delivered again: every child row adopted, nothing more written.
    let again = db
        .store
        .create_children(&specs[2..], run, now)
        .await
        .unwrap();
    for (i, m) in again.iter().enumerate() {
        assert_eq!(*m, ChildOutcome::Adopted(kids[&(i + 2)]));
    }
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(st.children_total, 5);
    assert_eq!(actions(&rt, STEP_HOOK).await.len(), steps.len());
    // A stale run (its lease taken back by the reaper) is fenced out.
    db.clock.advance(Duration::hours(3));
    rt.run_maintenance_once().await.unwrap();
    match db
        .store
        .create_children(&specs[2..], run, db.clock.now())
        .await
    {
        Err(Error::LeaseLost { action_id, .. }) => assert_eq!(action_id, run.id),
        other => panic!("a stale chunk run must be fenced out, got {other:?}"),
    }
    for _ in 0..6 {
        drain_rounds(&rt, &db, 2).await;
        db.clock.advance(Duration::minutes(1));
    }
    let p = rt.jobs().get(parent).await.unwrap();
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!(
        p.status,
        JobStatus::Completed,
        "{st:?} {:?}",
        db.store.job_actions(parent, 20).await
    );
    assert_eq!((st.children_total, st.children_completed), (5, 5));
    assert_eq!(children(&rt, parent).await.len(), 5);
    assert_clean(&rt).await;
}

/// `create_children` for a stopped batch: every row is discarded (`BatchStopped`), its claim
/// released, no child and no step action.
pub async fn create_children_of_a_stopped_batch_discards_every_row(db: TestDb) {
    let rt = runtime(&db, db.store.clone(), batch_pipeline(4, 4, ok_child)).await;
    let parent = rt.jobs().start("batch", json!({})).await.unwrap();
    rt.run_due_once().await.unwrap(); // split
    let run = claim_as_worker(&db, CHUNK_HOOK, Duration::minutes(5)).await;
    let now = db.clock.now();
    let rows = db
        .store
        .lease_work(parent, 4, run, now + Duration::minutes(5), now)
        .await
        .unwrap();
    assert_eq!(rows.len(), 4);
    let mut specs = Vec::new();
    for i in 0..4 {
        specs.push(spec_for(&rt, parent, i).await);
    }
    Jobs::without_pipelines(db.store.clone(), Arc::new(db.clock.clone()))
        .cancel(parent)
        .await
        .unwrap();
    let steps = actions(&rt, STEP_HOOK).await.len();
    let made = db.store.create_children(&specs, run, now).await.unwrap();
    assert_eq!(
        made,
        vec![ChildOutcome::Discarded(DiscardCause::BatchStopped); 4]
    );
    assert!(children(&rt, parent).await.is_empty());
    assert_eq!(actions(&rt, STEP_HOOK).await.len(), steps);
    for i in 0..4 {
        assert!(
            rt.jobs().claim_state(&item(i)).await.unwrap().is_none(),
            "item {i} released"
        );
    }
    let st = rt.jobs().batch_state(parent).await.unwrap().unwrap();
    assert_eq!((st.children_total, st.discarded_rows), (0, 4));
}
