//! `dockhand demo`: a feed import with batch fan-out, on a SQLite file that persists between
//! runs, plus the demo hooks `dockhand run` serves.
//!
//! The demo registers the pipeline `feed-import` and starts one job on the feed bundled with
//! the crate (`data/feed.jsonl`, embedded at build time):
//! - step `claim` claims every feed item in the shared scope `shared:feed` (source `rss`) with
//!   the tracked-items completion config; an item processed by an earlier run is skipped. Each
//!   newly claimed item becomes a packet carrying its claim, so the step fans out: every packet
//!   becomes a child job, created in chunks of 100, and the parent finishes from its children;
//! - step `process` (the children) counts the words of the item's title into the child's
//!   engine data. When a child completes, the terminal bridge completes its claim, writing the
//!   item's tracked-items row in the same transaction.
//!
//! Progress bars follow the claim step, the parent (children created of items) and the
//! children (finished of created); the summary reads its counts back from the database and
//! ends with `dockhand check`. The database stays, so a second run finds every item processed
//! and finishes `completed_no_items` at once; `--fresh` deletes it first.
//!
//! Layout: this file holds the entry point ([`run`]), the `--fresh` handling and the
//! orchestration (earlier jobs first, then this run's job); `feed` the bundled feed and the
//! pipeline definition, `progress` the claim counters, bars and polling, `summary` the final
//! report, and `hooks` the demo hooks `dockhand run` serves.

mod feed;
mod hooks;
mod progress;
mod summary;

pub use hooks::{register_demo_hooks, DEMO_HOOKS};

use super::recovery::violations_summary;
use super::{CliError, DemoArgs, Output};
use crate::batch::BatchState;
use crate::jobs::{Job, JobFilter};
use crate::state::JobStatus;
use crate::store::{redact_url, DynStore};
use crate::{Jobs, Runtime};
use feed::{
    feed_items, feed_pipeline, processed_feed_items, CHUNK_SIZE, FEED_NAME, NAMESPACE, PIPELINE,
};
use progress::{wait_for, Bars, ClaimProgress, Deadline};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use summary::{render, Children, EarlierJob, Summary};

/// The database the demo uses when no `--database-url` is given.
pub(crate) const DEMO_DATABASE_URL: &str = "sqlite:dockhand-demo.db";

/// The SQLite file a URL names (`sqlite:PATH`, `sqlite://PATH?…`); `None` for in-memory
/// databases and other backends.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    use std::str::FromStr;
    if !url.starts_with("sqlite:") || url.contains(":memory:") || url.contains("mode=memory") {
        return None;
    }
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    Some(opts.get_filename().to_path_buf())
}

/// Deletes a SQLite database file and its side files.
fn remove_database(path: &Path) -> Result<(), CliError> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = PathBuf::from(name);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(CliError::Failed(format!(
                    "--fresh: cannot delete {}: {e}",
                    file.display()
                )))
            }
        }
    }
    Ok(())
}

/// Where the demo runs.
struct Target {
    url: String,
    file: Option<PathBuf>,
    existed: bool,
}

/// `dockhand demo` on the database at `url`.
pub(crate) async fn run(url: &str, a: &DemoArgs, out: Output) -> Result<(), CliError> {
    let started = Instant::now();
    super::args::non_negative("timeout", a.timeout)?;
    let file = sqlite_file(url);
    if a.fresh {
        match &file {
            Some(path) => remove_database(path)?,
            None => {
                return Err(CliError::Failed(format!(
                    "--fresh deletes a SQLite database file; {} is not one",
                    redact_url(url)
                )))
            }
        }
    }
    let existed = file.as_ref().is_some_and(|p| p.exists());
    let feed = feed_items()?;
    if !out.is_json() {
        let place = match &file {
            Some(p) if existed => format!(
                "{} (existing file: items processed by earlier runs are skipped)",
                p.display()
            ),
            Some(p) => format!("{} (new file)", p.display()),
            None => redact_url(url),
        };
        eprintln!(
            "dockhand demo: pipeline `{PIPELINE}` imports {} items from {FEED_NAME} into {place}",
            feed.len()
        );
    }
    let target = Target {
        url: url.to_string(),
        file,
        existed,
    };
    let store = crate::store::connect(url).await?;
    let result = run_on(&store, &target, &feed, a, out).await;
    store.close().await;
    let mut s = result?;
    s.wall_ms = started.elapsed().as_millis() as u64;
    out.emit(&s, || render(&s))?;
    if !s.violations.is_empty() {
        return Err(CliError::Failed(violations_summary(&s.violations)));
    }
    if !s.parent_status.is_success() {
        return Err(CliError::Failed(format!(
            "the {PIPELINE} job {} ended {}{}",
            s.parent_id,
            s.parent_status,
            s.parent_reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )));
    }
    Ok(())
}

async fn run_on(
    store: &DynStore,
    target: &Target,
    feed: &[Value],
    a: &DemoArgs,
    out: Output,
) -> Result<Summary, CliError> {
    let timeout = super::args::non_negative("timeout", a.timeout)?;
    let ids: HashSet<&str> = feed.iter().filter_map(|i| i["id"].as_str()).collect();
    let progress = Arc::new(ClaimProgress::default());
    let runtime = Runtime::with_store(Arc::clone(store))
        .pipeline(feed_pipeline(Arc::clone(store), Arc::clone(&progress)))
        .concurrency(a.concurrency as usize)
        .poll_interval(Duration::from_millis(20))
        .only_registered_hooks(true)
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .await?;
    let processed_before = processed_feed_items(store, &ids).await?;
    // Parents an interrupted run left behind hold claims on the items they have not processed
    // yet: finish them first, so this run's job finds those items processed, not held.
    let unfinished = store
        .list_jobs(&JobFilter {
            pipeline: Some(PIPELINE.into()),
            statuses: vec![JobStatus::Pending, JobStatus::Processing],
            limit: 100_000,
            offset: 0,
        })
        .await?;
    let mut earlier: Vec<i64> = unfinished
        .iter()
        .filter(|j| j.parent_id.is_none())
        .map(|j| j.id)
        .collect();
    earlier.sort_unstable();
    let jobs = runtime.jobs();
    let bars = Bars::new(out.is_json(), feed.len() as u64);
    let handle = runtime.start().await?;
    let processing = Instant::now();
    let deadline = Deadline {
        at: processing + timeout,
        limit: timeout,
        url: redact_url(&target.url),
    };
    let waited = drive(&jobs, store, &ids, &earlier, &progress, &bars, &deadline).await;
    let processing_ms = processing.elapsed().as_millis() as u64;
    handle.shutdown().await;
    bars.finish(waited.is_ok());
    let (earlier_jobs, processed_mid, parent, state) = waited?;

    let processed_total = processed_feed_items(store, &ids).await?;
    let mut tracked_items_rows = 0;
    for id in &ids {
        if store.tracked_item(NAMESPACE, id).await?.is_some() {
            tracked_items_rows += 1;
        }
    }
    let children = state
        .as_ref()
        .map(|st| Children {
            created: st.children_total,
            completed: st.children_completed,
            failed: st.children_failed,
            skipped: st.children_skipped,
            chunk_size: CHUNK_SIZE,
        })
        .unwrap_or(Children {
            chunk_size: CHUNK_SIZE,
            ..Children::default()
        });
    let claimed_this_run = ClaimProgress::get(&progress.claimed);
    let mode = match (state.is_some(), claimed_this_run) {
        (true, _) => "fan_out",
        (false, 0) => "nothing_new",
        (false, _) => "inline",
    };
    let violations = jobs.check().await?;
    Ok(Summary {
        database: redact_url(&target.url),
        database_file: target.file.as_ref().map(|p| p.display().to_string()),
        fresh: a.fresh,
        database_existed: target.existed,
        pipeline: PIPELINE,
        feed: FEED_NAME,
        feed_items: feed.len(),
        processed_before,
        earlier_jobs,
        processed_by_earlier_jobs: processed_mid.saturating_sub(processed_before),
        claimed_this_run,
        skipped_already_processed: ClaimProgress::get(&progress.already_processed),
        skipped_held_by_other_job: ClaimProgress::get(&progress.held_elsewhere),
        mode,
        newly_processed: processed_total.saturating_sub(processed_before),
        processed_total,
        tracked_items_rows,
        parent_id: parent.id,
        parent_status: parent.status,
        parent_reason: parent.reason.clone(),
        children,
        violations,
        processing_ms,
        wall_ms: 0,
    })
}

/// What [`drive`] hands back: the earlier jobs carried on, the processed count after them,
/// this run's parent and its final batch state.
type Driven = (Vec<EarlierJob>, usize, Job, Option<BatchState>);

/// Finishes the earlier unfinished jobs, then starts this run's job and waits for it.
async fn drive(
    jobs: &Jobs,
    store: &DynStore,
    ids: &HashSet<&str>,
    earlier: &[i64],
    progress: &ClaimProgress,
    bars: &Bars,
    deadline: &Deadline,
) -> Result<Driven, CliError> {
    let mut carried = Vec::new();
    for &id in earlier {
        bars.note(format!(
            "carrying on job {id}, left unfinished by an earlier run"
        ));
        let (job, _) = wait_for(jobs, id, progress, bars, deadline).await?;
        carried.push(EarlierJob {
            id,
            status: job.status,
            reason: job.reason,
        });
    }
    let processed_mid = processed_feed_items(store, ids).await?;
    let parent = jobs
        .start(PIPELINE, json!({"feed": FEED_NAME, "items": ids.len()}))
        .await?;
    let (job, state) = wait_for(jobs, parent, progress, bars, deadline).await?;
    Ok((carried, processed_mid, job, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_finds_the_sqlite_file_only() {
        assert_eq!(
            sqlite_file("sqlite:dockhand-demo.db"),
            Some(PathBuf::from("dockhand-demo.db"))
        );
        assert_eq!(
            sqlite_file("sqlite:///tmp/x.db?mode=rwc"),
            Some(PathBuf::from("/tmp/x.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://u:p@h/db"), None);
    }
}
