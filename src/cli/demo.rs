//! `dockhand demo`: a self-contained tour of the runtime on a temporary SQLite file.
//!
//! It registers the demo hooks, enqueues a few thousand actions of several kinds (immediate ones
//! in bulk, delayed ones, flaky ones that fail and are retried, a unique duplicate that is
//! deduplicated, an interval schedule), runs them with a progress bar until every enqueued
//! action is final, then prints a summary. The same hooks serve `dockhand run`.

use super::args::format_approx;
use super::table::{key_values, Table};
use super::{CliError, DemoArgs, Output};
use crate::action::{ActionFilter, ActionOrder, ActionQuery};
use crate::maintenance::MaintenanceConfig;
use crate::state::ActionStatus;
use crate::ScheduleSpec;
use crate::{ActionSpec, Backoff, HandlerError, Queue, Recurrence, Runtime, RuntimeBuilder};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The hooks [`register_demo_hooks`] installs.
pub const DEMO_HOOKS: [&str; 4] = ["demo.noop", "demo.sleep", "demo.flaky", "demo.tick"];

/// The group of the actions the demo enqueues (its progress counts only these).
const GROUP: &str = "demo";
/// The group of the recurring schedule's occurrences.
const TICK_GROUP: &str = "demo-tick";
/// How often the demo schedule recurs.
const TICK_EVERY_MS: i64 = 1_000;

/// Registers the demo handlers: `demo.noop` (returns at once), `demo.sleep` (sleeps `args.ms`
/// milliseconds, default 5, at most 1000), `demo.flaky` (fails with a retryable error while
/// `ctx.attempt <= args.fail_times`, default 1, then succeeds) and `demo.tick` (for schedules).
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

/// What the demo prints at the end (also its `--json` output).
#[derive(Debug, Default, Serialize)]
struct Summary {
    actions: u64,
    by_status: BTreeMap<String, i64>,
    by_hook: BTreeMap<String, BTreeMap<String, i64>>,
    retried_actions: u64,
    expected_failures: u64,
    dedupe_id: i64,
    dedupe_second_inserted: bool,
    ticks_ran: i64,
    ticks_canceled_at_end: u64,
    enqueue_ms: u64,
    processing_ms: u64,
    wall_ms: u64,
    throughput_per_sec: f64,
    database: String,
    database_kept: bool,
}

/// `dockhand demo`.
pub(crate) async fn run(a: &DemoArgs, out: Output) -> Result<(), CliError> {
    let path = std::env::temp_dir().join(format!("dockhand-demo-{:016x}.db", fastrand::u64(..)));
    let url = format!("sqlite:{}", path.display());
    let result = run_on(&url, a, out).await;
    if !a.keep {
        remove_database(&path);
    }
    let mut summary = result?;
    summary.database = path.display().to_string();
    summary.database_kept = a.keep;
    out.emit(&summary, || render(&summary))
}

async fn run_on(url: &str, a: &DemoArgs, out: Output) -> Result<Summary, CliError> {
    let runtime = register_demo_hooks(Runtime::builder(url))
        .concurrency(a.concurrency as usize)
        .poll_interval(Duration::from_millis(50))
        .backoff(Backoff::fixed_exponential(
            Duration::from_millis(100),
            2.0,
            Duration::from_secs(1),
        ))
        .default_timeout(Some(Duration::from_secs(10)))
        .shutdown_timeout(Duration::from_secs(5))
        .maintenance(MaintenanceConfig {
            tick: Duration::from_millis(200),
            scheduler_interval: Duration::from_millis(200),
            schedule_lookahead: Duration::from_millis(200),
            reaper_interval: Duration::from_secs(1),
            ..MaintenanceConfig::default()
        })
        .build()
        .await?;
    let result = drive(&runtime, a, out).await;
    runtime.store().close().await;
    result
}

async fn drive(runtime: &Runtime, a: &DemoArgs, out: Output) -> Result<Summary, CliError> {
    let queue = runtime.queue();
    let started = Instant::now();
    let (specs, expected_failures) = plan(a.actions.saturating_sub(1));
    let mut inserted = 0u64;
    for chunk in specs.chunks(5_000) {
        inserted += queue.enqueue_bulk(chunk.to_vec()).await?.len() as u64;
    }
    let unique = || {
        ActionSpec::new("demo.noop", json!({"unique": true}))
            .group(GROUP)
            .unique()
    };
    let first = queue.enqueue_detailed(unique()).await?;
    let second = queue.enqueue_detailed(unique()).await?;
    inserted += u64::from(first.inserted) + u64::from(second.inserted);
    let every = Recurrence::every(chrono::Duration::milliseconds(TICK_EVERY_MS))?;
    queue
        .schedule(
            ScheduleSpec::new("demo.tick", json!({}), every)
                .name("demo.tick")
                .group(TICK_GROUP),
        )
        .await?;
    let enqueue_time = started.elapsed();
    if !out.is_json() {
        eprintln!(
            "enqueued {inserted} actions in {} ({} in bulk, some delayed 1-2s, some flaky; a unique \
             duplicate; demo.tick every 1s); running with concurrency {}",
            format_approx(enqueue_time.as_millis() as i64),
            specs.len(),
            a.concurrency
        );
    }

    let pb = if out.is_json() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(inserted)
    };
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} final  {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let handle = runtime.start().await?;
    let processing_start = Instant::now();
    let limit = Duration::from_secs(60).max(Duration::from_millis(u64::from(a.actions) * 20));
    let waited = wait_until_final(queue, inserted, limit, &pb).await;
    let processing = processing_start.elapsed();
    let tick_filter = ActionFilter {
        hook: Some("demo.tick".into()),
        group: Some(TICK_GROUP.into()),
        args: None,
    };
    let unscheduled = queue.unschedule_all(&tick_filter).await;
    handle.shutdown().await;
    if waited.is_ok() {
        pb.finish();
    } else {
        pb.abandon();
    }
    waited?;
    let ticks_canceled_at_end = unscheduled?;

    let mut s = collect(queue).await?;
    s.actions = inserted;
    s.expected_failures = expected_failures;
    s.dedupe_id = second.id;
    s.dedupe_second_inserted = second.inserted;
    s.ticks_canceled_at_end = ticks_canceled_at_end;
    s.enqueue_ms = enqueue_time.as_millis() as u64;
    s.processing_ms = processing.as_millis() as u64;
    s.wall_ms = started.elapsed().as_millis() as u64;
    s.throughput_per_sec = inserted as f64 / processing.as_secs_f64().max(0.001);
    Ok(s)
}

/// The bulk-enqueued actions: half instant, a quarter sleeping a few ms, 15% delayed by 1-2 s,
/// 10% flaky (one in twenty of those fails every attempt and ends failed). Returns the specs
/// and how many are meant to fail.
fn plan(n: u32) -> (Vec<ActionSpec>, u64) {
    let mut failures = 0;
    let specs = (0..n)
        .map(|i| {
            let spec = match i % 20 {
                0 | 1 if i % 200 == 0 => {
                    failures += 1;
                    ActionSpec::new("demo.flaky", json!({"i": i, "fail_times": 1_000}))
                        .max_attempts(3)
                }
                0 | 1 => ActionSpec::new(
                    "demo.flaky",
                    json!({"i": i, "fail_times": 1 + (i / 20) % 2}),
                ),
                2..=4 => ActionSpec::new("demo.noop", json!({"i": i, "delayed": true})).after(
                    chrono::Duration::milliseconds(1_000 + i64::from(i * 37 % 1_000)),
                ),
                5..=9 => ActionSpec::new("demo.sleep", json!({"i": i, "ms": 1 + i % 5})),
                _ => ActionSpec::new("demo.noop", json!({"i": i})),
            };
            spec.group(GROUP)
        })
        .collect();
    (specs, failures)
}

/// Polls the queue statistics until every demo action is final, updating the progress bar.
async fn wait_until_final(
    queue: &Queue,
    total: u64,
    limit: Duration,
    pb: &ProgressBar,
) -> Result<(), CliError> {
    let start = Instant::now();
    loop {
        let stats = queue.stats().await?;
        let empty = BTreeMap::new();
        let counts = stats.by_group.get(GROUP).unwrap_or(&empty);
        let n = |s: ActionStatus| counts.get(s.as_str()).copied().unwrap_or(0);
        let finished = ActionStatus::ALL
            .iter()
            .filter(|s| s.is_final())
            .map(|s| n(*s))
            .sum::<i64>() as u64;
        let (pending, running) = (n(ActionStatus::Pending), n(ActionStatus::Running));
        pb.set_position(finished);
        pb.set_message(format!("{pending} pending, {running} running"));
        if pending == 0 && running == 0 && finished >= total {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(CliError::Failed(format!(
                "demo did not finish within {}s: {finished} of {total} actions final \
                 ({pending} pending, {running} running)",
                limit.as_secs()
            )));
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = tokio::signal::ctrl_c() => {
                return Err(CliError::Failed("demo interrupted".into()));
            }
        }
    }
}

/// Reads every action back and counts per status, per hook, retries and schedule ticks.
async fn collect(queue: &Queue) -> Result<Summary, CliError> {
    let mut s = Summary::default();
    const PAGE: i64 = 1_000;
    let mut offset = 0;
    loop {
        let page = queue
            .query(&ActionQuery {
                limit: PAGE,
                offset,
                order: ActionOrder::IdAsc,
                ..ActionQuery::default()
            })
            .await?;
        for a in &page {
            match a.group.as_deref() {
                Some(GROUP) => {
                    let status = a.status.to_string();
                    *s.by_status.entry(status.clone()).or_default() += 1;
                    *s.by_hook
                        .entry(a.hook.clone())
                        .or_default()
                        .entry(status)
                        .or_default() += 1;
                    if a.attempt > 1 {
                        s.retried_actions += 1;
                    }
                }
                Some(TICK_GROUP) if a.status == ActionStatus::Complete => s.ticks_ran += 1,
                _ => {}
            }
        }
        if (page.len() as i64) < PAGE {
            return Ok(s);
        }
        offset += PAGE;
    }
}

fn render(s: &Summary) -> String {
    let ms = |v: u64| format_approx(v as i64);
    let mut text = format!(
        "\ndemo finished: {} actions final in {} ({:.0} actions/s)\n\n",
        s.actions,
        ms(s.processing_ms),
        s.throughput_per_sec
    );
    let statuses: Vec<ActionStatus> = ActionStatus::ALL
        .into_iter()
        .filter(|st| s.by_status.contains_key(st.as_str()))
        .collect();
    let mut t = Table::new(&["STATUS", "COUNT"]).right_align(&[1]);
    for st in &statuses {
        t.row(vec![st.to_string(), s.by_status[st.as_str()].to_string()]);
    }
    text.push_str(&t.render());
    text.push('\n');
    let mut headers: Vec<String> = vec!["HOOK".into()];
    headers.extend(statuses.iter().map(|st| st.as_str().to_uppercase()));
    headers.push("TOTAL".into());
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let numeric: Vec<usize> = (1..headers.len()).collect();
    let mut t = Table::new(&headers).right_align(&numeric);
    for (hook, counts) in &s.by_hook {
        let mut row = vec![hook.clone()];
        row.extend(
            statuses
                .iter()
                .map(|st| counts.get(st.as_str()).copied().unwrap_or(0).to_string()),
        );
        row.push(counts.values().sum::<i64>().to_string());
        t.row(row);
    }
    text.push_str(&t.render());
    text.push('\n');
    let dedupe = if s.dedupe_second_inserted {
        format!(
            "the unique duplicate was inserted (id {}); unexpected",
            s.dedupe_id
        )
    } else {
        format!(
            "enqueueing the same unique action twice gave id {} both times",
            s.dedupe_id
        )
    };
    let database = if s.database_kept {
        format!("kept at {}", s.database)
    } else {
        format!("{} (removed)", s.database)
    };
    text.push_str(&key_values(&[
        ("retries", format!("{} actions needed more than one attempt", s.retried_actions)),
        (
            "expected failures",
            format!("{} demo.flaky actions fail on every attempt (3 allowed)", s.expected_failures),
        ),
        ("dedupe", dedupe),
        (
            "schedule",
            format!(
                "demo.tick every 1s ran {} time(s); unscheduled at the end ({} pending occurrence(s) canceled)",
                s.ticks_ran, s.ticks_canceled_at_end
            ),
        ),
        (
            "wall time",
            format!(
                "{} (enqueue {}, processing {})",
                ms(s.wall_ms),
                ms(s.enqueue_ms),
                ms(s.processing_ms)
            ),
        ),
        ("throughput", format!("{:.0} actions/s", s.throughput_per_sec)),
        ("database", database),
    ]));
    text
}

/// Deletes the demo database and its WAL/SHM side files; a failure is only reported.
fn remove_database(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = PathBuf::from(name);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("warning: could not remove {}: {e}", file.display()),
        }
    }
}
