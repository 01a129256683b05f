//! W4 (DESIGN §10): a batch pipeline over N items, through the public API only.
//!
//! The pipeline `bench.w4` has two steps: `claim` claims every item (`item-<i>`, source
//! `bench`) in the shared scope [`SCOPE`], [`CLAIM_CHUNK`] per store call, and emits one packet per item carrying its claim, so
//! the job fans out in chunks of [`CHUNK`]; `process` (the children) is a no-op that counts
//! its run, and each child finishes through the terminal bridge, which completes its claim.
//! The children run on the runner of the chunk that creates them
//! ([`crate::Pipeline::children_in_chunk`], all of a chunk at once); on PostgreSQL and
//! MySQL/MariaDB [`SERVER_LANES`] chunk actions run side by side
//! ([`crate::Pipeline::chunk_lanes`]), on SQLite one.
//! The timer runs from [`crate::Jobs::start`] (runtime already started and idle) until the
//! parent is final. Afterwards the parent must be `completed` with N completed children, N
//! claims `processed`, and `check` must find no violation; otherwise the bench fails.

use super::db::Fresh;
use super::{BenchArgs, BenchBackend, Measurement};
use crate::claims::{ClaimFilter, ClaimStatus};
use crate::cli::CliError;
use crate::state::JobStatus;
use crate::{HandlerError, Packet, Pipeline, Runtime, StepContext, StepOutput};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The pipeline's name.
const PIPELINE: &str = "bench.w4";
/// The shared claim scope of the items.
const SCOPE: &str = "shared:bench";
/// The claims' source type.
const SOURCE: &str = "bench";
/// Items claimed per store call (`StepContext::claim_many_in`: one transaction each).
const CLAIM_CHUNK: usize = 500;
/// Worklist rows turned into children per chunk action.
const CHUNK: u32 = 100;
/// Chunk actions in flight at once ([`crate::Pipeline::chunk_lanes`]) on PostgreSQL and
/// MySQL/MariaDB, whose W4 gained 25-35 % / 10-15 % from four lanes over one (session 16);
/// SQLite keeps one (its single writer is the bound: no gain measured).
const SERVER_LANES: u32 = 4;
/// The runtime's idle poll interval (as W2).
const POLL: Duration = Duration::from_millis(10);
/// How often the parent's status is read while waiting (each read is a store call that
/// competes with the pipeline; 2 ms made 30,000 of them in a slow PostgreSQL run).
const WAIT_POLL: Duration = Duration::from_millis(10);

/// Runs W4 on `fresh` into `m`.
pub(super) async fn run(
    fresh: &Fresh,
    a: &BenchArgs,
    mut m: Measurement,
) -> Result<Measurement, CliError> {
    let n = a.n;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let counted = Arc::clone(&runs);
    let pipeline = Pipeline::new(PIPELINE)
        .step("claim", move |ctx: StepContext| async move {
            let mut packets = Vec::with_capacity(n as usize);
            let items: Vec<u32> = (0..n).collect();
            for chunk in items.chunks(CLAIM_CHUNK) {
                let ids = chunk.iter().map(|i| format!("item-{i}"));
                let claimed = ctx
                    .claim_many_in(SCOPE, SOURCE, ids, Default::default())
                    .await
                    .map_err(HandlerError::retry)?;
                for (&i, d) in chunk.iter().zip(claimed) {
                    if let Some(d) = d {
                        packets.push(Packet::new(json!({ "n": i })).with_claim(d));
                    }
                }
            }
            Ok(StepOutput::Packets(packets))
        })
        .step("process", move |ctx: StepContext| {
            let runs = Arc::clone(&counted);
            async move {
                let i = ctx.input()["n"]
                    .as_u64()
                    .ok_or_else(|| HandlerError::fatal("input without `n`"))?;
                if let Some(r) = runs.get(i as usize) {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                Ok(StepOutput::one(Value::Null))
            }
        })
        .chunk_size(CHUNK)
        .children_in_chunk(CHUNK as usize)
        .chunk_lanes(if a.backend == BenchBackend::Sqlite {
            1
        } else {
            SERVER_LANES
        });
    let runtime = Runtime::with_store(Arc::clone(&fresh.store))
        .migrate(false)
        .pipeline(pipeline)
        .concurrency(a.concurrency as usize)
        .poll_interval(POLL)
        .build()
        .await?;
    let jobs = runtime.jobs();
    let handle = runtime.start().await?;
    let result = async {
        let start = Instant::now();
        let parent = jobs.start(PIPELINE, json!({})).await?;
        let job = loop {
            let job = jobs.get(parent).await?;
            if job.status.is_final() {
                break job;
            }
            tokio::time::sleep(WAIT_POLL).await;
        };
        Ok::<_, CliError>((start.elapsed(), parent, job))
    }
    .await;
    handle.shutdown().await;
    let (elapsed, parent, job) = result?;
    m.secs = elapsed.as_secs_f64();
    m.items_per_sec = Some(f64::from(n) / m.secs.max(1e-9));
    m.concurrency = Some(a.concurrency);
    m.batch = Some(CHUNK.min(n));
    m.dup = Some(runs.iter().filter(|r| r.load(Ordering::SeqCst) > 1).count() as u64);
    let fail = |what: String| Err(CliError::Failed(format!("W4: {what}")));
    if job.status != JobStatus::Completed {
        return fail(format!(
            "parent job {parent} finished {} ({}), not completed",
            job.status,
            job.reason.as_deref().unwrap_or("no reason")
        ));
    }
    let st = jobs.batch_state(parent).await?.unwrap_or_default();
    // One item is no fan-out: the job runs it inline and has no children.
    if n > 1 && st.children_completed != i64::from(n) {
        return fail(format!(
            "parent job {parent} has {} completed children of {n}",
            st.children_completed
        ));
    }
    let processed = fresh
        .store
        .list_claims(&ClaimFilter {
            scope: Some(SCOPE.into()),
            status: Some(ClaimStatus::Processed),
            limit: i64::from(n) + 1,
            ..ClaimFilter::default()
        })
        .await?
        .len();
    if processed != n as usize {
        return fail(format!("{processed} of {n} claims are processed"));
    }
    let violations = jobs.check().await?;
    if let Some(v) = violations.first() {
        return fail(format!(
            "check found {} violation(s), first: {} {}: {}",
            violations.len(),
            v.invariant,
            v.subject,
            v.detail
        ));
    }
    Ok(m)
}
