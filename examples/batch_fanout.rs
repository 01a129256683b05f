//! Batch fan-out: one job claims a feed and turns every new item into a child job.
//!
//! The pipeline `feed-import` has two steps. `claim` claims each item of a small in-code feed
//! (250 items) in the shared scope `shared:feed`, with the tracked-items completion config, and
//! returns one packet per newly claimed item carrying its claim. Because the step returns
//! several packets and is not `.inline()`, the job fans out: each packet becomes a child job
//! that starts at the next step, created in chunks of 50 from a durable worklist. `process`
//! runs in each child: it counts the words of the item's title into the child's engine data.
//! When a child completes, the terminal bridge completes its claim, writing the item's
//! tracked-items row in the same transaction; the parent finishes from its children's counters.
//!
//! The same job is then started a second time: every item is processed already, so the claim
//! step returns nothing and the job finishes `completed_no_items` without children.
//!
//! Run with `cargo run --example batch_fanout` (the temporary SQLite file is deleted at the
//! end). `dockhand demo` runs the same pipeline on a 3000-item feed.

use dockhand::batch::BatchState;
use dockhand::claims::{ClaimFilter, ClaimStatus};
use dockhand::{
    CompletionConfig, HandlerError, Jobs, Packet, Pipeline, Runtime, StepContext, StepOutput,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The scope every importer of this feed claims in.
const SCOPE: &str = "shared:feed";
/// Feed items.
const ITEMS: usize = 250;
/// Children created per chunk action.
const CHUNK_SIZE: u32 = 50;

type BoxError = Box<dyn std::error::Error>;

/// A small synthetic feed: `post-001` … `post-250`.
fn feed() -> Vec<Value> {
    const TOPICS: [&str; 6] = ["queues", "leases", "retries", "batches", "claims", "cron"];
    (1..=ITEMS)
        .map(|i| {
            let topic = TOPICS[i % TOPICS.len()];
            json!({
                "id": format!("post-{i:03}"),
                "title": format!("Notes on {topic}, part {i}"),
                "url": format!("https://example.com/p/{i:03}-{topic}"),
                "published": format!("2026-01-{:02}T09:00:00Z", 1 + i % 28),
            })
        })
        .collect()
}

fn pipeline() -> Pipeline {
    Pipeline::new("feed-import")
        .step("claim", |ctx: StepContext| async move {
            let completion = CompletionConfig {
                handler: Some("dockhand.tracked_items".into()),
                payload: json!({"namespace": "feed", "revision": 1}),
                retain_processed: true,
            };
            let mut packets = Vec::new();
            for item in feed() {
                let id = item["id"].as_str().unwrap_or_default().to_string();
                // None: processed already (or another job holds it): skip it.
                if let Some(claim) = ctx
                    .claim_in(SCOPE, "rss", &id, completion.clone())
                    .await
                    .map_err(HandlerError::retry)?
                {
                    packets.push(Packet::new(item).with_claim(claim));
                }
            }
            // Several packets: fan-out, one child each. None: `completed_no_items`.
            Ok(StepOutput::Packets(packets))
        })
        .step("process", |ctx: StepContext| async move {
            let item = ctx.input().clone();
            let words = item["title"]
                .as_str()
                .map_or(0, |t| t.split_whitespace().count());
            ctx.mutate_engine_data(move |d| d["title_words"] = json!(words))
                .await
                .map_err(HandlerError::retry)?;
            Ok(StepOutput::one(
                json!({"id": item["id"], "title_words": words}),
            ))
        })
        .chunk_size(CHUNK_SIZE)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let path =
        std::env::temp_dir().join(format!("dockhand-batch-fanout-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let result = run(&url).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

async fn run(url: &str) -> Result<(), BoxError> {
    let runtime = Runtime::builder(url)
        .pipeline(pipeline())
        .concurrency(8)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await?;
    let handle = runtime.start().await?;
    let result = import_twice(&runtime).await;
    handle.shutdown().await;
    runtime.store().close().await;
    result
}

async fn import_twice(runtime: &Runtime) -> Result<(), BoxError> {
    let jobs = runtime.jobs();
    for run in 1..=2 {
        let started = Instant::now();
        let parent = jobs.start("feed-import", json!({"items": ITEMS})).await?;
        println!("run {run}: job {parent} imports a {ITEMS}-item feed (chunks of {CHUNK_SIZE})");
        let state = wait(&jobs, parent).await?;
        let job = jobs.get(parent).await?;
        let processed = runtime
            .store()
            .list_claims(&ClaimFilter {
                scope: Some(SCOPE.into()),
                status: Some(ClaimStatus::Processed),
                limit: 10_000,
                ..ClaimFilter::default()
            })
            .await?
            .len();
        let mut tracked = 0;
        for item in feed() {
            let id = item["id"].as_str().unwrap_or_default();
            if runtime.store().tracked_item("feed", id).await?.is_some() {
                tracked += 1;
            }
        }
        let children = state.map_or_else(
            || "no children".to_string(),
            |st| {
                format!(
                    "{} children: {} completed, {} failed",
                    st.children_total, st.children_completed, st.children_failed
                )
            },
        );
        println!(
            "  job {parent} {} in {:.1?}: {children}; {processed} items processed, \
             {tracked} tracked-items rows",
            job.status,
            started.elapsed()
        );
        if !job.status.is_success() {
            return Err(format!("job {parent} ended {}", job.status).into());
        }
    }
    let violations = jobs.check().await?;
    if violations.is_empty() {
        println!("check: all invariants hold");
        Ok(())
    } else {
        for v in &violations {
            println!("  {} {}: {}", v.invariant, v.subject, v.detail);
        }
        Err(format!("check found {} violation(s)", violations.len()).into())
    }
}

/// Polls the parent until it is final, printing its batch progress when it changes; bounded.
async fn wait(jobs: &Jobs, parent: i64) -> Result<Option<BatchState>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        let job = jobs.get(parent).await?;
        let state = jobs.batch_state(parent).await?;
        if let Some(st) = &state {
            let line = format!(
                "  children created {:>3}/{}, finished {:>3}/{}",
                st.children_total, st.items_total, st.children_terminal, st.children_total
            );
            if line != last {
                println!("{line}");
                last = line;
            }
        }
        if job.status.is_final() {
            return Ok(state);
        }
        if Instant::now() > deadline {
            return Err(format!("job {parent} is still {} after 30s", job.status).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
