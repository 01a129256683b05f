//! The fault-point sweep's workload: what the producer starts and enqueues, the pipelines and
//! handlers it runs, the operator's own moves during the drive (a batch cancelled mid-flight,
//! a failed fan-out step retried by hand), and the sweep ledger its side effects go to.
//!
//! - `sweep`: a step claims [`ITEMS`] items and fans them out as a batch in chunks of [`CHUNK`];
//!   each child completes its item's claim. Its children run in their chunk
//!   (`children_in_chunk`): created leased, started, run and finished by the chunk's run; the
//!   child of item 0 fails its first attempt there, so its retry is written back by the chunk
//!   and run by a runner.
//! - `solo`: a two-step job holding one claim (a step advance; success completes the claim).
//! - `doomed`: claims one item, then fails every attempt until its retries run out
//!   (`failed/retry_exhausted`, the claim released).
//! - `cancel`: a batch whose children fail their first attempt, so they are waiting for a
//!   retry when the operator's cancel action (priority 0, due a minute after the start) cancels
//!   the batch mid-flight. The cancel's time is recorded: no child of the batch may be created
//!   or complete after it (B5).
//! - `refan`: a batch whose fan-out step is cancelled by the operator while it runs, once: the
//!   cancel lands right before the runner's next `finish` call after the step's first run,
//!   so its fan-out commits and its finish is fenced out (or, when the run failed, its retry
//!   record is). The operator retries it by hand while the batch is in flight (its children
//!   fail their first attempt too): the retried step must not run again and refuse its own
//!   batch (issue 15, defect 9). The cancel is written behind the store, which refuses an
//!   operator's cancel of a step action since session 25; databases from before can hold one.
//! - two plain actions; the second claims and completes a free-standing item (no job).

use super::sweep_checks::{actions, all_jobs};
use crate::harness::{RawPool, TestDb};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dockhand::claims::ledger::TrackedItems;
use dockhand::claims::{
    ClaimItemRequest, ClaimOutcome, CompleteOutcome, CompletionContext, CompletionHandler,
    CompletionTx,
};
use dockhand::store::faulty::{CallHook, FaultyStore};
use dockhand::{
    ActionFilter, ActionQuery, ActionSpec, ActionStatus, Clock, CompletionConfig, DynStore,
    HandlerError, Identity, JobStatus, Packet, Pipeline, Runtime, StepOutput, TestClock,
};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Items the `sweep` split step claims and fans out.
pub(super) const ITEMS: usize = 5;
/// Items the `cancel` batch claims.
const SMALL_BATCH: usize = 3;
/// Items the `refan` batch claims (one chunk: the sweep's CI time).
const REFAN_BATCH: usize = 2;
/// The item of the two-step `solo` job.
const SOLO_ITEM: &str = "solo-0";
/// The item the `doomed` job claims before failing for good.
const DOOMED_ITEM: &str = "doomed-0";
/// The item the second plain action claims and completes without a job.
const FREE_ITEM: &str = "free-0";
/// The pipelines the producer starts one job of.
const PIPELINES: [&str; 5] = ["sweep", "solo", "doomed", "cancel", "refan"];
/// Worklist rows per chunk action.
const CHUNK: u32 = 2;
/// Unique keys of the plain actions the workload enqueues.
pub(super) const PLAIN: [&str; 2] = ["plain-a", "plain-b"];
/// The hook of the plain actions.
pub(super) const PLAIN_HOOK: &str = "sweep.plain";
/// The operator's cancel of the `cancel` batch, an action of its own.
const CANCEL_HOOK: &str = "sweep.cancel";
/// The ledger namespace and claim scope of the workload.
pub(super) const NS: &str = "sweep";
pub(super) const SCOPE: &str = "shared:sweep";

/// What the workload's operator did during one sweep point, shared by the runtimes of that
/// point (a crash point restarts the runtime).
#[derive(Default)]
pub struct Operator {
    /// When the `cancel` batch's cancel committed (the clock moves one second on either side
    /// of it, so everything before has an earlier time and everything after a later one).
    pub cancelled_at: Mutex<Option<DateTime<Utc>>>,
    /// Whether the operator's cancel of the running `refan` fan-out step was planned already.
    refan_cancel_planned: AtomicBool,
    /// Whether the `refan` fan-out step was retried by hand already.
    refan_retried: AtomicBool,
}

/// A completion handler that writes the tracked-items ledger and appends a row to
/// `sweep_ledger`, a table without a unique constraint, in the claim's own transaction: a
/// duplicate side effect is counted, not hidden.
struct SweepLedger;

pub(super) const LEDGER_DDL: &str = "CREATE TABLE sweep_ledger (item_id VARCHAR(64) NOT NULL, \
                          token VARCHAR(128) NOT NULL, job_id BIGINT)";

#[async_trait]
impl CompletionHandler for SweepLedger {
    async fn complete(
        &self,
        tx: CompletionTx<'_>,
        ctx: &CompletionContext,
    ) -> dockhand::claims::CompletionResult {
        let item = ctx.identity.item_id.as_str();
        let token = ctx.token.as_str();
        let err = |e: sqlx::Error| e.to_string();
        let tx = match tx {
            CompletionTx::Sqlite(c) => {
                sqlx::query("INSERT INTO sweep_ledger (item_id, token, job_id) VALUES (?, ?, ?)")
                    .bind(item)
                    .bind(token)
                    .bind(ctx.job_id)
                    .execute(&mut *c)
                    .await
                    .map_err(err)?;
                CompletionTx::Sqlite(c)
            }
            CompletionTx::Postgres(c) => {
                sqlx::query(
                    "INSERT INTO sweep_ledger (item_id, token, job_id) VALUES ($1, $2, $3)",
                )
                .bind(item)
                .bind(token)
                .bind(ctx.job_id)
                .execute(&mut *c)
                .await
                .map_err(err)?;
                CompletionTx::Postgres(c)
            }
            CompletionTx::MySql(c) => {
                sqlx::query("INSERT INTO sweep_ledger (item_id, token, job_id) VALUES (?, ?, ?)")
                    .bind(item)
                    .bind(token)
                    .bind(ctx.job_id)
                    .execute(&mut *c)
                    .await
                    .map_err(err)?;
                CompletionTx::MySql(c)
            }
            _ => return Err("sweep ledger: unknown backend".into()),
        };
        TrackedItems.complete(tx, ctx).await
    }
}

fn ledger_config() -> CompletionConfig {
    CompletionConfig {
        handler: Some("sweep_ledger".into()),
        payload: json!({"namespace": NS, "revision": 1}),
        retain_processed: true,
    }
}

/// A step that claims `n` items named `{prefix}-{i}` (in one `claim_many_in` call) and emits
/// one packet per item carrying its claim.
async fn split(
    ctx: dockhand::StepContext,
    prefix: &str,
    n: usize,
) -> dockhand::jobs::pipeline::StepResult {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let claimed = ctx
        .claim_many_in(SCOPE, "src", &ids, ledger_config())
        .await
        .map_err(HandlerError::retry)?;
    let mut out = Vec::new();
    for (i, d) in claimed.into_iter().enumerate() {
        let d = d.ok_or_else(|| HandlerError::retry("item held"))?;
        out.push(Packet::new(json!({"i": i})).with_claim(d));
    }
    Ok(StepOutput::Packets(out))
}

/// A child step that fails its first attempt (so the batch is still in flight a round later)
/// and succeeds after.
async fn slow_child(ctx: dockhand::StepContext) -> dockhand::jobs::pipeline::StepResult {
    if ctx.attempt <= 1 {
        return Err(HandlerError::retry("first attempt of a slow child"));
    }
    Ok(StepOutput::one(json!({})))
}

fn pipeline() -> Pipeline {
    Pipeline::new("sweep")
        .step("split", |ctx| split(ctx, "item", ITEMS))
        .step("child", |ctx| async move {
            // Item 0 fails its first attempt in its chunk: the chunk writes its retry back
            // (`finish_many`) and a runner runs attempt 2.
            if ctx.input()["i"].as_i64() == Some(0) {
                return slow_child(ctx).await;
            }
            Ok(StepOutput::one(json!({})))
        })
        .chunk_size(CHUNK)
        .children_in_chunk(2)
}

fn solo() -> Pipeline {
    Pipeline::new("solo")
        .step("take", |ctx| async move {
            ctx.claim_in(SCOPE, "src", SOLO_ITEM, ledger_config())
                .await
                .map_err(HandlerError::retry)?
                .ok_or_else(|| HandlerError::retry("item held"))?;
            Ok(StepOutput::one(json!({})))
        })
        .step("done", |_ctx| async { Ok(StepOutput::one(json!({}))) })
}

fn doomed() -> Pipeline {
    Pipeline::new("doomed")
        .step("fail", |ctx| async move {
            ctx.claim_in(SCOPE, "src", DOOMED_ITEM, ledger_config())
                .await
                .map_err(HandlerError::retry)?;
            Err(HandlerError::retry("doomed: fails every attempt"))
        })
        .max_attempts(2)
}

fn cancelled() -> Pipeline {
    Pipeline::new("cancel")
        .step("split", |ctx| split(ctx, "cx", SMALL_BATCH))
        .step("child", slow_child)
        .chunk_size(CHUNK)
}

/// `refan`: the first time its split step runs, the operator's cancel of that step's action
/// is planned right before the next `finish` call, which is the step action's own (one action
/// at a time): the cancel lands after the step's output is written, through the wrapped store
/// (not a call of the sweep's).
fn refan(
    faulty: Arc<FaultyStore>,
    inner: DynStore,
    raw: RawPool,
    clock: TestClock,
    operator: Arc<Operator>,
) -> Pipeline {
    Pipeline::new("refan")
        .step("split", move |ctx| {
            let (faulty, inner, raw, clock, operator) = (
                faulty.clone(),
                inner.clone(),
                raw.clone(),
                clock.clone(),
                operator.clone(),
            );
            async move {
                if !operator.refan_cancel_planned.swap(true, Ordering::SeqCst) {
                    let job = ctx.job_id;
                    let hook: CallHook = Arc::new(move || {
                        let (inner, raw, now) = (inner.clone(), raw.clone(), clock.now());
                        Box::pin(async move {
                            let Ok(running) =
                                step_actions(&inner, job, vec![ActionStatus::Running]).await
                            else {
                                return;
                            };
                            // Behind the store: it refuses an operator's cancel of a step
                            // action now, but databases from before hold such cancels.
                            for a in running {
                                raw.cancel_action(a.id, now).await;
                            }
                        })
                    });
                    faulty.on_call("finish", 1, hook);
                }
                split(ctx, "rf", REFAN_BATCH).await
            }
        })
        .step("child", slow_child)
        .chunk_size(CHUNK)
}

/// The `dockhand.job.step` actions of step 0 of `job` in `statuses`.
async fn step_actions(
    store: &DynStore,
    job: i64,
    statuses: Vec<ActionStatus>,
) -> Result<Vec<dockhand::action::Action>, HandlerError> {
    let all = store
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: Some("dockhand.job.step".into()),
                ..Default::default()
            },
            statuses,
            limit: 1000,
            ..Default::default()
        })
        .await
        .map_err(HandlerError::retry)?;
    Ok(all
        .into_iter()
        .filter(|a| a.args["job"] == job && a.args["step"] == 0)
        .collect())
}

/// Every item the workload claims.
pub(super) fn items() -> Vec<String> {
    let mut v: Vec<String> = (0..ITEMS).map(|i| format!("item-{i}")).collect();
    v.extend((0..SMALL_BATCH).map(|i| format!("cx-{i}")));
    v.extend((0..REFAN_BATCH).map(|i| format!("rf-{i}")));
    v.extend([SOLO_ITEM, DOOMED_ITEM, FREE_ITEM].map(String::from));
    v
}

/// The second plain action's work: a free-standing claim (no job) completed explicitly with
/// the ledger handler; retried while someone holds the item, done once it is processed.
async fn free_claim(store: DynStore, clock: TestClock) -> Result<(), HandlerError> {
    let identity = Identity::new(SCOPE, "src", FREE_ITEM).map_err(HandlerError::fatal)?;
    let req = ClaimItemRequest {
        identity,
        job_id: None,
        ttl: chrono::Duration::minutes(10),
        completion: ledger_config(),
        reprocess: false,
        run: None,
    };
    match store
        .claim_item(&req, clock.now())
        .await
        .map_err(HandlerError::retry)?
    {
        ClaimOutcome::Claimed(d) => {
            let handler: Arc<dyn CompletionHandler> = Arc::new(SweepLedger);
            match store
                .complete_claim(&d, Some(handler), clock.now())
                .await
                .map_err(HandlerError::retry)?
            {
                CompleteOutcome::Completed => Ok(()),
                CompleteOutcome::Lost => Err(HandlerError::retry("claim lost")),
            }
        }
        ClaimOutcome::AlreadyProcessed => Ok(()),
        ClaimOutcome::HeldByOther => Err(HandlerError::retry("item held")),
        ClaimOutcome::JobNotLive { job_id, .. } => Err(HandlerError::fatal(format!(
            "no job owns this claim, yet job {job_id} refused it"
        ))),
    }
}

/// The operator's cancel of the `cancel` batch: the clock moves a second on, the cancel time
/// is recorded once the batch shows it (a cancel whose acknowledgement was lost counts from
/// its first attempt), and the clock moves another second on.
pub(super) async fn cancel_batch(
    store: DynStore,
    clock: TestClock,
    operator: Arc<Operator>,
) -> Result<(), HandlerError> {
    // The library's cancel, as the CLI and the dashboard reach it: from the store alone.
    let rt_jobs = dockhand::Jobs::without_pipelines(store.clone(), Arc::new(clock.clone()));
    let jobs = store
        .list_jobs(&dockhand::jobs::JobFilter {
            pipeline: Some("cancel".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .map_err(HandlerError::retry)?;
    let Some(parent) = jobs.iter().find(|j| j.parent_id.is_none()) else {
        return Ok(());
    };
    clock.advance(chrono::Duration::seconds(1));
    let at = clock.now();
    let result = rt_jobs.cancel(parent.id).await;
    let marked = store
        .batch_state(parent.id)
        .await
        .ok()
        .flatten()
        .is_some_and(|st| st.outcome.is_some() || st.status.is_some_and(|s| s.is_final()));
    let mut recorded = operator
        .cancelled_at
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if recorded.is_none() && (marked || result.is_ok()) {
        *recorded = Some(at);
    }
    drop(recorded);
    clock.advance(chrono::Duration::seconds(1));
    result.map(|_| ()).map_err(HandlerError::retry)
}

/// The operator retries the `refan` fan-out step by hand (once per point), once the step's
/// action was cancelled and the job is still processing.
pub(super) async fn retry_refan_step(db: &TestDb, rt: &Runtime, operator: &Operator) {
    if operator.refan_retried.load(Ordering::SeqCst) {
        return;
    }
    let Some(job) = all_jobs(db)
        .await
        .into_iter()
        .find(|j| j.pipeline == "refan" && j.parent_id.is_none())
    else {
        return;
    };
    if job.status != JobStatus::Processing {
        return;
    }
    let Ok(stopped) = step_actions(
        &db.store,
        job.id,
        vec![ActionStatus::Canceled, ActionStatus::Failed],
    )
    .await
    else {
        return;
    };
    for a in stopped {
        if rt.queue().retry(a.id).await.unwrap_or(false) {
            operator.refan_retried.store(true, Ordering::SeqCst);
        }
    }
}

/// B5 as the sweep checks it: no child of the cancelled `cancel` batch was created, or
/// completed, after the cancel committed.
pub(super) async fn cancel_invariant(db: &TestDb, operator: &Operator) -> Vec<String> {
    let Some(at) = *operator
        .cancelled_at
        .lock()
        .unwrap_or_else(|p| p.into_inner())
    else {
        return Vec::new();
    };
    let jobs = all_jobs(db).await;
    // Only a batch the cancel stopped: one stopped before by a failed chunk enqueue ends
    // `failed/batch_schedule_failed` (B6: that outcome wins) and its active children finish
    // as B3 lets them.
    let Some(parent) = jobs.iter().find(|j| {
        j.pipeline == "cancel" && j.parent_id.is_none() && j.status == JobStatus::Cancelled
    }) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for k in jobs.iter().filter(|k| k.parent_id == Some(parent.id)) {
        if k.created_at > at {
            v.push(format!(
                "child {} of cancelled batch {} created after the cancel",
                k.id, parent.id
            ));
        }
        if k.status == JobStatus::Completed && k.finished_at.is_some_and(|f| f > at) {
            v.push(format!(
                "child {} of cancelled batch {} completed after the cancel",
                k.id, parent.id
            ));
        }
    }
    v
}

fn plain(key: &str) -> ActionSpec {
    ActionSpec::new(PLAIN_HOOK, json!({"key": key})).unique_key(key)
}

fn cancel_action() -> ActionSpec {
    ActionSpec::new(CANCEL_HOOK, json!({}))
        .unique_key("cancel")
        .priority(0)
        .after(chrono::Duration::minutes(1))
}

/// The workload's runtime over the fault-injecting store (one action at a time, so the call
/// sequence is the same on every run).
pub(super) async fn runtime(
    db: &TestDb,
    faulty: &Arc<FaultyStore>,
    operator: &Arc<Operator>,
) -> Runtime {
    let (store, clock) = (faulty.clone() as DynStore, db.clock.clone());
    let rt = db
        .runtime_on(faulty.clone() as DynStore)
        .concurrency(1)
        .pipeline(pipeline())
        .pipeline(solo())
        .pipeline(doomed())
        .pipeline(cancelled())
        .pipeline(refan(
            faulty.clone(),
            db.store.clone(),
            db.raw().await,
            clock.clone(),
            operator.clone(),
        ))
        .completion_handler("sweep_ledger", Arc::new(SweepLedger))
        .handler(PLAIN_HOOK, {
            let (store, clock) = (store.clone(), clock.clone());
            move |ctx| {
                let (store, clock) = (store.clone(), clock.clone());
                async move {
                    match ctx.args["key"] == PLAIN[1] {
                        true => free_claim(store, clock).await,
                        false => Ok(()),
                    }
                }
            }
        });
    rt.handler(CANCEL_HOOK, {
        let operator = operator.clone();
        move |_ctx| cancel_batch(store.clone(), clock.clone(), operator.clone())
    })
    .build()
    .await
    .unwrap()
}

/// The producer: starts a job of each pipeline unless one exists, and enqueues each plain
/// action (and the operator's cancel) unless one with its key exists; a failed call is retried
/// once at once (a job start has no idempotency key here, so it is retried only when no job
/// was stored).
pub(super) async fn produce(db: &TestDb, rt: &Runtime) {
    for p in PIPELINES {
        let exists = |jobs: Vec<dockhand::jobs::Job>| jobs.iter().any(|j| j.pipeline == p);
        if !exists(all_jobs(db).await)
            && rt.jobs().start(p, json!({})).await.is_err()
            && !exists(all_jobs(db).await)
        {
            let _ = rt.jobs().start(p, json!({})).await;
        }
    }
    let existing = actions(db, Some(PLAIN_HOOK), Vec::new()).await;
    for key in PLAIN {
        if existing.iter().any(|a| a.args["key"] == key) {
            continue;
        }
        if rt.queue().enqueue(plain(key)).await.is_err() {
            let _ = rt.queue().enqueue(plain(key)).await;
        }
    }
    if actions(db, Some(CANCEL_HOOK), Vec::new()).await.is_empty()
        && rt.queue().enqueue(cancel_action()).await.is_err()
    {
        let _ = rt.queue().enqueue(cancel_action()).await;
    }
}
