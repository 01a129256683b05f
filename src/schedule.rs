//! Recurring schedules (Q7): interval (fixed-rate or fixed-delay) and cron with an IANA timezone.
//!
//! A schedule is a row of its own. The maintenance scheduler materialises each occurrence as an
//! ordinary action, in one transaction with a compare-and-swap on the schedule's `next_run_at`,
//! so a crash, a failure or two schedulers at once neither lose nor double an occurrence.
//!
//! Rules decided here:
//! - Fixed-rate intervals are anchored: occurrences are `first + k * every`, so there is no drift.
//!   After downtime the missed occurrences collapse into one late run, then the series goes on
//!   from the next anchored time after now (as Oban and Sidekiq do; no burst of catch-up runs).
//! - Fixed-delay intervals start the next occurrence `every` after the previous one finished (any
//!   final status: a failure never ends a series).
//! - Cron takes 5 fields (minute precision) or 6 (leading seconds). Times are computed in the
//!   schedule's timezone, so `0 9 * * *` in `Europe/Paris` is 09:00 local on both sides of a DST
//!   change. A local time skipped by a spring-forward gap does not fire that day; a time repeated
//!   by a fall-back fires once (the first).

use crate::action::{encode_args, validate_name, ActionSpec, PreparedAction};
use crate::error::{Error, Result};
use crate::jobs::scheduled::{ScheduledStartArgs, SCHEDULED_START_HOOK};
use chrono::{DateTime, Duration, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use serde_json::Value;
use std::str::FromStr;

/// How a schedule recurs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Recurrence {
    /// Every `every`, anchored at the first run (fixed-rate) or after each finish (fixed-delay).
    Interval {
        /// The period.
        every: Duration,
        /// Start the next occurrence `every` after the previous one finished.
        fixed_delay: bool,
    },
    /// A cron expression evaluated in an IANA timezone.
    Cron {
        /// The expression as given (5 or 6 fields).
        expr: String,
        /// The IANA timezone name, e.g. `Europe/Paris`.
        timezone: String,
    },
}

impl Recurrence {
    /// A fixed-rate interval; refuses zero or negative periods.
    pub fn every(every: Duration) -> Result<Self> {
        if every <= Duration::zero() {
            return Err(Error::invalid("interval", "must be positive"));
        }
        Ok(Recurrence::Interval {
            every,
            fixed_delay: false,
        })
    }

    /// A fixed-delay interval; refuses zero or negative periods.
    pub fn every_after_finish(every: Duration) -> Result<Self> {
        if every <= Duration::zero() {
            return Err(Error::invalid("interval", "must be positive"));
        }
        Ok(Recurrence::Interval {
            every,
            fixed_delay: true,
        })
    }

    /// A cron expression in a timezone; both are checked now.
    pub fn cron(expr: impl Into<String>, timezone: impl Into<String>) -> Result<Self> {
        let r = Recurrence::Cron {
            expr: expr.into(),
            timezone: timezone.into(),
        };
        r.validate()?;
        Ok(r)
    }

    /// Re-checks the recurrence (after decoding from storage, or when built by hand).
    pub fn validate(&self) -> Result<()> {
        match self {
            Recurrence::Interval { every, .. } if *every <= Duration::zero() => {
                Err(Error::invalid("interval", "must be positive"))
            }
            Recurrence::Interval { .. } => Ok(()),
            Recurrence::Cron { expr, timezone } => {
                parse_cron(expr)?;
                parse_timezone(timezone)?;
                Ok(())
            }
        }
    }

    /// The first occurrence strictly after `after` for a cron, or `after + every` for
    /// intervals. Returns `None` when a cron expression has no future occurrence.
    pub fn first_after(&self, after: DateTime<Utc>) -> Result<Option<DateTime<Utc>>> {
        match self {
            Recurrence::Interval { every, .. } => Ok(after.checked_add_signed(*every)),
            Recurrence::Cron { expr, timezone } => {
                let schedule = parse_cron(expr)?;
                let tz = parse_timezone(timezone)?;
                Ok(schedule
                    .after(&after.with_timezone(&tz))
                    .next()
                    .map(|t| t.with_timezone(&Utc)))
            }
        }
    }

    /// The occurrence that follows `occurrence` once it has been materialised at time `now`:
    /// the next anchored time strictly after both. `None` for fixed-delay schedules (their next
    /// time is set when the occurrence finishes) and for crons with no future occurrence.
    pub fn next_after_occurrence(
        &self,
        occurrence: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>> {
        match self {
            Recurrence::Interval {
                fixed_delay: true, ..
            } => Ok(None),
            Recurrence::Interval { every, .. } => {
                let step = every.num_milliseconds().max(1);
                let behind = (now - occurrence).num_milliseconds();
                // Skip whole periods that are already past, so downtime yields one late run.
                let skip = if behind > 0 { behind / step + 1 } else { 1 };
                let jump = step
                    .checked_mul(skip)
                    .ok_or_else(|| Error::invalid("interval", "overflow"))?;
                Ok(occurrence.checked_add_signed(Duration::milliseconds(jump)))
            }
            Recurrence::Cron { .. } => self.first_after(occurrence.max(now)),
        }
    }

    /// The next `n` occurrences after `after` (for display).
    pub fn upcoming(&self, after: DateTime<Utc>, n: usize) -> Result<Vec<DateTime<Utc>>> {
        let mut out = Vec::with_capacity(n);
        let mut t = after;
        while out.len() < n {
            match self.first_after(t)? {
                Some(next) => {
                    out.push(next);
                    t = next;
                }
                None => break,
            }
        }
        Ok(out)
    }
}

/// Parses a 5-field (minute precision) or 6-field (with seconds) cron expression. The day of
/// week follows Unix cron (0 and 7 = Sunday, `1-5` = Monday to Friday), not the `cron`
/// crate's numbering (1 = Sunday); see `cron_dow`.
pub fn parse_cron(expr: &str) -> Result<cron::Schedule> {
    let fields = expr.split_whitespace().count();
    let parts: Vec<&str> = expr.split_whitespace().collect();
    // The day of week is read as Unix cron reads it (1-5 = Monday to Friday): see cron_dow.
    let dow = |i: usize| {
        parts
            .get(i)
            .map(|f| crate::cron_dow::translate(f))
            .transpose()
            .map_err(|e| match e {
                Error::InvalidInput { field, message } => {
                    Error::invalid(field, format!("`{expr}`: {message}"))
                }
                other => other,
            })
    };
    let full = match fields {
        5 => format!("0 {} {}", parts[..4].join(" "), dow(4)?.unwrap_or_default()),
        6 => format!("{} {}", parts[..5].join(" "), dow(5)?.unwrap_or_default()),
        n => {
            return Err(Error::invalid(
                "cron",
                format!(
                "`{expr}` has {n} fields; expected 5 (m h dom mon dow) or 6 (s m h dom mon dow)"
            ),
            ))
        }
    };
    cron::Schedule::from_str(&full).map_err(|e| {
        // The cron crate's message spans several lines with a caret; keep one line.
        let detail = e
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Error::invalid("cron", format!("`{expr}`: {detail}"))
    })
}

/// Parses an IANA timezone name; an unknown name is an error, never silently UTC.
pub fn parse_timezone(name: &str) -> Result<Tz> {
    name.parse::<Tz>()
        .map_err(|_| Error::invalid("timezone", format!("unknown IANA timezone `{name}`")))
}

/// A schedule to create or update: what each occurrence runs and how it recurs.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    pub(crate) name: Option<String>,
    /// The template every occurrence is enqueued from (its time and unique key are set per
    /// occurrence).
    pub(crate) action: ActionSpec,
    pub(crate) recurrence: Recurrence,
    pub(crate) first_run: Option<DateTime<Utc>>,
    /// Pipeline schedules only: skip an occurrence while the previous job is not final.
    pub(crate) no_overlap: bool,
}

impl ScheduleSpec {
    /// A schedule for `hook` with `args` recurring as `recurrence`.
    pub fn new(hook: impl Into<String>, args: Value, recurrence: Recurrence) -> Self {
        Self {
            name: None,
            action: ActionSpec::new(hook, args),
            recurrence,
            first_run: None,
            no_overlap: false,
        }
    }

    /// A schedule named `name` whose occurrences each start a job of `pipeline` with `input`
    /// (the pipeline must be registered on the runtimes that should run it: the occurrence is
    /// routed like the pipeline's steps). At most one job per occurrence, however often the
    /// occurrence's action runs (its idempotency key is `schedule:<name>:<occurrence ms>`);
    /// see [`ScheduleSpec::no_overlap`].
    ///
    /// ```
    /// use dockhand::{Recurrence, ScheduleSpec};
    /// use serde_json::json;
    ///
    /// # fn demo() -> dockhand::Result<()> {
    /// let nightly = ScheduleSpec::pipeline(
    ///     "nightly-import",
    ///     "import",
    ///     json!({"feed": "https://example.com/feed.xml"}),
    ///     Recurrence::cron("0 2 * * *", "Europe/Paris")?,
    /// )
    /// .no_overlap();
    /// # let _ = nightly; Ok(()) }
    /// ```
    pub fn pipeline(
        name: impl Into<String>,
        pipeline: impl Into<String>,
        input: Value,
        recurrence: Recurrence,
    ) -> Self {
        let pipeline = pipeline.into();
        let group = crate::jobs::StepAction::group_for(&pipeline);
        let args = serde_json::json!({"pipeline": pipeline, "input": input});
        Self {
            name: Some(name.into()),
            action: ActionSpec::new(SCHEDULED_START_HOOK, args).group(group),
            recurrence,
            first_run: None,
            no_overlap: false,
        }
    }

    /// Pipeline schedules ([`ScheduleSpec::pipeline`]): an occurrence that comes while a job
    /// this schedule started is not final starts nothing (it is skipped, not postponed; the
    /// check and the start are one transaction under the schedule's row lock). Refused by
    /// [`ScheduleSpec::prepare`] on other schedules.
    pub fn no_overlap(mut self) -> Self {
        self.no_overlap = true;
        self
    }

    /// Names the schedule; re-registering the same name updates it instead of adding one.
    /// Default name: derived from hook + args + group.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the occurrences' group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.action = self.action.group(group);
        self
    }

    /// Sets the occurrences' priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.action = self.action.priority(priority);
        self
    }

    /// Sets the occurrences' attempts.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.action = self.action.max_attempts(n);
        self
    }

    /// Sets the occurrences' per-run timeout.
    pub fn timeout(mut self, t: std::time::Duration) -> Self {
        self.action = self.action.timeout(t);
        self
    }

    /// First occurrence time (intervals). Default: now; crons start at their next match.
    pub fn starting_at(mut self, at: DateTime<Utc>) -> Self {
        self.first_run = Some(at);
        self
    }

    /// Validates and resolves the spec against `now`.
    pub fn prepare(&self, now: DateTime<Utc>) -> Result<PreparedSchedule> {
        self.recurrence.validate()?;
        let mut template = self.action.prepare(now)?;
        let name = match &self.name {
            Some(n) => {
                validate_name("schedule name", n, false)?;
                n.clone()
            }
            None => crate::action::content_key(
                &template.hook,
                &template.args_json,
                template.group.as_deref(),
            ),
        };
        if template.hook == SCHEDULED_START_HOOK {
            template = self.pipeline_template(&name, now)?;
        } else if self.no_overlap {
            return Err(Error::invalid(
                "no_overlap",
                format!(
                    "schedule `{name}`: only a pipeline schedule (ScheduleSpec::pipeline) can skip \
                     overlapping occurrences"
                ),
            ));
        }
        let next_run_at = match (&self.recurrence, self.first_run) {
            (_, Some(at)) => at,
            (Recurrence::Interval { .. }, None) => now,
            (Recurrence::Cron { .. }, None) => self
                .recurrence
                .first_after(now)?
                .ok_or_else(|| Error::invalid("cron", "has no future occurrence"))?,
        };
        Ok(PreparedSchedule {
            name,
            template,
            recurrence: self.recurrence.clone(),
            next_run_at: crate::clock::to_millis(next_run_at),
        })
    }
}

impl ScheduleSpec {
    /// A pipeline schedule's occurrence template: its args carry the schedule's name and the
    /// no-overlap option, its group is the pipeline's (what routes it to a runtime that has
    /// the pipeline).
    fn pipeline_template(&self, name: &str, now: DateTime<Utc>) -> Result<PreparedAction> {
        let bad = |m: String| Error::invalid("schedule", format!("schedule `{name}`: {m}"));
        let mut args: ScheduledStartArgs = serde_json::from_value(self.action.args.clone())
            .map_err(|e| bad(format!("not a pipeline schedule's args: {e}")))?;
        if args.pipeline.is_empty() {
            return Err(bad("the pipeline name is empty".into()));
        }
        let group = crate::jobs::StepAction::group_for(&args.pipeline);
        if self.action.group.as_deref() != Some(group.as_str()) {
            return Err(bad(format!(
                "a pipeline schedule's occurrences carry their pipeline's group `{group}` \
                 (they are routed by it); do not set another group"
            )));
        }
        args.schedule = name.to_string();
        args.no_overlap = self.no_overlap;
        let mut action = self.action.clone();
        action.args = serde_json::to_value(&args).map_err(|e| bad(e.to_string()))?;
        action.prepare(now)
    }
}

/// A validated schedule ready to store.
#[derive(Debug, Clone)]
pub struct PreparedSchedule {
    /// Unique name.
    pub name: String,
    /// What each occurrence enqueues (its `scheduled_at` is replaced per occurrence).
    pub template: PreparedAction,
    /// How it recurs.
    pub recurrence: Recurrence,
    /// The first occurrence.
    pub next_run_at: DateTime<Utc>,
}

/// A stored schedule.
#[derive(Debug, Clone, Serialize)]
pub struct Schedule {
    /// Primary key.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// Hook of each occurrence.
    pub hook: String,
    /// Args of each occurrence.
    pub args: Value,
    /// Group of each occurrence.
    pub group: Option<String>,
    /// Priority of each occurrence.
    pub priority: i32,
    /// Attempts of each occurrence.
    pub max_attempts: i32,
    /// Timeout of each occurrence, ms.
    pub timeout_ms: Option<i64>,
    /// How it recurs.
    pub recurrence: Recurrence,
    /// Next occurrence to materialise; `None` while a fixed-delay occurrence is outstanding.
    pub next_run_at: Option<DateTime<Utc>>,
    /// Disabled schedules materialise nothing.
    pub enabled: bool,
}

impl Schedule {
    /// The action one occurrence at `at` enqueues, unique per (schedule, occurrence).
    pub fn occurrence(&self, at: DateTime<Utc>) -> Result<PreparedAction> {
        Ok(PreparedAction {
            hook: self.hook.clone(),
            args_json: encode_args(&self.args)?,
            group: self.group.clone(),
            priority: self.priority,
            scheduled_at: at,
            max_attempts: self.max_attempts,
            timeout_ms: self.timeout_ms,
            unique_key: Some(format!("s:{}:{}", self.id, at.timestamp_millis())),
            schedule_id: Some(self.id),
        })
    }

    /// Decodes the recurrence columns shared by every backend.
    pub(crate) fn recurrence_from_columns(
        id: i64,
        kind: &str,
        interval_ms: Option<i64>,
        fixed_delay: bool,
        cron_expr: Option<String>,
        timezone: Option<String>,
    ) -> Result<Recurrence> {
        let corrupt = |m: &str| Error::Corrupt {
            what: "schedule",
            id,
            message: m.to_string(),
        };
        match kind {
            "interval" => Ok(Recurrence::Interval {
                every: Duration::milliseconds(interval_ms.ok_or_else(|| corrupt("no interval"))?),
                fixed_delay,
            }),
            "cron" => Ok(Recurrence::Cron {
                expr: cron_expr.ok_or_else(|| corrupt("no cron expression"))?,
                timezone: timezone.ok_or_else(|| corrupt("no timezone"))?,
            }),
            other => Err(corrupt(&format!("unknown kind {other}"))),
        }
    }
}

/// The recurrence as storage (and display) columns: (kind, interval_ms, fixed_delay,
/// cron_expr, timezone).
pub fn recurrence_columns(
    r: &Recurrence,
) -> (&'static str, Option<i64>, bool, Option<&str>, Option<&str>) {
    match r {
        Recurrence::Interval { every, fixed_delay } => (
            "interval",
            Some(every.num_milliseconds()),
            *fixed_delay,
            None,
            None,
        ),
        Recurrence::Cron { expr, timezone } => (
            "cron",
            None,
            false,
            Some(expr.as_str()),
            Some(timezone.as_str()),
        ),
    }
}

#[cfg(test)]
mod tests;
