//! Commands on single actions: `enqueue` (one-off; recurring forms go to `schedules`), `list`,
//! `show`, `cancel` and `retry`.

use super::args::{fmt_time, fmt_time_ms, format_exact, non_negative, relative};
use super::table::{key_values, truncate, Table};
use super::{CliError, EnqueueArgs, ListArgs, Output};
use crate::action::{parse_args, ActionQuery};
use crate::state::{ActionStatus, ActionTransition};
use crate::{ActionSpec, Error, Queue, Recurrence};
use chrono::{DateTime, Utc};
use serde_json::json;

/// `dockhand enqueue`: one action, or a schedule when `--every` or `--cron` is given.
pub(crate) async fn enqueue(q: &Queue, a: EnqueueArgs, out: Output) -> Result<(), CliError> {
    let args = parse_args(&super::args::read_args(&a.args)?)?;
    let timeout = a.timeout.map(|d| non_negative("timeout", d)).transpose()?;
    let recurrence = match (a.every, &a.cron) {
        (Some(every), _) if a.fixed_delay => Some(Recurrence::every_after_finish(every)?),
        (Some(every), _) => Some(Recurrence::every(every)?),
        (None, Some(expr)) => {
            let tz = a.timezone.clone().unwrap_or_else(|| "UTC".into());
            Some(Recurrence::cron(expr.clone(), tz)?)
        }
        (None, None) => None,
    };
    if let Some(recurrence) = recurrence {
        return super::schedules::enqueue_schedule(q, a, args, recurrence, timeout, out).await;
    }
    let hook = a.hook.ok_or_else(|| {
        Error::invalid(
            "hook",
            "give the hook to run (or --pipeline with --every/--cron)",
        )
    })?;
    let mut spec = ActionSpec::new(hook, args)
        .priority(a.priority)
        .max_attempts(a.max_attempts);
    if let Some(g) = a.group {
        spec = spec.group(g);
    }
    if let Some(at) = a.at {
        spec = spec.at(at);
    }
    if let Some(d) = a.delay {
        spec = spec.after(d);
    }
    if let Some(t) = timeout {
        spec = spec.timeout(t);
    }
    if a.unique {
        spec = spec.unique();
    }
    let r = q.enqueue_detailed(spec).await?;
    let action = q.get(r.id).await?;
    let now = q.clock().now();
    out.emit(
        &json!({"id": r.id, "inserted": r.inserted, "action": &action}),
        || {
            if r.inserted {
                format!(
                    "enqueued action {}: {} due {}{}",
                    action.id,
                    action.hook,
                    fmt_time(action.scheduled_at),
                    relative(action.scheduled_at, now)
                )
            } else {
                format!(
                    "not enqueued: action {} ({}) already has the same hook, args and group",
                    action.id, action.status
                )
            }
        },
    )
}

/// `dockhand list`.
pub(crate) async fn list(q: &Queue, a: &ListArgs, out: Output) -> Result<(), CliError> {
    let query = ActionQuery {
        filter: a.filter.to_filter()?,
        statuses: a.status.clone(),
        limit: a.page.limit,
        offset: a.page.offset,
        order: a.order,
        ..ActionQuery::default()
    };
    let rows = q.query(&query).await?;
    out.emit(&rows, || {
        if rows.is_empty() {
            return "no actions match".into();
        }
        let mut t = Table::new(&[
            "ID",
            "HOOK",
            "STATUS",
            "GROUP",
            "PRIO",
            "SCHEDULED_AT",
            "ATTEMPT",
            "LAST_ERROR",
        ])
        .right_align(&[0, 4, 6]);
        for r in &rows {
            t.row(vec![
                r.id.to_string(),
                truncate(&r.hook, 40),
                r.status.to_string(),
                truncate(r.group.as_deref().unwrap_or("-"), 24),
                r.priority.to_string(),
                fmt_time(r.scheduled_at),
                format!("{}/{}", r.attempt, r.max_attempts),
                truncate(r.last_error.as_deref().unwrap_or(""), 50),
            ]);
        }
        let mut text = t.render();
        if let Some(note) = a.page.next_page_note(rows.len()) {
            text.push_str(&note);
        }
        text
    })
}

/// `dockhand show ID`.
pub(crate) async fn show(q: &Queue, id: i64, out: Output) -> Result<(), CliError> {
    let a = q.get(id).await?;
    let log = q.logs(id).await?;
    out.emit(&json!({"action": &a, "log": &log}), || {
        let opt_time = |t: Option<DateTime<Utc>>| t.map(fmt_time_ms).unwrap_or_else(|| "-".into());
        let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
        let mut text = key_values(&[
            ("id", a.id.to_string()),
            ("hook", a.hook.clone()),
            ("status", a.status.to_string()),
            ("args", a.args.to_string()),
            ("group", opt(&a.group)),
            ("priority", a.priority.to_string()),
            ("scheduled_at", fmt_time_ms(a.scheduled_at)),
            ("attempt", format!("{} of {}", a.attempt, a.max_attempts)),
            (
                "timeout",
                a.timeout_ms
                    .map(format_exact)
                    .unwrap_or_else(|| "default".into()),
            ),
            ("unique_key", opt(&a.unique_key)),
            (
                "schedule_id",
                a.schedule_id
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "-".into()),
            ),
            ("lease_owner", opt(&a.lease_owner)),
            ("lease_until", opt_time(a.lease_until)),
            ("lease_token", a.lease_token.to_string()),
            ("created_at", fmt_time_ms(a.created_at)),
            ("finished_at", opt_time(a.finished_at)),
            ("last_error", opt(&a.last_error)),
        ]);
        text.push_str("\nlog:\n");
        if log.is_empty() {
            text.push_str("  (empty)\n");
        } else {
            let mut t = Table::new(&["AT", "EVENT", "DETAIL"]);
            for l in &log {
                let detail = l.detail.as_deref().unwrap_or("");
                t.row(vec![
                    fmt_time_ms(l.at),
                    l.event.clone(),
                    truncate(detail, 120),
                ]);
            }
            text.push_str(&t.render());
        }
        text
    })
}

/// `dockhand cancel ID`.
pub(crate) async fn cancel(q: &Queue, id: i64, out: Output) -> Result<(), CliError> {
    let before = q.get(id).await?;
    let changed = q.cancel(id).await?;
    let after = q.get(id).await?;
    let message = if changed {
        let note = if before.status == ActionStatus::Running {
            " (its handler may still finish, but its result is discarded)"
        } else {
            ""
        };
        format!("canceled action {id}{note}")
    } else if ActionTransition::Cancel.allowed_from(after.status) {
        format!(
            "action {id} was not canceled: it changed while canceling (now {}); try again",
            after.status
        )
    } else {
        format!(
            "action {id} is {}; only pending or running actions can be canceled",
            after.status
        )
    };
    report_change(out, id, changed, after.status, message)
}

/// `dockhand retry ID`.
pub(crate) async fn retry(q: &Queue, id: i64, out: Output) -> Result<(), CliError> {
    q.get(id).await?;
    let changed = q.retry(id).await?;
    let after = q.get(id).await?;
    let message = if changed {
        format!(
            "action {id} is pending again with fresh attempts, due {}",
            fmt_time(after.scheduled_at)
        )
    } else if ActionTransition::OperatorRetry.allowed_from(after.status) {
        format!(
            "action {id} was not retried: it changed meanwhile (now {}); try again",
            after.status
        )
    } else {
        format!(
            "action {id} is {}; only failed or canceled actions can be retried",
            after.status
        )
    };
    report_change(out, id, changed, after.status, message)
}

fn report_change(
    out: Output,
    id: i64,
    changed: bool,
    status: ActionStatus,
    message: String,
) -> Result<(), CliError> {
    out.emit(
        &json!({"id": id, "changed": changed, "status": status, "message": &message}),
        || message.clone(),
    )
}
