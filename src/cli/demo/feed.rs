//! The demo's feed and pipeline: the bundled feed (`data/feed.jsonl`), its claim scope and
//! completion config, the `feed-import` pipeline with its `claim` and `process` steps, and the
//! count of feed items already processed.

use super::progress::ClaimProgress;
use crate::claims::{ClaimFilter, ClaimStatus, CompletionConfig, Descriptor, Identity, ItemClaim};
use crate::cli::CliError;
use crate::store::DynStore;
use crate::{HandlerError, Packet, Pipeline, StepContext, StepOutput};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// The feed bundled with the crate: one JSON object per line (id, title, url, published).
const FEED: &str = include_str!("../../../data/feed.jsonl");
/// Where the feed comes from, as the summary names it.
pub(super) const FEED_NAME: &str = "data/feed.jsonl";
/// The demo pipeline.
pub(super) const PIPELINE: &str = "feed-import";
/// The claim scope shared by everything that imports this feed.
pub(super) const SCOPE: &str = "shared:feed";
/// The claims' source type.
const SOURCE: &str = "rss";
/// The tracked-items ledger namespace.
pub(super) const NAMESPACE: &str = "feed";
/// Feed items claimed per store call (`StepContext::claim_many_in`: one transaction each).
const CLAIM_CHUNK: usize = 500;
/// Worklist rows turned into children per chunk action.
pub(super) const CHUNK_SIZE: u32 = 100;

/// The feed items, in file order. Each must be an object with a non-empty string `id`.
pub(super) fn feed_items() -> crate::Result<Vec<Value>> {
    FEED.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let bad = |why: String| {
                crate::Error::invalid("feed", format!("{FEED_NAME} line {}: {why}", n + 1))
            };
            let item: Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            match item.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => Ok(item),
                _ => Err(bad("no string `id`".into())),
            }
        })
        .collect()
}

/// How feed claims complete: the tracked-items ledger, namespace `feed`, revision 1.
fn completion() -> CompletionConfig {
    CompletionConfig {
        handler: Some(crate::claims::ledger::TRACKED_ITEMS.into()),
        payload: json!({"namespace": NAMESPACE, "revision": 1}),
        retain_processed: true,
    }
}

/// The `feed-import` pipeline: `claim` (fans out one child per newly claimed item) and
/// `process` (each child counts its title's words).
pub(super) fn feed_pipeline(store: DynStore, progress: Arc<ClaimProgress>) -> Pipeline {
    Pipeline::new(PIPELINE)
        .step("claim", move |ctx: StepContext| {
            let store = Arc::clone(&store);
            let progress = Arc::clone(&progress);
            async move { claim_step(ctx, store, progress).await }
        })
        .step("process", |ctx: StepContext| async move {
            let item = ctx.input().clone();
            let id = item["id"].clone();
            let words = item["title"]
                .as_str()
                .map_or(0, |t| t.split_whitespace().count());
            ctx.mutate_engine_data(move |d| {
                d["item"] = id.clone();
                d["title_words"] = json!(words);
            })
            .await
            .map_err(HandlerError::retry)?;
            Ok(StepOutput::one(
                json!({"id": item["id"], "title_words": words}),
            ))
        })
        .chunk_size(CHUNK_SIZE)
        .children_in_chunk(CHUNK_SIZE as usize)
}

/// The claim step: one packet (with its claim) per feed item this job claimed.
async fn claim_step(
    ctx: StepContext,
    store: DynStore,
    progress: Arc<ClaimProgress>,
) -> crate::jobs::pipeline::StepResult {
    let items = feed_items().map_err(HandlerError::fatal)?;
    progress.reset(items.len() as u64);
    let mut packets = Vec::new();
    for chunk in items.chunks(CLAIM_CHUNK) {
        let ids: Vec<String> = chunk
            .iter()
            .map(|item| item["id"].as_str().unwrap_or_default().to_string())
            .collect();
        let claimed = ctx
            .claim_many_in(SCOPE, SOURCE, &ids, completion())
            .await
            .map_err(HandlerError::retry)?;
        for ((item, id), claimed) in chunk.iter().zip(&ids).zip(claimed) {
            let descriptor = match claimed {
                Some(d) => Some(d),
                None => not_taken(&ctx, &store, &progress, id).await?,
            };
            if let Some(d) = descriptor {
                ClaimProgress::bump(&progress.claimed);
                packets.push(Packet::new(item.clone()).with_claim(d));
            }
            ClaimProgress::bump(&progress.examined);
        }
    }
    // No packets: the job finishes `completed_no_items`. Several: fan-out (one child each).
    Ok(StepOutput::Packets(packets))
}

/// An item the claim did not take: processed already, held by another job, or held by this
/// job since an earlier attempt of this step (then it is adopted, or the parent would complete
/// it unprocessed when it finishes).
async fn not_taken(
    ctx: &StepContext,
    store: &DynStore,
    progress: &ClaimProgress,
    id: &str,
) -> Result<Option<Descriptor>, HandlerError> {
    let identity = Identity::new(SCOPE, SOURCE, id).map_err(HandlerError::fatal)?;
    let state = store
        .get_claim(&identity)
        .await
        .map_err(HandlerError::retry)?;
    Ok(match state {
        Some(c) if c.status == ClaimStatus::Processed => {
            ClaimProgress::bump(&progress.already_processed);
            None
        }
        Some(ItemClaim {
            status: ClaimStatus::Claimed,
            job_id: Some(owner),
            token: Some(token),
            completion: config,
            ..
        }) if owner == ctx.job_id => Some(Descriptor {
            identity,
            token,
            job_id: Some(owner),
            completion: config.unwrap_or_else(completion),
        }),
        _ => {
            ClaimProgress::bump(&progress.held_elsewhere);
            None
        }
    })
}

/// How many feed items have a `processed` claim in the shared scope.
pub(super) async fn processed_feed_items(
    store: &DynStore,
    ids: &HashSet<&str>,
) -> Result<usize, CliError> {
    let claims = store
        .list_claims(&ClaimFilter {
            scope: Some(SCOPE.into()),
            status: Some(ClaimStatus::Processed),
            limit: 10_000_000,
            ..ClaimFilter::default()
        })
        .await?;
    Ok(claims
        .iter()
        .filter(|c| c.identity.source_type == SOURCE && ids.contains(c.identity.item_id.as_str()))
        .count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_feed_parses_with_unique_ids() {
        let items = feed_items().unwrap();
        assert_eq!(items.len(), 3000);
        let ids: HashSet<&str> = items.iter().filter_map(|i| i["id"].as_str()).collect();
        assert_eq!(ids.len(), items.len());
        for i in &items {
            for field in ["title", "url", "published"] {
                assert!(i[field].is_string(), "{field} in {i}");
            }
            Identity::new(SCOPE, SOURCE, i["id"].as_str().unwrap()).unwrap();
        }
        assert!(FEED.len() < 500_000);
    }
}
