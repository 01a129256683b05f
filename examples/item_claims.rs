//! Two pipelines share one feed through item claims.
//!
//! `newsletter` and `archive` both start on the same six-item feed at once. Their first step
//! claims each item in the shared scope `shared:feed` (newsletter from the newest end, archive
//! from the oldest); an item the other pipeline holds (or has processed) is simply skipped, so
//! every item is handled by exactly one of them, whoever gets there first. The second
//! step "processes" what its job claimed and records the ids in the job's engine data. When a
//! job completes, the terminal bridge completes its claims with the shipped tracked-items
//! handler, which writes one ledger row per item (namespace `feed`) in the same transaction.
//!
//! Run with `cargo run --example item_claims`. Add `-- --keep` to keep the SQLite file and look
//! at it with the CLI, e.g. `cargo run -- --database-url sqlite:PATH jobs list` or
//! `claims list --scope shared:feed` (the path is printed).

use dockhand::claims::ClaimFilter;
use dockhand::{
    CompletionConfig, HandlerError, JobStatus, Packet, Pipeline, Runtime, StepContext, StepOutput,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// The scope both pipelines claim in: an item claimed by one is not taken by the other.
const SCOPE: &str = "shared:feed";

/// The feed: (item id, title).
const FEED: [(&str, &str); 6] = [
    ("post-101", "Release 1.4 is out"),
    ("post-102", "Migrating to the new scheduler"),
    ("post-103", "Item claims explained"),
    ("post-104", "A week of on-call"),
    ("post-105", "Benchmarks, revisited"),
    ("post-106", "Call for talks"),
];

type BoxError = Box<dyn std::error::Error>;

/// A two-step pipeline: `claim` takes the feed items nobody else has (walking the feed from the
/// newest or the oldest end), `process` handles them.
fn feed_pipeline(name: &str, newest_first: bool) -> Pipeline {
    Pipeline::new(name)
        .step("claim", move |ctx: StepContext| async move {
            let mut items = ctx.input()["items"].as_array().cloned().unwrap_or_default();
            if newest_first {
                items.reverse();
            }
            let mut claimed = Vec::new();
            for item in items {
                let id = item["id"].as_str().ok_or_else(|| {
                    HandlerError::fatal(format!("feed item without an id: {item}"))
                })?;
                // Pretend to look at the item first; the jitter lets the pipelines interleave.
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..30))).await;
                let completion = CompletionConfig {
                    handler: Some("dockhand.tracked_items".into()),
                    payload: json!({"namespace": "feed"}),
                    retain_processed: true,
                };
                let descriptor = ctx
                    .claim_in(SCOPE, "rss", id, completion)
                    .await
                    .map_err(HandlerError::retry)?;
                match descriptor {
                    // The job owns the claim; the terminal bridge completes it (running the
                    // tracked-items handler) when the job completes, or releases it on failure.
                    Some(d) => claimed.push(Packet::new(item.clone()).with_claim(d)),
                    // The other pipeline holds or has processed this item.
                    None => println!(
                        "  {:<10} skips     {id}: already taken by the other pipeline",
                        ctx.pipeline
                    ),
                }
            }
            // No packets: the job finishes `completed_no_items`.
            Ok(StepOutput::Packets(claimed))
        })
        // Several packets continue on this job (batch fan-out is not built yet).
        .inline()
        .step("process", |ctx: StepContext| async move {
            let ids: Vec<String> = ctx
                .inputs
                .iter()
                .filter_map(|p| p["id"].as_str().map(str::to_string))
                .collect();
            for p in &ctx.inputs {
                println!(
                    "  {:<10} processes {} ({})",
                    ctx.pipeline, p["id"], p["title"]
                );
            }
            let recorded = json!(ids);
            ctx.mutate_engine_data(move |d| d["processed"] = recorded.clone())
                .await
                .map_err(HandlerError::retry)?;
            Ok(StepOutput::one(json!({"processed": ids.len()})))
        })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let keep = std::env::args().skip(1).any(|a| a == "--keep");
    let path = std::env::temp_dir().join(format!("dockhand-item-claims-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let result = run(&url).await;
    if keep {
        println!("\ndatabase kept: {url}");
        println!("  try: cargo run -- --database-url {url} jobs list");
    } else {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    result
}

async fn run(url: &str) -> Result<(), BoxError> {
    let runtime = Runtime::builder(url)
        .pipeline(feed_pipeline("newsletter", true))
        .pipeline(feed_pipeline("archive", false))
        .poll_interval(Duration::from_millis(20))
        .build()
        .await?;
    let handle = runtime.start().await?;
    let result = start_and_report(&runtime).await;
    handle.shutdown().await;
    runtime.store().close().await;
    result
}

async fn start_and_report(runtime: &Runtime) -> Result<(), BoxError> {
    let jobs = runtime.jobs();
    let feed: Vec<Value> = FEED
        .iter()
        .map(|(id, title)| json!({"id": id, "title": title}))
        .collect();
    let input = json!({"items": feed});
    println!(
        "starting `newsletter` and `archive` on the same {}-item feed",
        FEED.len()
    );
    let (a, b) = tokio::join!(
        jobs.start("newsletter", input.clone()),
        jobs.start("archive", input)
    );
    let ids = [a?, b?];

    // Wait (bounded) until both jobs are final.
    let mut finals = Vec::new();
    for _ in 0..250 {
        finals.clear();
        for id in ids {
            finals.push(jobs.get(id).await?);
        }
        if finals.iter().all(|j| j.status.is_final()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(j) = finals.iter().find(|j| !j.status.is_final()) {
        return Err(format!(
            "job {} ({}) is still {} after 5s",
            j.id, j.pipeline, j.status
        )
        .into());
    }

    // Which job processed which item, from each job's engine data.
    println!("\njobs:");
    let mut processed_by: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for job in &finals {
        let data = jobs.engine_data(job.id).await?;
        let items: Vec<String> = data["processed"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "  job {} {:<10} {:<18} processed [{}]",
            job.id,
            job.pipeline,
            job.status.to_string(),
            items.join(", ")
        );
        for item in items {
            processed_by
                .entry(item)
                .or_default()
                .push((job.id, job.pipeline.clone()));
        }
    }

    // The claim rows and the tracked-items ledger, per item.
    let claims = runtime
        .store()
        .list_claims(&ClaimFilter {
            scope: Some(SCOPE.into()),
            ..ClaimFilter::default()
        })
        .await?;
    println!("\nitems:");
    println!(
        "  {:<9} {:<31} {:<11} {:<10} {:<9} tracked (namespace feed)",
        "ITEM", "TITLE", "PIPELINE", "CLAIM", "CLAIM JOB"
    );
    let mut problems = Vec::new();
    for (id, title) in FEED {
        let by = processed_by.get(id).cloned().unwrap_or_default();
        let claim = claims.iter().find(|c| c.identity.item_id == id);
        let tracked = runtime.store().tracked_item("feed", id).await?;
        let pipeline = match by.as_slice() {
            [(_, p)] => p.clone(),
            [] => "(none)".into(),
            _ => "(several)".into(),
        };
        let claim_job = claim.and_then(|c| c.job_id);
        println!(
            "  {:<9} {:<31} {:<11} {:<10} {:<9} {}",
            id,
            title,
            pipeline,
            claim.map_or("-".into(), |c| c.status.to_string()),
            claim_job.map_or("-".into(), |j| j.to_string()),
            tracked.as_ref().map_or("(no row)".into(), |t| format!(
                "revision {}, last job {}",
                t.revision,
                t.last_job.map_or("-".into(), |j| j.to_string())
            )),
        );
        let [(job, _)] = by.as_slice() else {
            problems.push(format!("{id} was processed {} times", by.len()));
            continue;
        };
        if claim_job != Some(*job)
            || claim.map(|c| c.status.to_string()).as_deref() != Some("processed")
        {
            problems.push(format!(
                "{id}: the claim row is not `processed` by job {job}"
            ));
        }
        if tracked.and_then(|t| t.last_job) != Some(*job) {
            problems.push(format!(
                "{id}: the tracked-items row does not name job {job}"
            ));
        }
    }
    let success = finals.iter().all(|j| j.status.is_success());
    if !success || !problems.is_empty() {
        for j in finals.iter().filter(|j| !j.status.is_success()) {
            problems.push(format!("job {} ended {}", j.id, j.status));
        }
        return Err(format!("unexpected outcome: {}", problems.join("; ")).into());
    }
    let no_items = finals
        .iter()
        .filter(|j| j.status == JobStatus::CompletedNoItems)
        .count();
    println!(
        "\nevery item was processed exactly once across the two pipelines{}",
        if no_items > 0 {
            " (one pipeline found nothing left to claim)"
        } else {
            ""
        }
    );
    Ok(())
}
