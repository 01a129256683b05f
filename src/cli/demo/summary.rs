//! The demo's final report: the [`Summary`] (also its `--json` output), the children counts
//! and earlier jobs it lists, and the human text [`render`] prints.

use super::feed::{NAMESPACE, SCOPE};
use crate::batch::Violation;
use crate::cli::args::format_approx;
use crate::cli::recovery::violations_text;
use crate::cli::table::key_values;
use crate::state::JobStatus;
use serde::Serialize;

/// Children counts of the parent (all zero when it did not fan out).
#[derive(Debug, Default, Serialize)]
pub(super) struct Children {
    pub(super) created: i64,
    pub(super) completed: i64,
    pub(super) failed: i64,
    pub(super) skipped: i64,
    pub(super) chunk_size: u32,
}

/// A `feed-import` job an earlier run left unfinished, carried on by this one.
#[derive(Debug, Serialize)]
pub(super) struct EarlierJob {
    pub(super) id: i64,
    pub(super) status: JobStatus,
    pub(super) reason: Option<String>,
}

/// What the demo prints at the end (also its `--json` output).
#[derive(Debug, Serialize)]
pub(super) struct Summary {
    pub(super) database: String,
    pub(super) database_file: Option<String>,
    pub(super) fresh: bool,
    pub(super) database_existed: bool,
    pub(super) pipeline: &'static str,
    pub(super) feed: &'static str,
    pub(super) feed_items: usize,
    /// Feed items processed before this run started.
    pub(super) processed_before: usize,
    /// Jobs an earlier (interrupted) run left unfinished, finished first by this run.
    pub(super) earlier_jobs: Vec<EarlierJob>,
    /// Items those earlier jobs processed during this run.
    pub(super) processed_by_earlier_jobs: usize,
    /// Items this run's claim step claimed.
    pub(super) claimed_this_run: u64,
    pub(super) skipped_already_processed: u64,
    pub(super) skipped_held_by_other_job: u64,
    /// `fan_out`, `inline` (one new item: the parent processed it itself) or `nothing_new`.
    pub(super) mode: &'static str,
    /// Items processed during this run (by this run's job and by earlier jobs carried on).
    pub(super) newly_processed: usize,
    /// Feed items with a processed claim now.
    pub(super) processed_total: usize,
    /// Tracked-items ledger rows (namespace `feed`) of the feed items now.
    pub(super) tracked_items_rows: usize,
    pub(super) parent_id: i64,
    pub(super) parent_status: JobStatus,
    pub(super) parent_reason: Option<String>,
    pub(super) children: Children,
    pub(super) violations: Vec<Violation>,
    pub(super) processing_ms: u64,
    pub(super) wall_ms: u64,
}

pub(super) fn render(s: &Summary) -> String {
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
