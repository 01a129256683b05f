//! Commands on recurring schedules: `enqueue --every/--cron` (create or update a schedule),
//! `unschedule` and `schedules`.

use super::args::{fmt_time, format_exact, relative};
use super::table::{truncate, Table};
use super::{CliError, EnqueueArgs, FilterArgs, Output};
use crate::action::ActionFilter;
use crate::schedule::{recurrence_columns, Schedule, ScheduleSpec};
use crate::{Error, Queue, Recurrence};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

/// `dockhand enqueue --every …` or `--cron …`: creates or updates a schedule.
pub(crate) async fn enqueue_schedule(
    q: &Queue,
    a: EnqueueArgs,
    args: Value,
    recurrence: Recurrence,
    timeout: Option<std::time::Duration>,
    out: Output,
) -> Result<(), CliError> {
    let mut spec = match (a.pipeline, a.hook) {
        (Some(pipeline), _) => {
            let name = a.name.clone().ok_or_else(|| {
                Error::invalid(
                    "name",
                    "a pipeline schedule needs --name (it keys its jobs)",
                )
            })?;
            let spec = ScheduleSpec::pipeline(name, pipeline, args, recurrence);
            if a.no_overlap {
                spec.no_overlap()
            } else {
                spec
            }
        }
        (None, Some(hook)) => ScheduleSpec::new(hook, args, recurrence),
        (None, None) => {
            return Err(Error::invalid("hook", "give the hook to run or --pipeline").into())
        }
    }
    .priority(a.priority)
    .max_attempts(a.max_attempts);
    if let Some(g) = a.group {
        spec = spec.group(g);
    }
    if let Some(t) = timeout {
        spec = spec.timeout(t);
    }
    if let Some(n) = a.name {
        spec = spec.name(n);
    }
    let first = match (a.at, a.delay) {
        (Some(at), _) => Some(at),
        (None, Some(d)) if d < chrono::Duration::zero() => {
            return Err(Error::invalid("delay", "must not be negative").into())
        }
        (None, Some(d)) => Some(
            q.clock()
                .now()
                .checked_add_signed(d)
                .ok_or_else(|| Error::invalid("delay", "out of range"))?,
        ),
        (None, None) => None,
    };
    if let Some(at) = first {
        spec = spec.starting_at(at);
    }
    let id = q.schedule(spec).await?;
    let s = q
        .schedules()
        .await?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or(Error::NotFound {
            what: "schedule",
            id,
        })?;
    let now = q.clock().now();
    out.emit(&ScheduleView::from(&s), || {
        format!(
            "schedule {}: {} {}, next run {}",
            s.id,
            s.hook,
            describe(&s.recurrence),
            next_run(&s, now)
        )
    })
}

/// `dockhand unschedule`.
pub(crate) async fn unschedule(q: &Queue, f: &FilterArgs, out: Output) -> Result<(), CliError> {
    if f.is_empty() {
        return Err(Error::invalid(
            "filter",
            "give at least one of --hook, --group or --args (refusing to unschedule everything)",
        )
        .into());
    }
    let filter = f.to_filter()?;
    let schedules = q
        .schedules()
        .await?
        .iter()
        .filter(|s| s.enabled && schedule_matches(s, &filter))
        .count();
    let canceled = q.unschedule_all(&filter).await?;
    out.emit(
        &json!({"canceled_actions": canceled, "disabled_schedules": schedules}),
        || format!("canceled {canceled} pending action(s); disabled {schedules} schedule(s)"),
    )
}

fn schedule_matches(s: &Schedule, f: &ActionFilter) -> bool {
    f.hook.as_ref().map_or(true, |h| *h == s.hook)
        && f.group
            .as_deref()
            .map_or(true, |g| s.group.as_deref() == Some(g))
        && f.args.as_ref().map_or(true, |a| *a == s.args)
}

/// `dockhand schedules`.
pub(crate) async fn schedules(q: &Queue, out: Output) -> Result<(), CliError> {
    let all = q.schedules().await?;
    let now = q.clock().now();
    let views: Vec<ScheduleView<'_>> = all.iter().map(ScheduleView::from).collect();
    out.emit(&views, || {
        if all.is_empty() {
            return "no schedules".into();
        }
        let mut t = Table::new(&[
            "ID",
            "NAME",
            "HOOK",
            "GROUP",
            "RECURRENCE",
            "ENABLED",
            "NEXT_RUN",
        ])
        .right_align(&[0]);
        for s in &all {
            t.row(vec![
                s.id.to_string(),
                truncate(&s.name, 24),
                truncate(&s.hook, 40),
                truncate(s.group.as_deref().unwrap_or("-"), 24),
                describe(&s.recurrence),
                if s.enabled { "yes" } else { "no" }.into(),
                next_run(s, now),
            ]);
        }
        t.render()
    })
}

/// A schedule as `--json` prints it: the recurrence spelled out in plain fields.
#[derive(Debug, Serialize)]
struct ScheduleView<'a> {
    id: i64,
    name: &'a str,
    hook: &'a str,
    args: &'a Value,
    group: Option<&'a str>,
    priority: i32,
    max_attempts: i32,
    timeout_ms: Option<i64>,
    kind: &'static str,
    every_ms: Option<i64>,
    fixed_delay: bool,
    cron: Option<&'a str>,
    timezone: Option<&'a str>,
    next_run_at: Option<DateTime<Utc>>,
    enabled: bool,
}

impl<'a> From<&'a Schedule> for ScheduleView<'a> {
    fn from(s: &'a Schedule) -> Self {
        let (kind, every_ms, fixed_delay, cron, timezone) = recurrence_columns(&s.recurrence);
        Self {
            id: s.id,
            name: &s.name,
            hook: &s.hook,
            args: &s.args,
            group: s.group.as_deref(),
            priority: s.priority,
            max_attempts: s.max_attempts,
            timeout_ms: s.timeout_ms,
            kind,
            every_ms,
            fixed_delay,
            cron,
            timezone,
            next_run_at: s.next_run_at,
            enabled: s.enabled,
        }
    }
}

/// `every 30s`, `every 30s after each finish`, `cron "0 9 * * *" Europe/Paris`.
fn describe(r: &Recurrence) -> String {
    match r {
        Recurrence::Interval { every, fixed_delay } => format!(
            "every {}{}",
            format_exact(every.num_milliseconds()),
            if *fixed_delay {
                " after each finish"
            } else {
                ""
            }
        ),
        Recurrence::Cron { expr, timezone } => format!("cron \"{expr}\" {timezone}"),
    }
}

fn next_run(s: &Schedule, now: DateTime<Utc>) -> String {
    match (s.enabled, s.next_run_at) {
        (false, _) => "- (disabled)".into(),
        (true, Some(t)) => format!("{}{}", fmt_time(t), relative(t, now)),
        (true, None) => "when the outstanding run finishes".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_recurrences() {
        let r = Recurrence::every(chrono::Duration::seconds(90)).unwrap();
        assert_eq!(describe(&r), "every 1m30s");
        let r = Recurrence::cron("0 9 * * *", "Europe/Paris").unwrap();
        assert_eq!(describe(&r), "cron \"0 9 * * *\" Europe/Paris");
    }
}
