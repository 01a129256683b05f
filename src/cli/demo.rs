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

use super::args::{format_approx, format_exact};
use super::recovery::{violations_summary, violations_text};
use super::table::key_values;
use super::{CliError, DemoArgs, Output};
use crate::batch::{BatchState, Violation};
use crate::claims::{ClaimFilter, ClaimStatus, CompletionConfig, Descriptor, Identity, ItemClaim};
use crate::jobs::{Job, JobFilter};
use crate::state::JobStatus;
use crate::store::{redact_url, DynStore};
use crate::{
    HandlerError, Jobs, Packet, Pipeline, Runtime, RuntimeBuilder, StepContext, StepOutput,
};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The hooks [`register_demo_hooks`] installs (served by `dockhand run`).
pub const DEMO_HOOKS: [&str; 4] = ["demo.noop", "demo.sleep", "demo.flaky", "demo.tick"];

/// Registers the demo handlers `dockhand run` serves: `demo.noop` (returns at once),
/// `demo.sleep` (sleeps `args.ms` milliseconds, default 5, at most 1000), `demo.flaky` (fails
/// with a retryable error while `ctx.attempt <= args.fail_times`, default 1, then succeeds) and
/// `demo.tick` (for schedules).
pub fn register_demo_hooks(builder: RuntimeBuilder) -> RuntimeBuilder {
    builder
        .handler("demo.noop", |_ctx| async { Ok::<(), HandlerError>(()) })
        .handler("demo.sleep", |ctx| async move {
            let ms = ctx.args.get("ms").and_then(Value::as_u64).unwrap_or(5);
            tokio::time::sleep(Duration::from_millis(ms.min(1_000))).await;
            Ok::<(), HandlerError>(())
        })
        .handler("demo.flaky", |ctx| async move {
            let fail_times = ctx
                .args
                .get("fail_times")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            if i64::from(ctx.attempt) <= fail_times {
                return Err(HandlerError::retry(format!(
                    "demo.flaky: simulated failure on attempt {} of {}",
                    ctx.attempt, ctx.max_attempts
                )));
            }
            Ok(())
        })
        .handler("demo.tick", |ctx| async move {
            tracing::info!(action_id = ctx.action_id, due = %ctx.scheduled_at, "demo.tick");
            Ok::<(), HandlerError>(())
        })
}

/// The database the demo uses when no `--database-url` is given.
pub(crate) const DEMO_DATABASE_URL: &str = "sqlite:dockhand-demo.db";
/// The feed bundled with the crate: one JSON object per line (id, title, url, published).
const FEED: &str = include_str!("../../data/feed.jsonl");
/// Where the feed comes from, as the summary names it.
const FEED_NAME: &str = "data/feed.jsonl";
/// The demo pipeline.
pub(crate) const PIPELINE: &str = "feed-import";
/// The claim scope shared by everything that imports this feed.
const SCOPE: &str = "shared:feed";
/// The claims' source type.
const SOURCE: &str = "rss";
/// The tracked-items ledger namespace.
const NAMESPACE: &str = "feed";
/// Worklist rows turned into children per chunk action.
const CHUNK_SIZE: u32 = 100;
/// How often the progress bars are refreshed from the database.
const POLL: Duration = Duration::from_millis(100);

/// The feed items, in file order. Each must be an object with a non-empty string `id`.
fn feed_items() -> crate::Result<Vec<Value>> {
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

/// What the claim step has done so far (shared with the progress bars; reset per attempt).
#[derive(Debug, Default)]
struct ClaimProgress {
    total: AtomicU64,
    examined: AtomicU64,
    claimed: AtomicU64,
    already_processed: AtomicU64,
    held_elsewhere: AtomicU64,
}

impl ClaimProgress {
    fn reset(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        for c in [
            &self.examined,
            &self.claimed,
            &self.already_processed,
            &self.held_elsewhere,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `feed-import` pipeline: `claim` (fans out one child per newly claimed item) and
/// `process` (each child counts its title's words).
fn feed_pipeline(store: DynStore, progress: Arc<ClaimProgress>) -> Pipeline {
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
    for item in items {
        let id = item["id"].as_str().unwrap_or_default().to_string();
        let claimed = ctx
            .claim_in(SCOPE, SOURCE, &id, completion())
            .await
            .map_err(HandlerError::retry)?;
        let descriptor = match claimed {
            Some(d) => Some(d),
            // Not taken: processed already, held by another job, or held by this job since an
            // earlier attempt of this step (then it is adopted, or the parent would complete it
            // unprocessed when it finishes).
            None => {
                let identity = Identity::new(SCOPE, SOURCE, &id).map_err(HandlerError::fatal)?;
                let state = store
                    .get_claim(&identity)
                    .await
                    .map_err(HandlerError::retry)?;
                match state {
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
                }
            }
        };
        if let Some(d) = descriptor {
            ClaimProgress::bump(&progress.claimed);
            packets.push(Packet::new(item).with_claim(d));
        }
        ClaimProgress::bump(&progress.examined);
    }
    // No packets: the job finishes `completed_no_items`. Several: fan-out (one child each).
    Ok(StepOutput::Packets(packets))
}

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

/// Children counts of the parent (all zero when it did not fan out).
#[derive(Debug, Default, Serialize)]
struct Children {
    created: i64,
    completed: i64,
    failed: i64,
    skipped: i64,
    chunk_size: u32,
}

/// A `feed-import` job an earlier run left unfinished, carried on by this one.
#[derive(Debug, Serialize)]
struct EarlierJob {
    id: i64,
    status: JobStatus,
    reason: Option<String>,
}

/// What the demo prints at the end (also its `--json` output).
#[derive(Debug, Serialize)]
struct Summary {
    database: String,
    database_file: Option<String>,
    fresh: bool,
    database_existed: bool,
    pipeline: &'static str,
    feed: &'static str,
    feed_items: usize,
    /// Feed items processed before this run started.
    processed_before: usize,
    /// Jobs an earlier (interrupted) run left unfinished, finished first by this run.
    earlier_jobs: Vec<EarlierJob>,
    /// Items those earlier jobs processed during this run.
    processed_by_earlier_jobs: usize,
    /// Items this run's claim step claimed.
    claimed_this_run: u64,
    skipped_already_processed: u64,
    skipped_held_by_other_job: u64,
    /// `fan_out`, `inline` (one new item: the parent processed it itself) or `nothing_new`.
    mode: &'static str,
    /// Items processed during this run (by this run's job and by earlier jobs carried on).
    newly_processed: usize,
    /// Feed items with a processed claim now.
    processed_total: usize,
    /// Tracked-items ledger rows (namespace `feed`) of the feed items now.
    tracked_items_rows: usize,
    parent_id: i64,
    parent_status: JobStatus,
    parent_reason: Option<String>,
    children: Children,
    violations: Vec<Violation>,
    processing_ms: u64,
    wall_ms: u64,
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

/// How many feed items have a `processed` claim in the shared scope.
async fn processed_feed_items(store: &DynStore, ids: &HashSet<&str>) -> Result<usize, CliError> {
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

/// The three progress bars: the claim step, the parent, the children.
struct Bars {
    multi: MultiProgress,
    hidden: bool,
    claim: ProgressBar,
    parent: ProgressBar,
    children: ProgressBar,
}

impl Bars {
    fn new(hidden: bool, items: u64) -> Self {
        let multi = MultiProgress::with_draw_target(if hidden {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        });
        let bar = |prefix: &str, len: u64| {
            let pb = multi.add(ProgressBar::new(len));
            pb.set_style(
                ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos:>4}/{len:4} {wide_msg}")
                    .map(|s| s.progress_chars("=> "))
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            pb.set_prefix(prefix.to_string());
            pb
        };
        let claim = bar("claim", items);
        let parent = bar("parent", items);
        let children = bar("children", 0);
        claim.set_message("items examined");
        parent.set_message("children created");
        children.set_message("children finished");
        Self {
            multi,
            hidden,
            claim,
            parent,
            children,
        }
    }

    /// A line above the bars (on stderr; nothing with `--json`).
    fn note(&self, line: String) {
        if !self.hidden {
            self.multi.suspend(|| eprintln!("{line}"));
        }
    }

    fn update(&self, progress: &ClaimProgress, job: &Job, st: Option<&BatchState>) {
        let total = ClaimProgress::get(&progress.total);
        if total > 0 {
            self.claim.set_length(total);
        }
        self.claim
            .set_position(ClaimProgress::get(&progress.examined));
        self.claim.set_message(format!(
            "examined: {} new, {} done before, {} held elsewhere",
            ClaimProgress::get(&progress.claimed),
            ClaimProgress::get(&progress.already_processed),
            ClaimProgress::get(&progress.held_elsewhere),
        ));
        let fenced = st.is_some_and(|st| st.fenced);
        let job_text = format!(
            "job {} {}{}",
            job.id,
            job.status,
            if fenced { ", fenced" } else { "" }
        );
        match st {
            Some(st) => {
                self.parent.set_length(st.items_total.max(0) as u64);
                self.parent.set_position(st.children_total.max(0) as u64);
                self.parent
                    .set_message(format!("children created; {job_text}"));
                self.children.set_length(st.children_total.max(0) as u64);
                self.children
                    .set_position(st.children_terminal.max(0) as u64);
                self.children.set_message(format!(
                    "finished: {} completed, {} failed",
                    st.children_completed, st.children_failed
                ));
            }
            None => {
                self.parent.set_position(0);
                self.children.set_length(0);
                self.children.set_position(0);
                let what = if job.status.is_final() {
                    "no children"
                } else {
                    "no children yet"
                };
                self.parent.set_message(format!("{what}; {job_text}"));
            }
        }
    }

    fn finish(&self, ok: bool) {
        for pb in [&self.claim, &self.parent, &self.children] {
            if ok {
                pb.finish();
            } else {
                pb.abandon();
            }
        }
    }
}

/// When the demo gives up, and what its message names.
struct Deadline {
    at: Instant,
    limit: Duration,
    url: String,
}

/// Polls a parent and its batch state until the parent is final, updating the bars.
async fn wait_for(
    jobs: &Jobs,
    parent: i64,
    progress: &ClaimProgress,
    bars: &Bars,
    deadline: &Deadline,
) -> Result<(Job, Option<BatchState>), CliError> {
    loop {
        let job = jobs.get(parent).await?;
        let st = jobs.batch_state(parent).await?;
        bars.update(progress, &job, st.as_ref());
        if job.status.is_final() {
            return Ok((job, st));
        }
        if Instant::now() > deadline.at {
            let children = st.map_or_else(
                || "no children yet".to_string(),
                |st| {
                    format!(
                        "{} of {} children created, {} finished",
                        st.children_total, st.items_total, st.children_terminal
                    )
                },
            );
            return Err(CliError::Failed(format!(
                "demo did not finish within {}: job {parent} is {} ({children}); it stays in the \
                 database and the next `dockhand demo` on it carries it on; inspect it with \
                 `dockhand --database-url {} liveness`",
                format_exact(deadline.limit.as_millis() as i64),
                job.status,
                deadline.url
            )));
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = tokio::signal::ctrl_c() => {
                return Err(CliError::Failed(format!(
                    "demo interrupted; job {parent} stays in the database and the next \
                     `dockhand demo` on it carries it on"
                )));
            }
        }
    }
}

fn render(s: &Summary) -> String {
    let ms = |v: u64| format_approx(v as i64);
    let with_reason = |status: JobStatus, reason: &Option<String>| match reason {
        Some(r) => format!("{status} ({r})"),
        None => status.to_string(),
    };
    let status = with_reason(s.parent_status, &s.parent_reason);
    let mut text = format!(
        "\n{} job {} finished {status} in {}\n\n",
        s.pipeline,
        s.parent_id,
        ms(s.processing_ms)
    );
    let mut rows = vec![
        (
            "feed items",
            format!("{} (bundled {})", s.feed_items, s.feed),
        ),
        (
            "processed before",
            format!("{} (by earlier runs)", s.processed_before),
        ),
    ];
    if !s.earlier_jobs.is_empty() {
        let list: Vec<String> = s
            .earlier_jobs
            .iter()
            .map(|j| format!("job {} {}", j.id, with_reason(j.status, &j.reason)))
            .collect();
        rows.push((
            "earlier jobs",
            format!(
                "{}: left unfinished by an earlier run, finished first; they processed {} item(s)",
                list.join(", "),
                s.processed_by_earlier_jobs
            ),
        ));
    }
    let by_this_job = s
        .newly_processed
        .saturating_sub(s.processed_by_earlier_jobs);
    let newly = if s.earlier_jobs.is_empty() {
        format!("{} (by job {})", s.newly_processed, s.parent_id)
    } else {
        format!(
            "{} ({by_this_job} by job {}, {} by earlier jobs)",
            s.newly_processed, s.parent_id, s.processed_by_earlier_jobs
        )
    };
    rows.push(("newly processed", newly));
    rows.push((
        "claim step",
        format!(
            "{} new item(s) claimed; skipped {} already processed, {} held by another job",
            s.claimed_this_run, s.skipped_already_processed, s.skipped_held_by_other_job
        ),
    ));
    let children = match s.mode {
        "fan_out" => format!(
            "{} created in chunks of {}: {} completed, {} failed, {} skipped",
            s.children.created,
            s.children.chunk_size,
            s.children.completed,
            s.children.failed,
            s.children.skipped
        ),
        "inline" => "none: a single new item was processed by the parent itself".into(),
        _ => "none: nothing new to process".into(),
    };
    rows.push(("children", children));
    rows.push(("parent", format!("job {} {status}", s.parent_id)));
    rows.push((
        "claims processed",
        format!(
            "{} of {} feed items (scope {SCOPE})",
            s.processed_total, s.feed_items
        ),
    ));
    rows.push((
        "tracked-items rows",
        format!("{} (namespace {NAMESPACE})", s.tracked_items_rows),
    ));
    let rate = if s.newly_processed >= 100 {
        format!(
            ", {:.0} items/s",
            s.newly_processed as f64 / (s.processing_ms.max(1) as f64 / 1000.0)
        )
    } else {
        String::new()
    };
    rows.push((
        "wall time",
        format!(
            "{} (processing {}{rate})",
            ms(s.wall_ms),
            ms(s.processing_ms)
        ),
    ));
    let database = match &s.database_file {
        Some(f) => format!(
            "{f} ({} this run; kept: the next run skips every processed item, --fresh starts over)",
            if s.database_existed {
                "existed before"
            } else {
                "created by"
            }
        ),
        None => s.database.clone(),
    };
    rows.push(("database", database));
    text.push_str(&key_values(&rows));
    text.push('\n');
    text.push_str(&violations_text(&s.violations));
    text
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
