//! The `dockhand` operator command line: the argument definitions ([`Cli`], [`Command`]), the
//! dispatch ([`run`]) and the error the binary reports ([`CliError`]).
//!
//! Every command opens the store named by `--database-url` through [`crate::store::connect`] and
//! works through [`crate::Queue`]; human tables by default, JSON with `--json`. The commands live
//! in `actions` (enqueue, list, show, cancel, retry), `schedules` (recurring enqueue,
//! unschedule, schedules), `jobs` (jobs list/show, manual-fail, cancel-job), `claims` (claims
//! list), `groups` (group limits), `recovery` (recover-stuck, liveness, check), `ops` (migrate, stats, prune, run),
//! `demo` (the feed-import demo, and the hooks `run` serves), `bench` (the DESIGN §10
//! benchmark, on fresh databases of its own) and `ui` (the operator dashboard, `ui` feature);
//! `options` holds the action commands' options, `args` parses durations and other values,
//! `table` prints tables, `output` writes results and errors.

mod actions;
pub mod args;
mod bench;
mod claims;
mod demo;
mod groups;
mod jobs;
mod ops;
mod options;
mod output;
mod recovery;
mod schedules;
mod table;
mod ui;

pub use bench::{BenchArgs, BenchBackend, Measurement, Workload};
pub use claims::{ClaimListArgs, ClaimsCommand};
pub use demo::{register_demo_hooks, DEMO_HOOKS};
pub use groups::{GroupsCommand, LimitArgs};
pub use jobs::{JobListArgs, JobsCommand};
pub use options::{DemoArgs, EnqueueArgs, FilterArgs, ListArgs, PageArgs, PruneArgs, RunArgs};
use output::Output;
pub use output::{error_report, CliError, EXIT_RUNTIME, EXIT_USAGE};
pub use recovery::{LivenessArgs, RecoverArgs};
pub use ui::{parse_user_pass, UiArgs, UserPass};

use crate::jobs::bridge::reason;
use crate::state::JobStatus;
use crate::Queue;
use args::non_negative;
use chrono::Duration;
use clap::{Parser, Subcommand};
use std::sync::Arc;

/// The database every command but `demo` uses when no `--database-url` is given.
pub const DEFAULT_DATABASE_URL: &str = "sqlite:dockhand.db";

/// The top-level `--help` epilogue: logs, exit statuses, the cron DST rule.
const AFTER_HELP: &str = "\
Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=dockhand=debug) for more. Errors go to stderr \
as `error: MESSAGE`, or with --json as {\"error\": MESSAGE, \"kind\": KIND, \"exit\": STATUS}.

Exit status (stable):
  0  success (also: cancel/retry/manual-fail/cancel-job of an already final record)
  1  runtime error: the database unreachable or refusing writes, an unknown id, invalid \
input caught when the command runs, `check` finding a broken invariant, `run` stopping on a \
permanent write error, a timeout
  2  usage error: unknown command or option, a value clap cannot parse

Cron schedules (--cron, in --timezone): a local time that does not exist (skipped by a DST \
change) is skipped; one that happens twice (the hour repeated when clocks go back) runs once.";

/// `dockhand`: operate a dockhand task queue from the shell.
#[derive(Debug, Parser)]
#[command(
    name = "dockhand",
    version,
    about = "Operate a dockhand durable task queue: enqueue, inspect, cancel, retry, prune, run; \
             inspect jobs and item claims, fail or cancel jobs; recover stranded jobs and audit \
             the invariants",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Database URL: sqlite:PATH, sqlite::memory:, postgres://USER:PASSWORD@HOST/DB or
    /// mysql://USER:PASSWORD@HOST/DB (MySQL 8 / MariaDB 10.6+; mariadb:// too). TLS by URL
    /// parameters: ?sslmode=verify-full&sslrootcert=CA.pem (PostgreSQL),
    /// ?ssl-mode=VERIFY_IDENTITY&ssl-ca=CA.pem (MySQL)
    /// [default: sqlite:dockhand.db; for `demo`: sqlite:dockhand-demo.db; `bench` uses it only
    /// with --backend postgres or mysql].
    #[arg(
        long,
        global = true,
        env = "DOCKHAND_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// Print JSON instead of human-readable tables and messages; errors too, as one JSON
    /// object on stderr: {"error": MESSAGE, "kind": KIND, "exit": STATUS}.
    #[arg(long, global = true)]
    pub json: bool,
    /// Give up connecting to a PostgreSQL or MySQL server after this long (a refused
    /// connection or a host that does not resolve fails at once).
    #[arg(long, global = true, value_name = "DURATION", default_value = "10s",
          value_parser = args::parse_duration)]
    pub connect_timeout: Duration,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The log filter used when `RUST_LOG` is not set: `run` shows the worker's activity, `demo`
    /// only errors (log lines would break its progress bars), everything else warnings.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Run(_) | Command::Ui(_) => "warn,dockhand=info",
            // What a real run changed, job by job, on stderr (an operator's audit trail).
            Command::RecoverStuck(_) => "warn,dockhand::batch::recovery=info",
            Command::Demo(_) => "error",
            _ => "warn",
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database schema migrations (safe to repeat; only `run` and `demo` also migrate).
    Migrate,
    /// Enqueue one action, or create a recurring schedule with --every or --cron.
    Enqueue(EnqueueArgs),
    /// List actions, filtered by status, hook, group or args, one page at a time.
    List(ListArgs),
    /// Show one action's fields and its log.
    Show {
        /// The action id.
        id: i64,
    },
    /// Cancel a pending or running action.
    ///
    /// A running handler is not interrupted, but its result is discarded. When nothing changes
    /// (the action is already final) a message says why and the exit status is 0; an unknown id
    /// exits with status 1, and so does an active action a job owns (its step, finish, chunk or
    /// finalize action: cancel the job with `cancel-job`).
    Cancel {
        /// The action id.
        id: i64,
    },
    /// Put a failed or canceled action back to pending with fresh attempts.
    ///
    /// When nothing changes (the action is pending, running or complete) a message says why and
    /// the exit status is 0; an unknown id exits with status 1.
    Retry {
        /// The action id.
        id: i64,
    },
    /// Cancel pending actions and disable schedules matching a filter.
    ///
    /// At least one of --hook, --group or --args is required. Running actions finish. Actions a
    /// job owns (its step, finish, chunk or finalize action) are left alone: stop the job with
    /// `cancel-job`.
    Unschedule(FilterArgs),
    /// List recurring schedules with their recurrence and next run.
    Schedules,
    /// Queue statistics: counts by status and by group, past-due count, oldest due lag.
    Stats,
    /// Delete old finished actions and jobs now (retention, run once): complete/canceled
    /// actions and completed/skipped/cancelled jobs past --keep-finished, failed ones past
    /// --keep-failed, with their logs, lifecycle events and worklist rows; then packets no
    /// stored job references (unused for an hour). Kept: jobs whose lifecycle event is not yet
    /// delivered, batch children while their parent is stored, item claims and the
    /// tracked-items ledger (the record of what was processed).
    Prune(PruneArgs),
    /// Inspect jobs (runs of pipelines): `jobs list`, `jobs show ID`.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Inspect item claims: `claims list`.
    #[command(subcommand)]
    Claims(ClaimsCommand),
    /// Action group limits: `groups limit G --concurrency N --rate N/PERIOD` (or --clear),
    /// `groups limits`.
    #[command(subcommand)]
    Groups(GroupsCommand),
    /// Fail a job by hand through the terminal bridge, releasing its claimed items.
    ///
    /// Writes status `failed` with the reason, deletes the claims the job still holds and
    /// records the lifecycle event (a runtime's maintenance runs the on_job_failed hooks). A
    /// running step is not interrupted, but what it hands on is discarded. A batch parent is
    /// stopped as by cancel-job and ends `failed` once no child is active. An already final
    /// job: its status is printed, exit status 0; an unknown id exits with status 1.
    ManualFail {
        /// The job id.
        job: i64,
        /// The reason stored with the failure.
        #[arg(long, value_name = "R", default_value = reason::MANUAL)]
        reason: String,
    },
    /// Cancel a job by hand through the terminal bridge (reason `manual`), releasing its
    /// claimed items.
    ///
    /// Like manual-fail, with status `cancelled` (lifecycle hook: on_job_finished). A batch
    /// parent stops scheduling at once: items not yet scheduled are discarded and released,
    /// children not yet started cancelled, a running child finishes its step and starts no
    /// other; the parent ends `cancelled` once no child is active. Needs no worker. An already
    /// final job is reported with exit status 0; an unknown id exits with status 1.
    CancelJob {
        /// The job id.
        job: i64,
    },
    /// Run a worker for the built-in demo hooks until Ctrl-C or SIGTERM.
    ///
    /// Serves demo.noop, demo.sleep, demo.flaky and demo.tick, applies migrations first, and on
    /// Ctrl-C/SIGTERM stops claiming, lets in-flight actions finish and gives the rest back. It
    /// claims only actions of those hooks, so actions for other hooks on a shared queue are
    /// left to the workers that handle them.
    Run(RunArgs),
    /// Bring stranded jobs forward: pending/processing jobs that no action and no active child
    /// will move.
    ///
    /// Examines jobs unchanged for at least --older-than (lowest id first, at most --limit). A
    /// stranded batch parent is finished from its children's counters when it is fenced and
    /// every child is final, otherwise its chunk action is enqueued again; a stranded job whose
    /// step action failed for good is finished `failed` (reason `stale`); any other stranded
    /// job gets its step action enqueued again. Jobs with a pending/running action or active
    /// children are left alone. Re-enqueued actions are carried out by a runtime that
    /// registered the job's pipeline.
    ///
    /// This command has only the built-in completion handlers and no lifecycle hooks: a parent
    /// whose finish would complete claims naming another completion handler is left for a
    /// runtime that registered it (counted as left_for_handler and listed), and undelivered
    /// lifecycle events stay in the outbox for a running runtime's maintenance.
    ///
    /// Prints every counter of the report, then one row per stranded job: its status, the
    /// action, the status it ends with (predicted_status) and the reason; with --dry-run
    /// changes nothing and prints what a real run would do. A job whose recovery fails is
    /// listed with its error and the others are still recovered; the exit status is then 1.
    RecoverStuck(RecoverArgs),
    /// Show what drives each pending/processing job, and which ones are stranded.
    ///
    /// One row per job: pipeline, status, step, whether a pending/running action (step, chunk
    /// or finalize) exists, whether it is a batch parent (then its fence and active children),
    /// how long it has been unchanged, and its class: `has_scheduler_path` (an action will move
    /// it), `active_children` (no action, but its last child's terminal transaction will) or
    /// `stranded` (nothing will; see recover-stuck). Ends with the counts per class.
    Liveness(LivenessArgs),
    /// Audit the invariants of jobs, batches, item claims and actions; exit status 1 when one
    /// is broken.
    ///
    /// Looks for: claims held by final jobs, processing jobs without an action or active
    /// child, fenced batch parents whose children are all final that are neither final nor
    /// have a pending action, running actions whose lease expired more than a minute ago, and
    /// batch parent counters that differ from their children. Prints each violation
    /// (invariant, subject, detail) and exits with status 1 and a summary line when there is
    /// any; otherwise prints "all invariants hold" and exits with status 0.
    Check,
    /// Run the feed-import demo: batch fan-out over a bundled 3000-item feed, on SQLite.
    ///
    /// No server needed. Registers the pipeline `feed-import` (step `claim` claims each item of
    /// the bundled data/feed.jsonl in the shared scope `shared:feed`, skipping items already
    /// processed, and fans out one child job per new item in chunks of 100; step `process` runs
    /// in each child) and starts one job, with progress bars for the claim step, the parent
    /// (children created of items) and the children (finished of created). Then prints the
    /// counts read back from the database (items, newly processed, skipped, children, parent
    /// status, tracked-items rows, wall time) and runs `check`. The database is kept
    /// (default sqlite:dockhand-demo.db in the current directory; --database-url or
    /// DOCKHAND_DATABASE_URL choose another, PostgreSQL and MySQL included), so a second run processes
    /// nothing new and its job finishes completed_no_items; feed-import jobs an interrupted run
    /// left unfinished are finished first. Exit status 1 if the job does not succeed, an
    /// invariant is broken or --timeout passes.
    Demo(DemoArgs),
    /// Measure throughput and latency (DESIGN §10) on fresh databases; one line per workload.
    ///
    /// Each workload runs on its own new database, removed afterwards: SQLite a temporary
    /// file (WAL, synchronous=NORMAL, as the store opens it), PostgreSQL a new schema
    /// dh_bench_<random> on the server named by --database-url (or DOCKHAND_TEST_POSTGRES_URL),
    /// MySQL/MariaDB a new database of that name on the server named by --database-url (or
    /// DOCKHAND_TEST_MYSQL_URL).
    /// Workloads: W1 enqueues --n jobs with args {"n": i}, one Queue::enqueue call each,
    /// sequentially; W1b the same --n rows through one Queue::enqueue_bulk call; W2
    /// bulk-enqueues --n no-op jobs, then times a runtime with --concurrency slots (poll
    /// interval 10 ms) from start() until all are complete, and counts jobs run more than once
    /// (dup); W3 starts an idle runtime, enqueues 200 jobs one every 5 ms and reports the p50
    /// and p99 of handler start minus enqueue call start.
    ///
    /// Output, one line each on stdout (a JSON object per line with --json):
    /// peer=dockhand-sqlite workload=W2 n=10000 concurrency=8 secs=0.41 jobs_per_sec=24390
    /// dup=0 durability=sqlite-wal-synchronous-normal (W3 prints p50_ms and p99_ms instead of
    /// jobs_per_sec; durability is read back from the database:
    /// sqlite-<journal>-synchronous-<level>, pg-synchronous_commit-<value> or
    /// mysql-flush_log_at_trx_commit-N-sync_binlog-N).
    #[command(
        after_help = "Examples:\n  dockhand bench --backend sqlite\n  dockhand bench \
                            --backend postgres --database-url postgres://postgres@127.0.0.1/postgres \
                            --workload W2 --concurrency 16\n  dockhand bench --backend mysql \
                            --database-url mysql://root@127.0.0.1:3306/test --n 10000"
    )]
    Bench(BenchArgs),
    /// Run the multi-process chaos test (RELIABILITY.md §2) on a fresh database and check
    /// that nothing was lost or done twice.
    ///
    /// Starts three `dockhand chaos-worker` processes (concurrency 4, lease 2 s, heartbeat
    /// 500 ms; two with crash points, one with its clock 30 s ahead), submits a seeded
    /// workload (plain actions with retryable, fatal and panicking handlers, slow actions
    /// kept past their lease by heartbeats, item-claim jobs with 200-character ids and items
    /// requested twice, batches fanned out in chunks of 100), every side effect written to a
    /// ledger table without a unique key in its completion transaction. Meanwhile the fault
    /// schedule runs: SIGKILL of a random worker every 3-8 s (soak: 20-60 s), SIGSTOP past the lease, crash
    /// points, a worker's pool held empty, and per backend a held SQLite writer, or
    /// terminated connections, a row-lock blocker and (PostgreSQL) an immediate restart of
    /// the local cluster. Then clean workers drain, `dockhand check` and the invariants I1-I8
    /// run, and the summary goes to stdout and <out>/<backend>-<seed>/summary.{json,md}.
    /// Exit status 1 when an invariant broke or an expected fault never fired ("not
    /// exercised"). Needs a binary built with `--features failpoints` for the crash points.
    #[command(
        after_help = "Examples:\n  cargo run --features failpoints -- chaos --backend sqlite --seed 7\n  \
                            dockhand chaos --backend postgres --database-url \
                            postgres://postgres@127.0.0.1/postgres --profile soak"
    )]
    Chaos(crate::chaos::ChaosArgs),
    /// Serve the operator dashboard over HTTP until Ctrl-C or SIGTERM (needs a build with
    /// `--features ui`).
    ///
    /// Pages: overview (counts per status and group, lag), action detail (args, attempts, log;
    /// retry and cancel) and schedules (next runs; run now, enable, disable). It does not
    /// migrate. Without credentials everyone who reaches it is an operator, so it refuses an
    /// address other than loopback unless --auth or --read-only-auth is given; basic auth
    /// over plain HTTP needs a TLS proxy in front. Operator actions are logged with the target
    /// dockhand::ui::audit.
    #[command(
        after_help = "Examples:\n  dockhand ui\n  DOCKHAND_UI_AUTH=admin:secret dockhand ui --bind \
                            0.0.0.0:8080 --base-path /queue\n  dockhand ui --read-only"
    )]
    Ui(UiArgs),
    /// One worker process of `dockhand chaos` (started by it).
    #[command(hide = true)]
    ChaosWorker(crate::chaos::worker::WorkerArgs),
}

/// Runs the parsed command line to completion.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let Cli {
        database_url,
        json,
        connect_timeout,
        command,
    } = cli;
    let out = Output { json };
    let timeout = non_negative("connect_timeout", connect_timeout)?;
    match command {
        Command::Demo(a) => {
            let url = database_url.as_deref().unwrap_or(demo::DEMO_DATABASE_URL);
            crate::store::probe(url, timeout).await?;
            demo::run(url, &a, out).await
        }
        Command::Run(a) => {
            let url = database_url.as_deref().unwrap_or(DEFAULT_DATABASE_URL);
            crate::store::probe(url, timeout).await?;
            ops::run_worker(url, &a, out).await
        }
        Command::Ui(a) => {
            let url = database_url.as_deref().unwrap_or(DEFAULT_DATABASE_URL);
            crate::store::probe(url, timeout).await?;
            ui::run(url, &a, out).await
        }
        Command::Bench(a) => bench::run(database_url.as_deref(), &a, out).await,
        Command::Chaos(a) => chaos(database_url.as_deref(), &a, out).await,
        Command::ChaosWorker(a) => {
            let url = database_url.as_deref().unwrap_or(DEFAULT_DATABASE_URL);
            Ok(crate::chaos::worker::run(url, &a).await?)
        }
        other => {
            let database_url = database_url.as_deref().unwrap_or(DEFAULT_DATABASE_URL);
            if other.is_read_only() {
                args::require_existing_sqlite_file(database_url)?;
            }
            let store = crate::store::connect_timeout(database_url, timeout).await?;
            let queue = Queue::new(Arc::clone(&store));
            let result = dispatch(other, database_url, &queue, out).await;
            store.close().await;
            result
        }
    }
}

impl Command {
    /// Whether the command only reads the database: on a SQLite file that does not exist it
    /// says so instead of creating an empty database.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            Command::Stats
                | Command::List(_)
                | Command::Show { .. }
                | Command::Jobs(_)
                | Command::Claims(_)
                | Command::Groups(GroupsCommand::Limits)
                | Command::Schedules
                | Command::Check
                | Command::Liveness(_)
        )
    }
}

/// `dockhand chaos`: one run; prints the summary, fails unless it passed.
async fn chaos(
    server: Option<&str>,
    a: &crate::chaos::ChaosArgs,
    out: Output,
) -> Result<(), CliError> {
    if !crate::failpoint::ENABLED {
        return Err(CliError::Failed(
            "dockhand chaos needs the crash points: build with --features failpoints".into(),
        ));
    }
    let summary = crate::chaos::run(server, a).await?;
    let passed = summary.result == "passed";
    let result = summary.result.clone();
    out.emit(&summary, || summary.markdown())?;
    if passed {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "chaos run {result} (backend {:?}, seed {}); replay with the same --seed",
            a.backend, a.seed
        )))
    }
}

async fn dispatch(command: Command, url: &str, q: &Queue, out: Output) -> Result<(), CliError> {
    match command {
        Command::Migrate => ops::migrate(url, q, out).await,
        Command::Enqueue(a) => actions::enqueue(q, a, out).await,
        Command::List(a) => actions::list(q, &a, out).await,
        Command::Show { id } => actions::show(q, id, out).await,
        Command::Cancel { id } => actions::cancel(q, id, out).await,
        Command::Retry { id } => actions::retry(q, id, out).await,
        Command::Unschedule(f) => schedules::unschedule(q, &f, out).await,
        Command::Schedules => schedules::schedules(q, out).await,
        Command::Stats => ops::stats(q, out).await,
        Command::Prune(a) => ops::prune(q, &a, out).await,
        Command::Jobs(c) => jobs::run(q, c, out).await,
        Command::Claims(c) => claims::run(q, c, out).await,
        Command::Groups(c) => groups::run(q, c, out).await,
        Command::ManualFail { job, reason } => {
            jobs::finish_by_hand(q, job, JobStatus::Failed, &reason, out).await
        }
        Command::CancelJob { job } => {
            jobs::finish_by_hand(q, job, JobStatus::Cancelled, reason::MANUAL, out).await
        }
        Command::RecoverStuck(a) => recovery::recover_stuck(q, &a, out).await,
        Command::Liveness(a) => recovery::liveness(q, &a, out).await,
        Command::Check => recovery::check(q, out).await,
        // These open their own runtime or databases; `run` never routes them here.
        Command::Run(_)
        | Command::Ui(_)
        | Command::Demo(_)
        | Command::Bench(_)
        | Command::Chaos(_)
        | Command::ChaosWorker(_) => Err(CliError::Failed(
            "internal error: command dispatched without its runtime".into(),
        )),
    }
}

#[cfg(test)]
mod tests;
