//! The options of the action commands: `enqueue` ([`EnqueueArgs`]), `list` ([`ListArgs`], with
//! the hook/group/args [`FilterArgs`] `unschedule` shares), `prune` ([`PruneArgs`]), `run`
//! ([`RunArgs`]) and `demo` ([`DemoArgs`]), and the `--limit`/`--offset` page ([`PageArgs`]) the
//! listings share. The other commands' options live beside their code.

use super::args;
use crate::action::{ActionFilter, ActionOrder, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY};
use crate::state::ActionStatus;
use crate::Error;
use chrono::{DateTime, Duration, Utc};
use clap::{ArgGroup, Args};

/// Options of `dockhand enqueue`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("recurrence").args(["every", "cron"])))]
pub struct EnqueueArgs {
    /// The hook (handler name) to run, e.g. email.send (not with --pipeline).
    #[arg(required_unless_present = "pipeline", conflicts_with = "pipeline")]
    pub hook: Option<String>,
    /// With --every or --cron and --name: each occurrence starts a job of this pipeline, with
    /// --args as its input (at most one job per occurrence; a runtime that has the pipeline
    /// runs it).
    #[arg(long, value_name = "NAME", requires_all = ["recurrence", "name"], conflicts_with = "group")]
    pub pipeline: Option<String>,
    /// With --pipeline: skip an occurrence while the schedule's previous job is not final.
    #[arg(long, requires = "pipeline")]
    pub no_overlap: bool,
    /// The handler's args (with --pipeline: the job's input), a JSON document; `@FILE` reads
    /// it from a file, `-` from stdin.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = args::ArgsText)]
    pub args: String,
    /// Group label, used by filters and unschedule.
    #[arg(long, value_name = "G")]
    pub group: Option<String>,
    /// Priority; lower runs first.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PRIORITY, allow_negative_numbers = true)]
    pub priority: i32,
    /// Run at this time (RFC 3339, e.g. 2030-01-01T09:00:00Z); with --every, the first run.
    #[arg(long, value_name = "RFC3339", value_parser = args::parse_time,
          conflicts_with_all = ["delay", "cron"])]
    pub at: Option<DateTime<Utc>>,
    /// Run after this delay (e.g. 30s, 5m, 2h, 1d, 250ms); with --every, delays the first run.
    #[arg(long = "in", value_name = "DURATION", value_parser = args::parse_duration,
          allow_hyphen_values = true, conflicts_with = "cron")]
    pub delay: Option<Duration>,
    /// Attempts before an action that keeps failing is marked failed.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// Limit on one run of the handler (e.g. 30s); longer runs are stopped and retried.
    #[arg(long, value_name = "DURATION", value_parser = args::parse_duration, allow_hyphen_values = true)]
    pub timeout: Option<Duration>,
    /// Do nothing if an action with the same hook, args and group is pending or running.
    #[arg(long, conflicts_with = "recurrence")]
    pub unique: bool,
    /// Recur at this interval (creates a schedule), anchored at the first run.
    #[arg(long, value_name = "DURATION", value_parser = args::parse_duration,
          allow_hyphen_values = true)]
    pub every: Option<Duration>,
    /// With --every: start each run that long after the previous one finished instead.
    #[arg(long, requires = "every")]
    pub fixed_delay: bool,
    /// Recur on this cron expression (creates a schedule): 5 fields (m h dom mon dow) or 6
    /// (with leading seconds), e.g. "0 9 * * 1-5".
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    /// IANA timezone the --cron expression is evaluated in, e.g. Europe/Paris [default: UTC].
    #[arg(long, value_name = "TZ", requires = "cron")]
    pub timezone: Option<String>,
    /// Schedule name (with --every or --cron); enqueueing the same name again updates that
    /// schedule. Default: derived from hook, args and group.
    #[arg(long, value_name = "NAME", requires = "recurrence")]
    pub name: Option<String>,
}

/// The hook/group/args filter shared by `list` and `unschedule`.
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Match this hook.
    #[arg(long, value_name = "H")]
    pub hook: Option<String>,
    /// Match this group.
    #[arg(long, value_name = "G")]
    pub group: Option<String>,
    /// Match exactly these JSON args; `@FILE` reads them from a file, `-` from stdin.
    #[arg(long, value_name = "JSON", value_parser = args::ArgsText)]
    pub args: Option<String>,
}

impl FilterArgs {
    /// The library filter; fails with `invalid args: not valid JSON …` on bad args.
    pub fn to_filter(&self) -> Result<ActionFilter, Error> {
        Ok(ActionFilter {
            hook: self.hook.clone(),
            group: self.group.clone(),
            args: self
                .args
                .as_deref()
                .map(|a| crate::action::parse_args(&args::read_args(a)?))
                .transpose()?,
        })
    }

    /// Whether no filter was given.
    pub fn is_empty(&self) -> bool {
        self.hook.is_none() && self.group.is_none() && self.args.is_none()
    }
}

/// Options of `dockhand list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this status (repeatable, or comma-separated): pending, running, complete, failed,
    /// canceled.
    #[arg(long, value_name = "S", value_parser = args::parse_status, value_delimiter = ',')]
    pub status: Vec<ActionStatus>,
    /// Hook, group and args filters.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Page size and rows to skip.
    #[command(flatten)]
    pub page: PageArgs,
    /// Sort order: scheduled, -scheduled, id or -id (a leading - sorts newest first).
    #[arg(long, value_name = "ORDER", default_value = "scheduled",
          value_parser = args::parse_order, allow_hyphen_values = true)]
    pub order: ActionOrder,
}

/// The `--limit`/`--offset` page of `dockhand list` and `dockhand jobs list`.
#[derive(Debug, Clone, Copy, Args)]
pub struct PageArgs {
    /// Page size.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
    /// Rows to skip.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(i64).range(0..))]
    pub offset: i64,
}

impl PageArgs {
    /// The line a table ends with when it filled the page (`shown` rows): where the next page
    /// starts. `None` when the page was not full, so no rows follow.
    pub fn next_page_note(&self, shown: usize) -> Option<String> {
        (i64::try_from(shown).ok() == Some(self.limit)).then(|| {
            format!(
                "(showing {shown} from offset {}; next page: --offset {})\n",
                self.offset,
                self.offset + self.limit
            )
        })
    }
}

/// Options of `dockhand prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Delete complete and canceled actions, and completed, completed_no_items, skipped and
    /// cancelled jobs, that finished longer ago than this [default: 7d].
    #[arg(long, value_name = "DURATION", value_parser = args::parse_duration, allow_hyphen_values = true)]
    pub keep_finished: Option<Duration>,
    /// Delete failed actions and jobs that finished longer ago than this [default: 30d].
    #[arg(long, value_name = "DURATION", value_parser = args::parse_duration, allow_hyphen_values = true)]
    pub keep_failed: Option<Duration>,
}

/// Options of `dockhand run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Actions run at once.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Actions claimed ahead of free slots while the queue is deep (held leased, started in
    /// claim order, given back at shutdown); 0 claims only for free slots.
    #[arg(long, value_name = "N", default_value_t = crate::runner::DEFAULT_PREFETCH as u32,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub prefetch: u32,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9187; port 0 picks a
    /// free port, printed at start): this worker's counters and histograms, and the
    /// database's gauges refreshed every --metrics-interval. No authentication: bind it to an
    /// address only your Prometheus reaches.
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// How often the database gauges of --metrics-bind are read (one query each time).
    #[arg(long, value_name = "DURATION", default_value = "15s", requires = "metrics_bind",
          value_parser = args::parse_positive_duration)]
    pub metrics_interval: std::time::Duration,
}

/// Options of `dockhand demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Delete the demo's SQLite database file (and its -wal/-shm side files) first, so every
    /// feed item is new again.
    #[arg(long)]
    pub fresh: bool,
    /// Actions (steps, chunks, finalize) run at once.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Give up (exit status 1) when the job is not final after this long; the job stays in the
    /// database and the next run carries it on.
    #[arg(long, value_name = "DURATION", default_value = "2m",
          value_parser = args::parse_duration, allow_hyphen_values = true)]
    pub timeout: Duration,
}
