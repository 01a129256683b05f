//! Commands on jobs (runs of pipelines): `jobs list`, `jobs show`, and the two operator
//! finishes `manual-fail` and `cancel-job`, which go through the terminal bridge.

use super::args::{self, fmt_time, fmt_time_ms};
use super::claims::claim_expiry;
use super::table::{key_values, truncate, Table};
use super::{CliError, Output, PageArgs};
use crate::action::{Action, ActionFilter, ActionOrder, ActionQuery};
use crate::claims::{ClaimFilter, ClaimStatus, ItemClaim};
use crate::jobs::{Job, JobFilter, STEP_HOOK};
use crate::state::{ActionStatus, JobStatus};
use crate::store::DynStore;
use crate::{Error, Jobs, Queue};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::{json, Value};

/// Most claims `jobs show` lists for one job.
const SHOW_CLAIMS_LIMIT: i64 = 1_000;
/// Most actions `jobs show` lists for one step (one per run of the step).
const SHOW_ACTIONS_PER_STEP: i64 = 100;

/// The `dockhand jobs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first, filtered by status and pipeline, one page at a time.
    List(JobListArgs),
    /// Show one job: its fields, engine data, item claims and the attempts of its step actions.
    ///
    /// Step actions are the `dockhand.job.step` actions with args {"job": ID, "step": N}, for
    /// every step up to the job's step index. An unknown id exits with status 1.
    Show {
        /// The job id.
        id: i64,
    },
}

/// Options of `dockhand jobs list`.
#[derive(Debug, Args)]
pub struct JobListArgs {
    /// Only this status (repeatable, or comma-separated): pending, processing, waiting,
    /// completed, completed_no_items, skipped, failed, cancelled.
    #[arg(long, value_name = "S", value_parser = args::parse_job_status, value_delimiter = ',')]
    pub status: Vec<JobStatus>,
    /// Only jobs of this pipeline.
    #[arg(long, value_name = "P")]
    pub pipeline: Option<String>,
    /// Page size and rows to skip.
    #[command(flatten)]
    pub page: PageArgs,
}

/// Runs a `dockhand jobs` subcommand.
pub(crate) async fn run(q: &Queue, command: JobsCommand, out: Output) -> Result<(), CliError> {
    match command {
        JobsCommand::List(a) => list(q, &a, out).await,
        JobsCommand::Show { id } => show(q, id, out).await,
    }
}

/// The job, or `job ID not found`.
pub(crate) async fn get_job(store: &DynStore, id: i64) -> Result<Job, Error> {
    store
        .get_job(id)
        .await?
        .ok_or(Error::NotFound { what: "job", id })
}

/// The actions that run step `step` of job `job`.
fn step_query(job: i64, step: i32) -> ActionQuery {
    ActionQuery {
        filter: ActionFilter {
            hook: Some(STEP_HOOK.to_string()),
            args: Some(json!({"job": job, "step": step})),
            group: None,
        },
        ..ActionQuery::default()
    }
}

fn opt_time(t: Option<DateTime<Utc>>, f: fn(DateTime<Utc>) -> String) -> String {
    t.map(f).unwrap_or_else(|| "-".into())
}

/// `dockhand jobs list`.
async fn list(q: &Queue, a: &JobListArgs, out: Output) -> Result<(), CliError> {
    let filter = JobFilter {
        pipeline: a.pipeline.clone(),
        statuses: a.status.clone(),
        limit: a.page.limit,
        offset: a.page.offset,
    };
    let rows = q.store().list_jobs(&filter).await?;
    out.emit(&rows, || {
        if rows.is_empty() {
            return "no jobs match".into();
        }
        let mut t = Table::new(&[
            "ID",
            "PIPELINE",
            "STATUS",
            "REASON",
            "STEP",
            "CREATED_AT",
            "FINISHED_AT",
        ])
        .right_align(&[0, 4]);
        for j in &rows {
            t.row(vec![
                j.id.to_string(),
                truncate(&j.pipeline, 32),
                j.status.to_string(),
                truncate(j.reason.as_deref().unwrap_or("-"), 32),
                j.step_index.to_string(),
                fmt_time(j.created_at),
                opt_time(j.finished_at, fmt_time),
            ]);
        }
        let mut text = t.render();
        if let Some(note) = a.page.next_page_note(rows.len()) {
            text.push_str(&note);
        }
        text
    })
}

/// The actions that ran one step of a job.
#[derive(Debug, Serialize)]
struct StepActions {
    step: i32,
    actions: Vec<Action>,
}

/// `dockhand jobs show ID`.
async fn show(q: &Queue, id: i64, out: Output) -> Result<(), CliError> {
    let store = q.store();
    let job = get_job(store, id).await?;
    let (data, version) = store
        .engine_data(id)
        .await?
        .ok_or(Error::NotFound { what: "job", id })?;
    let claims = store
        .list_claims(&ClaimFilter {
            job_id: Some(id),
            limit: SHOW_CLAIMS_LIMIT,
            ..ClaimFilter::default()
        })
        .await?;
    let mut steps = Vec::new();
    for step in 0..=job.step_index {
        let query = ActionQuery {
            limit: SHOW_ACTIONS_PER_STEP,
            order: ActionOrder::IdAsc,
            ..step_query(id, step)
        };
        steps.push(StepActions {
            step,
            actions: q.query(&query).await?,
        });
    }
    let value = json!({
        "job": &job,
        "engine_data": {"version": version, "data": &data},
        "claims": &claims,
        "steps": &steps,
    });
    out.emit(&value, || {
        let now = q.clock().now();
        let mut text = job_fields(&job);
        text.push_str(&format!("\nengine data (version {version}):\n"));
        text.push_str(&indent(&pretty(&data)));
        text.push_str(&format!("\nclaims ({}):\n", claims.len()));
        text.push_str(&claims_table(&claims, now));
        if claims.len() as i64 == SHOW_CLAIMS_LIMIT {
            text.push_str(&format!(
                "(first {SHOW_CLAIMS_LIMIT} shown; see `dockhand claims list --job {id}`)\n"
            ));
        }
        text.push_str("\nstep actions:\n");
        text.push_str(&steps_table(&job, &steps));
        text
    })
}

fn job_fields(job: &Job) -> String {
    let refs = match job.input_refs.len() {
        0 => "-".to_string(),
        n => truncate(&format!("{n}: {}", job.input_refs.join(", ")), 100),
    };
    key_values(&[
        ("id", job.id.to_string()),
        ("pipeline", job.pipeline.clone()),
        ("status", job.status.to_string()),
        ("reason", job.reason.clone().unwrap_or_else(|| "-".into())),
        ("step_index", job.step_index.to_string()),
        ("input_refs", refs),
        ("engine_version", job.engine_version.to_string()),
        (
            "parent_id",
            job.parent_id
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        ("created_at", fmt_time_ms(job.created_at)),
        ("updated_at", fmt_time_ms(job.updated_at)),
        ("finished_at", opt_time(job.finished_at, fmt_time_ms)),
    ])
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

fn claims_table(claims: &[ItemClaim], now: DateTime<Utc>) -> String {
    if claims.is_empty() {
        return "  (none)\n".into();
    }
    let mut t = Table::new(&["SCOPE", "SOURCE", "ITEM", "STATUS", "CLAIMED_AT", "EXPIRES"]);
    for c in claims {
        t.row(vec![
            truncate(&c.identity.scope, 32),
            truncate(&c.identity.source_type, 16),
            truncate(&c.identity.item_id, 40),
            c.status.to_string(),
            opt_time(c.claimed_at, fmt_time),
            claim_expiry(c, now),
        ]);
    }
    t.render()
}

fn steps_table(job: &Job, steps: &[StepActions]) -> String {
    let mut t = Table::new(&[
        "STEP",
        "ACTION",
        "STATUS",
        "ATTEMPT",
        "SCHEDULED_AT",
        "FINISHED_AT",
        "LAST_ERROR",
    ])
    .right_align(&[0, 1, 3]);
    let mut notes = String::new();
    for s in steps {
        if s.actions.is_empty() {
            t.row(vec![s.step.to_string(), "-".into(), "-".into()]);
            let why = if s.step == job.step_index && job.status == JobStatus::Waiting {
                "the job is parked until resumed"
            } else {
                "not enqueued, or pruned by retention"
            };
            notes.push_str(&format!("step {} has no action: {why}\n", s.step));
        }
        for a in &s.actions {
            t.row(vec![
                s.step.to_string(),
                a.id.to_string(),
                a.status.to_string(),
                format!("{}/{}", a.attempt, a.max_attempts),
                fmt_time(a.scheduled_at),
                opt_time(a.finished_at, fmt_time),
                truncate(a.last_error.as_deref().unwrap_or(""), 60),
            ]);
        }
    }
    if t.is_empty() {
        return "  (none)\n".into();
    }
    t.render() + &notes
}

/// `dockhand manual-fail` and `dockhand cancel-job`: finishes the job with `status` through the
/// batch-aware operator stop every surface shares ([`crate::Jobs::cancel`],
/// [`crate::Jobs::manual_fail`]), from the store alone. Already final: says so, exit 0. Unknown
/// id: `job ID not found`, exit 1.
pub(crate) async fn finish_by_hand(
    q: &Queue,
    id: i64,
    status: JobStatus,
    reason: &str,
    out: Output,
) -> Result<(), CliError> {
    if reason.trim().is_empty() {
        return Err(Error::invalid("reason", "must not be empty").into());
    }
    let store = q.store();
    let before = get_job(store, id).await?;
    // Counted before the stop deletes them (a step still running could take more meanwhile).
    let held = if before.status.is_final() {
        0
    } else {
        let filter = ClaimFilter {
            job_id: Some(id),
            status: Some(ClaimStatus::Claimed),
            limit: 100_000,
            ..ClaimFilter::default()
        };
        store.list_claims(&filter).await?.len()
    };
    let jobs = Jobs::without_pipelines(store.clone(), q.clock().clone());
    let done = match status {
        JobStatus::Cancelled => jobs.cancel(id).await?,
        _ => jobs.finish(id, status, Some(reason)).await?,
    };
    let standing = match &done.reason {
        Some(r) => format!("{} (reason: {r})", done.status),
        None => done.status.to_string(),
    };
    let batch = if done.status.is_final() {
        None
    } else {
        jobs.batch_state(id).await?
    };
    let message = if let Some(st) = &batch {
        format!(
            "job {id} ({}) is a batch parent: scheduling stopped, items not yet scheduled were              discarded and their claims released, children not yet started were cancelled; it              becomes {status} once its {} running child(ren) finish their step",
            before.pipeline,
            st.active_children()
        )
    } else if done.changed {
        let running_step = ActionQuery {
            statuses: vec![ActionStatus::Running],
            limit: 1,
            ..step_query(id, before.step_index)
        };
        let running = if q.query(&running_step).await?.is_empty() {
            ""
        } else {
            "; its running step is not interrupted, but what it hands on is discarded"
        };
        let released = match held {
            0 => "it held no item claims".to_string(),
            n => format!("released its {n} claimed item(s)"),
        };
        format!(
            "job {id} ({}) was {} and is now {standing}; {released}{running}",
            before.pipeline, before.status
        )
    } else if done.status == status {
        format!("job {id} was already {standing}; nothing changed")
    } else {
        format!(
            "job {id} is already {standing}; a final status never changes, so it was not {status}"
        )
    };
    out.emit(
        &json!({
            "id": id,
            "changed": done.changed,
            "status": done.status,
            "reason": &done.reason,
            "previous_status": before.status,
            "released_claims": if done.changed { held } else { 0 },
            "active_children": batch.as_ref().map(|st| st.active_children()),
            "message": &message,
        }),
        || message.clone(),
    )
}
