//! Recovery and audit commands: `recover-stuck` (R2) brings stranded jobs forward, `liveness`
//! (R3) shows what drives each pending/processing job, and `check` audits the invariants
//! (DESIGN §11), exiting with status 1 when one is broken.
//!
//! All three work through [`Jobs::without_pipelines`]: they need no pipeline code, so they run
//! against any database. What `recover-stuck` re-arms (a step, chunk or finalize action) is
//! carried out by a runtime that registered the job's pipeline.

use super::args::{self, format_approx, format_exact};
use super::table::{truncate, Table};
use super::{CliError, Output};
use crate::batch::recovery::{RecoverOptions, RecoverReport, RecoveredJob, RecoveryAction};
use crate::batch::{JobLiveness, Violation};
use crate::clock::SystemClock;
use crate::{Jobs, Queue};
use chrono::Duration;
use clap::Args;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;

/// Options of `dockhand recover-stuck`.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// Report what would be done; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// At most this many pending/processing jobs examined (lowest id first).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
    /// Only jobs unchanged for at least this long (e.g. 30s, 5m, 1h), so that jobs a worker
    /// is about to move are left alone.
    #[arg(long, value_name = "DURATION", default_value = "5m",
          value_parser = args::parse_duration, allow_hyphen_values = true)]
    pub older_than: Duration,
}

/// Options of `dockhand liveness`.
#[derive(Debug, Args)]
pub struct LivenessArgs {
    /// At most this many jobs listed (lowest id first).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
}

fn jobs(q: &Queue) -> Jobs {
    Jobs::without_pipelines(Arc::clone(q.store()), Arc::new(SystemClock))
}

/// The rows of the `recover-stuck` report: (counter, value, what it counts).
fn report_rows(r: &RecoverReport) -> Vec<(&'static str, u64, &'static str)> {
    vec![
        ("examined", r.examined, "pending/processing jobs looked at"),
        (
            "left_alone",
            r.left_alone,
            "have a pending/running action or active children",
        ),
        (
            "batch_parents_completed",
            r.batch_parents_completed,
            "stranded batch parents finished from their children",
        ),
        (
            "would_complete_batch_parent",
            r.would_complete_batch_parent,
            "(dry run) batch parents that would be finished",
        ),
        (
            "chunk_rearmed",
            r.chunk_rearmed,
            "stranded batch parents whose chunk action was enqueued again",
        ),
        (
            "would_rearm_chunk",
            r.would_rearm_chunk,
            "(dry run) chunk actions that would be enqueued again",
        ),
        (
            "requeued",
            r.requeued,
            "stranded jobs whose step action was enqueued again",
        ),
        (
            "would_requeue",
            r.would_requeue,
            "(dry run) step actions that would be enqueued again",
        ),
        (
            "failed_stale",
            r.failed_stale,
            "jobs whose step had failed for good, finished failed/stale",
        ),
        (
            "would_fail_stale",
            r.would_fail_stale,
            "(dry run) jobs that would be finished failed/stale",
        ),
        (
            "left_for_handler",
            r.left_for_handler,
            "stranded jobs left for a runtime with their claims' completion handlers",
        ),
        (
            "errors",
            r.errors,
            "stranded jobs whose recovery failed (the others were still recovered)",
        ),
        (
            "outbox_replayed",
            r.outbox_replayed,
            "undelivered lifecycle events delivered now",
        ),
        (
            "would_replay_outbox",
            r.would_replay_outbox,
            "(dry run) undelivered lifecycle events waiting",
        ),
        (
            "outbox_left_for_runtime",
            r.outbox_left_for_runtime,
            "undelivered lifecycle events left for a runtime's hooks",
        ),
    ]
}

/// The per-job table: each stranded job and what was (or would be) done with it.
fn jobs_table(r: &RecoverReport) -> String {
    let mut t = Table::new(&[
        "ID",
        "PIPELINE",
        "STATUS",
        "ACTION",
        "PREDICTED_STATUS",
        "REASON",
        "NOTE",
    ])
    .right_align(&[0]);
    for j in &r.jobs {
        let note = match (&j.error, j.missing_handlers.is_empty()) {
            (Some(e), _) => format!("error: {e}"),
            (None, false) => format!(
                "needs completion handler(s) {} not registered here",
                j.missing_handlers
                    .iter()
                    .map(|h| format!("`{h}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (None, true) => String::new(),
        };
        t.row(vec![
            j.id.to_string(),
            truncate(&j.pipeline, 32),
            j.status.to_string(),
            j.action.as_str().into(),
            j.predicted_status.to_string(),
            j.reason.clone().unwrap_or_else(|| "-".into()),
            truncate(&note, 200),
        ]);
    }
    t.render()
}

/// `1, 2, 3` of the jobs `keep` selects.
fn job_ids(r: &RecoverReport, keep: impl Fn(&RecoveredJob) -> bool) -> String {
    r.jobs
        .iter()
        .filter(|j| keep(j))
        .map(|j| j.id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `dockhand recover-stuck`.
pub(crate) async fn recover_stuck(q: &Queue, a: &RecoverArgs, out: Output) -> Result<(), CliError> {
    let older_than = args::non_negative("older_than", a.older_than)?;
    let opts = RecoverOptions {
        dry_run: a.dry_run,
        limit: a.limit,
        older_than: a.older_than,
    };
    let report = jobs(q).recover_stuck(&opts).await?;
    let value = json!({
        "report": &report,
        "options": {
            "dry_run": a.dry_run,
            "limit": a.limit,
            "older_than_ms": older_than.as_millis() as u64,
        },
    });
    out.emit(&value, || {
        let age = format_exact(a.older_than.num_milliseconds());
        let mut text = if a.dry_run {
            format!(
                "recover-stuck --dry-run: nothing was changed; jobs unchanged for at least {age}\n\n"
            )
        } else {
            format!("recover-stuck: jobs unchanged for at least {age}\n\n")
        };
        let mut t = Table::new(&["COUNTER", "COUNT", "MEANING"]).right_align(&[1]);
        for (name, count, meaning) in report_rows(&report) {
            t.row(vec![name.into(), count.to_string(), meaning.into()]);
        }
        text.push_str(&t.render());
        if report.examined as i64 == a.limit {
            text.push_str(&format!(
                "\nthe limit of {} jobs was reached; run again (or raise --limit) for the rest\n",
                a.limit
            ));
        }
        if !report.jobs.is_empty() {
            text.push_str(if a.dry_run {
                "\nstranded jobs and what a real run would do:\n"
            } else {
                "\nstranded jobs and what was done:\n"
            });
            text.push_str(&jobs_table(&report));
        }
        let acted = report.chunk_rearmed + report.requeued;
        if acted > 0 {
            text.push_str(&format!(
                "\n{acted} action(s) enqueued again: a runtime that registered the job's pipeline \
                 carries them out\n"
            ));
        }
        if report.left_for_handler > 0 {
            text.push_str(&format!(
                "\n{} job(s) left for a runtime that registered their claims' completion \
                 handlers (finishing them here would fail them item_claim_completion_failed): \
                 {}\n",
                report.left_for_handler,
                job_ids(&report, |j| j.action == RecoveryAction::LeftForHandler
                    && j.error.is_none())
            ));
        }
        if report.outbox_left_for_runtime > 0 {
            text.push_str(&format!(
                "\n{} lifecycle event(s) left in the outbox: a running runtime's maintenance \
                 delivers them to its hooks\n",
                report.outbox_left_for_runtime
            ));
        }
        text
    })?;
    if report.errors > 0 {
        return Err(CliError::Failed(format!(
            "recover-stuck: {} job(s) could not be recovered (the others were): {}",
            report.errors,
            job_ids(&report, |j| j.error.is_some())
        )));
    }
    Ok(())
}

/// How a pending/processing job is driven (R3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LivenessClass {
    /// A pending or running action (step, chunk or finalize) will move it.
    HasSchedulerPath,
    /// No action, but children not yet final: the last one's terminal transaction moves it.
    ActiveChildren,
    /// Neither: nothing will move it; `recover-stuck` acts on it.
    Stranded,
}

impl LivenessClass {
    const ALL: [LivenessClass; 3] = [
        LivenessClass::HasSchedulerPath,
        LivenessClass::ActiveChildren,
        LivenessClass::Stranded,
    ];

    pub(crate) fn of(j: &JobLiveness) -> Self {
        if j.has_action {
            LivenessClass::HasSchedulerPath
        } else if j.active_children > 0 {
            LivenessClass::ActiveChildren
        } else {
            LivenessClass::Stranded
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            LivenessClass::HasSchedulerPath => "has_scheduler_path",
            LivenessClass::ActiveChildren => "active_children",
            LivenessClass::Stranded => "stranded",
        }
    }
}

/// One row of `dockhand liveness --json`.
#[derive(Debug, Serialize)]
struct LivenessRow<'a> {
    #[serde(flatten)]
    job: &'a JobLiveness,
    class: LivenessClass,
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

/// `dockhand liveness`.
pub(crate) async fn liveness(q: &Queue, a: &LivenessArgs, out: Output) -> Result<(), CliError> {
    let rows = jobs(q).liveness(a.limit).await?;
    let now = q.clock().now();
    let count = |c: LivenessClass| rows.iter().filter(|j| LivenessClass::of(j) == c).count();
    let counts: Vec<(LivenessClass, usize)> =
        LivenessClass::ALL.iter().map(|c| (*c, count(*c))).collect();
    let value = json!({
        "jobs": rows
            .iter()
            .map(|j| LivenessRow { job: j, class: LivenessClass::of(j) })
            .collect::<Vec<_>>(),
        "counts": counts
            .iter()
            .map(|(c, n)| (c.as_str(), *n))
            .collect::<std::collections::BTreeMap<_, _>>(),
        "limit_reached": rows.len() as i64 == a.limit,
    });
    out.emit(&value, || {
        if rows.is_empty() {
            return "no pending or processing jobs".into();
        }
        let mut t = Table::new(&[
            "ID",
            "PIPELINE",
            "STATUS",
            "STEP",
            "HAS_ACTION",
            "BATCH_PARENT",
            "FENCED",
            "ACTIVE_CHILDREN",
            "UNCHANGED_FOR",
            "CLASS",
        ])
        .right_align(&[0, 3, 7, 8]);
        for j in &rows {
            let parent = j.is_batch_parent;
            t.row(vec![
                j.job_id.to_string(),
                truncate(&j.pipeline, 32),
                j.status.to_string(),
                j.step_index.to_string(),
                yes_no(j.has_action),
                yes_no(parent),
                if parent { yes_no(j.fenced) } else { "-".into() },
                if parent {
                    j.active_children.to_string()
                } else {
                    "-".into()
                },
                format_approx((now - j.updated_at).num_milliseconds().max(0)),
                LivenessClass::of(j).as_str().into(),
            ]);
        }
        let mut text = t.render();
        let summary: Vec<String> = counts
            .iter()
            .map(|(c, n)| format!("{n} {}", c.as_str()))
            .collect();
        text.push_str(&format!(
            "\n{} job(s): {}\n",
            rows.len(),
            summary.join(", ")
        ));
        let stranded = count(LivenessClass::Stranded);
        if stranded > 0 {
            text.push_str(&format!(
                "nothing will move the {stranded} stranded job(s): `dockhand recover-stuck` acts \
                 on those unchanged for at least --older-than (default 5m); try --dry-run first\n"
            ));
        }
        if rows.len() as i64 == a.limit {
            text.push_str(&format!(
                "(showing the first {}; there may be more: raise --limit)\n",
                a.limit
            ));
        }
        text
    })
}

/// The human rendering of violations: a table, or the all-clear line.
pub(crate) fn violations_text(violations: &[Violation]) -> String {
    if violations.is_empty() {
        return "dockhand check: all invariants hold\n".into();
    }
    let mut t = Table::new(&["INVARIANT", "SUBJECT", "DETAIL"]);
    for v in violations {
        t.row(vec![
            v.invariant.to_string(),
            truncate(&v.subject, 40),
            truncate(&v.detail, 200),
        ]);
    }
    t.render()
}

/// The summary of a failed check.
pub(crate) fn violations_summary(violations: &[Violation]) -> String {
    let mut kinds: Vec<&str> = violations.iter().map(|v| v.invariant).collect();
    kinds.sort_unstable();
    kinds.dedup();
    format!(
        "dockhand check: {} violation(s) of {} invariant(s): {}",
        violations.len(),
        kinds.len(),
        kinds.join(", ")
    )
}

/// `dockhand check`: exit status 1 when any invariant is broken.
pub(crate) async fn check(q: &Queue, out: Output) -> Result<(), CliError> {
    let violations = jobs(q).check().await?;
    out.emit(
        &json!({"ok": violations.is_empty(), "violations": &violations}),
        || violations_text(&violations),
    )?;
    if violations.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(violations_summary(&violations)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::JobStatus;

    fn job(has_action: bool, active_children: i64) -> JobLiveness {
        JobLiveness {
            job_id: 1,
            pipeline: "p".into(),
            status: JobStatus::Processing,
            step_index: 0,
            updated_at: chrono::Utc::now(),
            has_action,
            is_batch_parent: active_children > 0,
            fenced: false,
            active_children,
            step_failed: false,
        }
    }

    #[test]
    fn classes_follow_what_drives_the_job() {
        assert_eq!(
            LivenessClass::of(&job(true, 3)),
            LivenessClass::HasSchedulerPath
        );
        assert_eq!(
            LivenessClass::of(&job(false, 3)),
            LivenessClass::ActiveChildren
        );
        assert_eq!(LivenessClass::of(&job(false, 0)), LivenessClass::Stranded);
        assert_eq!(
            LivenessClass::of(&job(false, 0)) == LivenessClass::Stranded,
            job(false, 0).stranded()
        );
    }

    #[test]
    fn every_report_counter_is_printed() {
        let r = RecoverReport::default();
        let printed: Vec<&str> = report_rows(&r).iter().map(|(n, _, _)| *n).collect();
        let serialized = serde_json::to_value(&r).unwrap();
        let not_counters = ["dry_run", "jobs"];
        for key in serialized.as_object().unwrap().keys() {
            assert!(
                not_counters.contains(&key.as_str()) || printed.contains(&key.as_str()),
                "{key}"
            );
        }
        assert_eq!(
            printed.len(),
            serialized.as_object().unwrap().len() - not_counters.len()
        );
    }

    #[test]
    fn violations_render_with_a_summary() {
        assert_eq!(
            violations_text(&[]),
            "dockhand check: all invariants hold\n"
        );
        let v = vec![
            Violation {
                invariant: "claim_held_by_final_job",
                subject: "claim shared:feed/rss/x".into(),
                detail: "job 3 is completed".into(),
            },
            Violation {
                invariant: "claim_held_by_final_job",
                subject: "claim shared:feed/rss/y".into(),
                detail: "job 3 is completed".into(),
            },
        ];
        assert!(violations_text(&v).contains("claim shared:feed/rss/y"));
        assert_eq!(
            violations_summary(&v),
            "dockhand check: 2 violation(s) of 1 invariant(s): claim_held_by_final_job"
        );
    }
}
