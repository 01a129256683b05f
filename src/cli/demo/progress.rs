//! The demo's progress display: the claim step's counters ([`ClaimProgress`]), the three
//! indicatif bars ([`Bars`]) and the polling loop that follows a parent until it is final
//! ([`wait_for`], bounded by a [`Deadline`]).

use crate::batch::BatchState;
use crate::cli::args::format_exact;
use crate::cli::CliError;
use crate::jobs::Job;
use crate::Jobs;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the progress bars are refreshed from the database.
const POLL: Duration = Duration::from_millis(100);

/// What the claim step has done so far (shared with the progress bars; reset per attempt).
#[derive(Debug, Default)]
pub(super) struct ClaimProgress {
    pub(super) total: AtomicU64,
    pub(super) examined: AtomicU64,
    pub(super) claimed: AtomicU64,
    pub(super) already_processed: AtomicU64,
    pub(super) held_elsewhere: AtomicU64,
}

impl ClaimProgress {
    pub(super) fn reset(&self, total: u64) {
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

    pub(super) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub(super) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The three progress bars: the claim step, the parent, the children.
pub(super) struct Bars {
    multi: MultiProgress,
    hidden: bool,
    claim: ProgressBar,
    parent: ProgressBar,
    children: ProgressBar,
}

impl Bars {
    pub(super) fn new(hidden: bool, items: u64) -> Self {
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
    pub(super) fn note(&self, line: String) {
        if !self.hidden {
            self.multi.suspend(|| eprintln!("{line}"));
        }
    }

    pub(super) fn update(&self, progress: &ClaimProgress, job: &Job, st: Option<&BatchState>) {
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

    pub(super) fn finish(&self, ok: bool) {
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
pub(super) struct Deadline {
    pub(super) at: Instant,
    pub(super) limit: Duration,
    pub(super) url: String,
}

/// Polls a parent and its batch state until the parent is final, updating the bars.
pub(super) async fn wait_for(
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
