//! The chaos run's workload (RELIABILITY.md §2): the handlers and pipelines every worker
//! registers ([`register`]), and the seeded plan of what the producer submits ([`Plan`]).
//!
//! Every side effect is an item claim completed with the [`LEDGER`] completion handler, which
//! appends a row to `chaos_ledger` (no unique key) in the claim's own transaction: a duplicate
//! side effect shows up as two rows. Plain and slow actions claim the free-standing item
//! `plain:<key>` and complete it themselves; the claims pipeline claims its items in a step and
//! the job's terminal transaction completes them; the batch pipeline claims its items in a
//! split step and fans them out in chunks, each child's terminal transaction completing one.

use crate::claims::ledger::TrackedItems;
use crate::claims::{
    ClaimItemRequest, ClaimOutcome, CompleteOutcome, CompletionContext, CompletionHandler,
    CompletionResult, CompletionTx, Identity,
};
use crate::state::ClaimStatus;
use crate::store::chaos::ChaosDb;
use crate::{
    ActionContext, ActionSpec, Clock, CompletionConfig, DynStore, HandlerError, Packet, Pipeline,
    RuntimeBuilder, StepOutput,
};
use async_trait::async_trait;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The hook of plain actions: args `{key, ms, mode}`.
pub const PLAIN_HOOK: &str = "chaos.plain";
/// The hook of slow actions (running past the lease, kept by heartbeats): args `{key, ms}`.
pub const SLOW_HOOK: &str = "chaos.slow";
/// The pipeline whose one step claims the items of its input (`{items: [...]}`).
pub const CLAIMS_PIPELINE: &str = "chaos-claims";
/// The pipeline that claims `{prefix, n}` items and fans them out in chunks of [`CHUNK`].
pub const BATCH_PIPELINE: &str = "chaos-batch";
/// [`BATCH_PIPELINE`] with its children run by their chunk (`Pipeline::children_in_chunk`)
/// and two chunk lanes (`Pipeline::chunk_lanes`): the plan's odd-numbered batches.
pub const IN_CHUNK_PIPELINE: &str = "chaos-batch-in-chunk";

/// The batch pipeline the plan's batch number `b` runs on.
pub fn batch_pipeline_for(b: usize) -> &'static str {
    if b % 2 == 1 {
        IN_CHUNK_PIPELINE
    } else {
        BATCH_PIPELINE
    }
}
/// The claim scope of every item.
pub const SCOPE: &str = "shared:chaos";
/// The source type of every item.
pub const SOURCE: &str = "chaos";
/// The name of the ledger completion handler.
pub const LEDGER: &str = "chaos_ledger";
/// Batch chunk size.
pub const CHUNK: u32 = 100;
/// How long a plain action's free-standing claim lasts before another attempt may take it.
const PLAIN_CLAIM_TTL_SECS: i64 = 5;
/// Attempts of every plain and slow action and of every step: enough to outlast a killed
/// owner's claim TTL, the database faults and a worker killed again and again in a long split
/// step (with the default 3 attempts a 500-item split in a process that crashes every few
/// seconds ends `retry_exhausted`, as designed, but then the run proves nothing about it).
pub const MAX_ATTEMPTS: u32 = 40;

/// The completion handler that writes the ledger row, then the tracked-items ledger.
struct Ledger;

#[async_trait]
impl CompletionHandler for Ledger {
    async fn complete(&self, tx: CompletionTx<'_>, ctx: &CompletionContext) -> CompletionResult {
        let tx =
            ChaosDb::ledger_insert(tx, ctx.identity.item_id.as_str(), ctx.token.as_str()).await?;
        TrackedItems.complete(tx, ctx).await
    }
}

/// The completion config of every chaos claim (the processed claim row is kept, with its
/// token, for the checker).
pub fn ledger_config() -> CompletionConfig {
    CompletionConfig {
        handler: Some(LEDGER.into()),
        payload: json!({"namespace": "chaos", "revision": 1}),
        retain_processed: true,
    }
}

/// The identity of a chaos item.
pub fn identity(item: &str) -> crate::Result<Identity> {
    Identity::new(SCOPE, SOURCE, item)
}

/// Registers the workload's hooks, pipelines and completion handler on a runtime builder.
/// `store` and `clock` serve the free-standing claims of plain and slow actions.
pub fn register(b: RuntimeBuilder, store: DynStore, clock: Arc<dyn Clock>) -> RuntimeBuilder {
    let (s1, c1) = (store.clone(), clock.clone());
    let (s2, c2) = (store.clone(), clock);
    let s3 = store;
    b.completion_handler(LEDGER, Arc::new(Ledger))
        .handler(PLAIN_HOOK, move |ctx| plain(ctx, s1.clone(), c1.clone()))
        .handler(SLOW_HOOK, move |ctx| slow(ctx, s2.clone(), c2.clone()))
        .pipeline(claims_pipeline(s3.clone()))
        .pipeline(batch_pipeline(BATCH_PIPELINE, s3.clone()))
        .pipeline(
            batch_pipeline(IN_CHUNK_PIPELINE, s3)
                .children_in_chunk(4)
                .chunk_lanes(2),
        )
}

fn arg_u64(args: &Value, name: &str) -> u64 {
    args.get(name).and_then(Value::as_u64).unwrap_or(0)
}

fn arg_str<'a>(args: &'a Value, name: &str) -> &'a str {
    args.get(name).and_then(Value::as_str).unwrap_or("")
}

async fn plain(
    ctx: ActionContext,
    store: DynStore,
    clock: Arc<dyn Clock>,
) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(arg_u64(&ctx.args, "ms"))).await;
    match arg_str(&ctx.args, "mode") {
        "fatal" => return Err(HandlerError::fatal("chaos: fatal by design")),
        "retry" if ctx.attempt <= 1 => return Err(HandlerError::retry("chaos: retry by design")),
        "panic" if ctx.attempt <= 1 => panic!("chaos: panic by design"),
        _ => {}
    }
    side_effect(&store, clock.as_ref(), arg_str(&ctx.args, "key")).await
}

async fn slow(
    ctx: ActionContext,
    store: DynStore,
    clock: Arc<dyn Clock>,
) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(arg_u64(&ctx.args, "ms"))).await;
    side_effect(&store, clock.as_ref(), arg_str(&ctx.args, "key")).await
}

/// Claims `plain:<key>` and completes it with the ledger handler; done when already processed,
/// retried while someone else holds it.
async fn side_effect(store: &DynStore, clock: &dyn Clock, key: &str) -> Result<(), HandlerError> {
    let req = ClaimItemRequest {
        identity: identity(&format!("plain:{key}")).map_err(HandlerError::fatal)?,
        job_id: None,
        ttl: chrono::Duration::seconds(PLAIN_CLAIM_TTL_SECS),
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
            let handler: Arc<dyn CompletionHandler> = Arc::new(Ledger);
            match store
                .complete_claim(&d, Some(handler), clock.now())
                .await
                .map_err(HandlerError::retry)?
            {
                CompleteOutcome::Completed => Ok(()),
                CompleteOutcome::Lost => {
                    tracing::warn!(key, "chaos: stale claim completion rejected");
                    Err(HandlerError::retry("claim lost"))
                }
            }
        }
        ClaimOutcome::AlreadyProcessed => Ok(()),
        ClaimOutcome::HeldByOther => Err(HandlerError::retry("item held by another attempt")),
        ClaimOutcome::JobNotLive { job_id, .. } => Err(HandlerError::fatal(format!(
            "free-standing claim refused for job {job_id}"
        ))),
    }
}

/// `None` from a claim: fine when the item is processed already (another job took it),
/// retried while it is held.
async fn held_or_done(store: &DynStore, item: &str) -> Result<(), HandlerError> {
    let claim = store
        .get_claim(&identity(item).map_err(HandlerError::fatal)?)
        .await
        .map_err(HandlerError::retry)?;
    match claim.map(|c| c.status) {
        Some(ClaimStatus::Processed) => Ok(()),
        _ => Err(HandlerError::retry(format!(
            "item {item} held by another job"
        ))),
    }
}

fn claims_pipeline(store: DynStore) -> Pipeline {
    Pipeline::new(CLAIMS_PIPELINE)
        .step("take", move |ctx| {
            let store = store.clone();
            async move {
                let items: Vec<String> = ctx.input()["items"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut claims = Vec::new();
                for item in &items {
                    match ctx
                        .claim_in(SCOPE, SOURCE, item, ledger_config())
                        .await
                        .map_err(HandlerError::retry)?
                    {
                        Some(d) => claims.push(d),
                        None => held_or_done(&store, item).await?,
                    }
                }
                if claims.is_empty() {
                    return Ok(StepOutput::none());
                }
                let mut p = Packet::new(json!({"items": items.len()}));
                for d in claims {
                    p = p.with_claim(d);
                }
                Ok(StepOutput::Packets(vec![p]))
            }
        })
        .step("done", |_ctx| async { Ok(StepOutput::one(json!({}))) })
        .max_attempts(MAX_ATTEMPTS)
}

/// The items of batch `prefix` with `n` items.
pub fn batch_items(prefix: &str, n: u64) -> impl Iterator<Item = String> + '_ {
    (0..n).map(move |i| format!("{prefix}-{i}"))
}

fn batch_pipeline(name: &str, store: DynStore) -> Pipeline {
    Pipeline::new(name)
        .step("split", move |ctx| {
            let store = store.clone();
            async move {
                let prefix = arg_str(ctx.input(), "prefix").to_string();
                let n = arg_u64(ctx.input(), "n");
                let mut out = Vec::new();
                for item in batch_items(&prefix, n) {
                    match ctx
                        .claim_in(SCOPE, SOURCE, &item, ledger_config())
                        .await
                        .map_err(HandlerError::retry)?
                    {
                        Some(d) => out.push(Packet::new(json!({"item": item})).with_claim(d)),
                        None => held_or_done(&store, &item).await?,
                    }
                }
                Ok(StepOutput::Packets(out))
            }
        })
        .step("child", |ctx| async move {
            let ms = fastrand::u64(0..5);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(StepOutput::one(
                json!({"done": ctx.input()["item"].clone()}),
            ))
        })
        .chunk_size(CHUNK)
        .max_attempts(MAX_ATTEMPTS)
}

/// A plain action of the plan.
#[derive(Debug, Clone)]
pub struct PlainAction {
    /// Its unique key (also its item: `plain:<key>`).
    pub key: String,
    /// Handler time.
    pub ms: u64,
    /// `ok`, `retry` (fails its first attempt), `fatal` (fails for good) or `panic` (panics
    /// on its first attempt); `slow` for the slow hook.
    pub mode: &'static str,
}

impl PlainAction {
    /// The action to enqueue.
    pub fn spec(&self) -> ActionSpec {
        let hook = if self.mode == "slow" {
            SLOW_HOOK
        } else {
            PLAIN_HOOK
        };
        ActionSpec::new(
            hook,
            json!({"key": self.key, "ms": self.ms, "mode": self.mode}),
        )
        .unique_key(self.key.clone())
        .max_attempts(MAX_ATTEMPTS)
    }

    /// Whether it must end `failed` (otherwise `complete`, with its side effect once).
    pub fn fails_by_design(&self) -> bool {
        self.mode == "fatal"
    }
}

/// What the producer submits, in order, all drawn from one seed.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Plain and slow actions.
    pub actions: Vec<PlainAction>,
    /// Claims-pipeline jobs: the items each requests (some requested by two jobs).
    pub claim_jobs: Vec<Vec<String>>,
    /// Batch jobs: (prefix, items).
    pub batches: Vec<(String, u64)>,
}

/// Sizes of a plan.
#[derive(Debug, Clone, Copy)]
pub struct PlanSize {
    /// Plain actions (slow ones included).
    pub actions: usize,
    /// Claims-pipeline jobs.
    pub claim_jobs: usize,
    /// Batch jobs.
    pub batches: usize,
    /// Items per batch: a range.
    pub batch_items: (u64, u64),
    /// Slow actions' handler time in ms: a range (above the lease).
    pub slow_ms: (u64, u64),
}

impl Plan {
    /// The plan for `seed`: 60 % plain (85 % ok, 6 % retry, 4 % fatal, 4 % panic, 1 % slow),
    /// claim jobs (one in five requesting an item another job also requests, one in four items
    /// with a 200-character id sharing its prefix with the others), and batches.
    pub fn new(seed: u64, size: PlanSize) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut plan = Plan::default();
        for i in 0..size.actions {
            let r = rng.u32(0..100);
            let (mode, ms) = match r {
                0..=84 => ("ok", rng.u64(0..=20)),
                85..=90 => ("retry", rng.u64(0..=20)),
                91..=94 => ("fatal", rng.u64(0..=20)),
                95..=98 => ("panic", rng.u64(0..=20)),
                _ => ("slow", rng.u64(size.slow_ms.0..=size.slow_ms.1)),
            };
            plan.actions.push(PlainAction {
                key: format!("p{seed}-{i}"),
                ms,
                mode,
            });
        }
        let long = "l".repeat(200);
        let mut items: Vec<String> = Vec::new();
        for j in 0..size.claim_jobs {
            let n = rng.usize(1..=3);
            let mut mine = Vec::new();
            for k in 0..n {
                if !items.is_empty() && rng.u32(0..5) == 0 {
                    mine.push(items[rng.usize(0..items.len())].clone());
                    continue;
                }
                let id = match rng.u32(0..4) {
                    0 => format!("{long}{j}-{k}"),
                    _ => format!("c{j}-{k}"),
                };
                items.push(id.clone());
                mine.push(id);
            }
            mine.sort();
            mine.dedup();
            plan.claim_jobs.push(mine);
        }
        for b in 0..size.batches {
            let n = rng.u64(size.batch_items.0..=size.batch_items.1);
            plan.batches.push((format!("b{b}"), n));
        }
        plan
    }

    /// Every item a complete run processes: plain/slow side effects (not the fatal ones),
    /// claim-job items and batch items.
    pub fn expected_items(&self) -> std::collections::BTreeSet<String> {
        let mut set = std::collections::BTreeSet::new();
        for a in self.actions.iter().filter(|a| !a.fails_by_design()) {
            set.insert(format!("plain:{}", a.key));
        }
        for job in &self.claim_jobs {
            set.extend(job.iter().cloned());
        }
        for (prefix, n) in &self.batches {
            set.extend(batch_items(prefix, *n));
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size() -> PlanSize {
        PlanSize {
            actions: 500,
            claim_jobs: 40,
            batches: 2,
            batch_items: (10, 20),
            slow_ms: (2500, 4000),
        }
    }

    #[test]
    fn one_seed_one_plan() {
        let (a, b) = (Plan::new(7, size()), Plan::new(7, size()));
        let keys = |p: &Plan| {
            p.actions
                .iter()
                .map(|a| (a.key.clone(), a.mode, a.ms))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&a), keys(&b));
        assert_eq!(a.claim_jobs, b.claim_jobs);
        assert_eq!(a.batches, b.batches);
        assert_ne!(
            keys(&a),
            keys(&Plan::new(8, size())),
            "another seed, another plan"
        );
    }

    #[test]
    fn the_plan_has_every_kind_of_work() {
        let p = Plan::new(3, size());
        for mode in ["ok", "retry", "fatal", "panic", "slow"] {
            assert!(p.actions.iter().any(|a| a.mode == mode), "no {mode} action");
        }
        let items: Vec<&String> = p.claim_jobs.iter().flatten().collect();
        assert!(items.iter().any(|i| i.len() > 191), "long ids");
        let unique: std::collections::BTreeSet<_> = items.iter().collect();
        assert!(
            unique.len() < items.len(),
            "some items are requested by two jobs"
        );
        let expected = p.expected_items();
        let fatal = p.actions.iter().filter(|a| a.fails_by_design()).count();
        let batch: u64 = p.batches.iter().map(|(_, n)| n).sum();
        assert_eq!(
            expected.len(),
            p.actions.len() - fatal + unique.len() + batch as usize,
            "plain (not fatal) + distinct claim items + batch items"
        );
        assert_eq!(p.actions[0].spec().max_attempts, MAX_ATTEMPTS);
    }
}
