//! Group limits (issue 17 item 4): at most N running actions of a group across every runner
//! sharing the database (concurrency), and at most N starts of its actions in any window of a
//! period (rate).
//!
//! The limits are rows of the database (`dockhand_group_limits`), set with
//! [`crate::Queue::set_group_limit`], `dockhand groups limit` or the dashboard's groups page,
//! and enforced inside the claim's transaction on every backend (the SQL is in
//! `src/store/*/limits.rs`). This module holds what is not SQL: the types, their validation and
//! text form (`10/s`, `100/5m`), and the arithmetic of a claim: how many actions of a group it
//! may start (`allowance`) and the record of recent starts a rate limit keeps (`StartLog`).
//!
//! What counts as running: every action of the group with status `running`, which includes
//! the actions a runner has claimed ahead into its buffer (they hold a lease), and the actions
//! that finished at a time later than the claim's `now` (a finish stamped by a clock read
//! after the claim's own reading, committed before it: counting it keeps the limit true of
//! the rows' recorded start and finish times, not only of the database's states).
//!
//! The rate limit counts starts, a claim being a start (a retried action starts again). Its
//! record keeps the times of the group's most recent N starts (N the limit's count, as
//! `[time, starts]` pairs); a claim at `now` may start `N - (starts after now - period)`
//! actions, so no window of the period's length (in the claims' own `now`, the time stored as
//! the actions' start) ever holds more than N starts.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The largest rate count: the rate's record of recent starts holds up to this many entries.
pub const MAX_RATE_COUNT: u32 = 10_000;
/// The largest concurrency limit.
pub const MAX_CONCURRENCY: u32 = 1_000_000;
/// The longest rate period (30 days).
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(30 * 86_400);

/// At most `count` starts in any window of `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RateLimit {
    /// Starts allowed per period (1 to [`MAX_RATE_COUNT`]).
    pub count: u32,
    /// The window's length (1 ms to [`MAX_RATE_PERIOD`], whole milliseconds).
    #[serde(serialize_with = "serialize_period")]
    pub period: Duration,
}

fn serialize_period<S: serde::Serializer>(
    d: &Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&fmt_period(*d))
}

impl RateLimit {
    /// `count` starts per `period`.
    pub fn new(count: u32, period: Duration) -> Self {
        Self { count, period }
    }

    /// The period in whole milliseconds.
    pub fn period_ms(&self) -> i64 {
        i64::try_from(self.period.as_millis()).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, fmt_period(self.period))
    }
}

/// `1s`, `5m`, `250ms`, `1h30m`: the shortest text [`crate::cli::args::parse_duration`] reads.
fn fmt_period(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0ms".into();
    }
    let mut out = String::new();
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= len {
            out.push_str(&format!("{}{unit}", ms / len));
            ms %= len;
        }
    }
    if ms > 0 {
        out.push_str(&format!("{ms}ms"));
    }
    out
}

/// Parses `N/PERIOD`: `10/s`, `10/1s`, `100/5m`, `3/250ms` (a bare unit means one of it).
/// Errors name the field `rate`.
impl FromStr for RateLimit {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::invalid(
                "rate",
                format!("`{text}`: {why}; use COUNT/PERIOD, e.g. 10/s, 100/5m or 3/250ms"),
            )
        };
        let (count, period) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("no `/`".into()))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad(format!("count `{}` is not a whole number", count.trim())))?;
        let period = period.trim();
        let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
            period.to_string()
        } else {
            format!("1{period}")
        };
        let period = crate::cli::args::parse_duration(&period).map_err(bad)?;
        let ms = u64::try_from(period.num_milliseconds())
            .map_err(|_| bad("the period is negative".into()))?;
        let rate = RateLimit::new(count, Duration::from_millis(ms));
        rate.validate()?;
        Ok(rate)
    }
}

impl RateLimit {
    /// Checks the count and the period; errors name the field `rate`.
    pub fn validate(&self) -> Result<()> {
        if self.count == 0 {
            return Err(Error::invalid("rate", "the count must be at least 1"));
        }
        if self.count > MAX_RATE_COUNT {
            return Err(Error::invalid(
                "rate",
                format!("the count must be at most {MAX_RATE_COUNT}"),
            ));
        }
        if self.period.as_millis() == 0 {
            return Err(Error::invalid("rate", "the period must be at least 1ms"));
        }
        if self.period > MAX_RATE_PERIOD {
            return Err(Error::invalid("rate", "the period must be at most 30d"));
        }
        if self.period.subsec_nanos() % 1_000_000 != 0 {
            return Err(Error::invalid(
                "rate",
                "the period must be whole milliseconds",
            ));
        }
        Ok(())
    }
}

/// The limits of one group; at least one of them is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GroupLimit {
    /// At most this many actions of the group running (claimed) at once, cluster-wide.
    pub concurrency: Option<u32>,
    /// At most this many starts per period.
    pub rate: Option<RateLimit>,
}

impl GroupLimit {
    /// Checks both limits; errors name the field (`concurrency`, `rate`, or `limit` when
    /// neither is set).
    pub fn validate(&self) -> Result<()> {
        match self.concurrency {
            Some(0) => return Err(Error::invalid("concurrency", "must be at least 1")),
            Some(n) if n > MAX_CONCURRENCY => {
                return Err(Error::invalid(
                    "concurrency",
                    format!("must be at most {MAX_CONCURRENCY}"),
                ))
            }
            _ => {}
        }
        if let Some(rate) = &self.rate {
            rate.validate()?;
        }
        if self.concurrency.is_none() && self.rate.is_none() {
            return Err(Error::invalid(
                "limit",
                "give a concurrency or a rate limit (to remove a group's limits, clear them)",
            ));
        }
        Ok(())
    }
}

impl fmt::Display for GroupLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.concurrency {
            parts.push(format!("concurrency {n}"));
        }
        if let Some(r) = &self.rate {
            parts.push(format!("rate {r}"));
        }
        f.write_str(&parts.join(", "))
    }
}

/// Checks a group name for a limit: not empty, at most 255 characters (MySQL's column).
pub fn validate_group(group: &str) -> Result<()> {
    if group.trim().is_empty() {
        return Err(Error::invalid("group", "must not be empty"));
    }
    if group.chars().count() > 255 {
        return Err(Error::invalid("group", "must be at most 255 characters"));
    }
    Ok(())
}

/// A group's limits as stored, with what they currently count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupLimitInfo {
    /// The group.
    pub group: String,
    /// Its limits.
    pub limit: GroupLimit,
    /// When they were last set.
    pub set_at: DateTime<Utc>,
    /// Who set them (`ui:<user>`, `cli`, or what the caller passed).
    pub set_by: String,
    /// The group's running actions now (buffered ones included).
    pub running: i64,
    /// Starts recorded in the rate window ending now (0 without a rate limit).
    pub recent_starts: i64,
}

/// A rate limit's record of the group's most recent starts: `(time, starts)` in ascending
/// time, in milliseconds since the epoch (the precision of every backend's stored times).
/// Stored as JSON text `[[time, starts], ...]`; `NULL` or `[]` is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StartLog(Vec<(i64, i64)>);

impl StartLog {
    /// Reads the stored text; `None` when it is not a record (the caller treats the group's
    /// window as full, so a damaged row never lets a burst through).
    pub(crate) fn decode(text: Option<&str>) -> Option<Self> {
        match text {
            None => Some(Self::default()),
            Some(t) if t.trim().is_empty() => Some(Self::default()),
            Some(t) => {
                let mut v: Vec<(i64, i64)> = serde_json::from_str(t).ok()?;
                v.sort_unstable();
                Some(Self(v))
            }
        }
    }

    /// The stored text.
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_else(|_| "[]".into())
    }

    /// Starts recorded after `now - period` (later than `now` included: a claim whose clock
    /// ran behind another's still counts that one's starts).
    pub(crate) fn recent(&self, now: i64, period: i64) -> i64 {
        let since = now.saturating_sub(period);
        self.0
            .iter()
            .filter(|(t, _)| *t > since)
            .map(|(_, k)| (*k).max(0))
            .sum()
    }

    /// Records `starts` at `now` and keeps the most recent `count` starts (older entries can
    /// never decide a later claim: `count` newer starts already fill any window they fall in).
    pub(crate) fn record(&mut self, now: i64, starts: i64, count: i64) {
        if starts <= 0 {
            return;
        }
        match self.0.iter_mut().find(|(t, _)| *t == now) {
            Some(entry) => entry.1 += starts,
            None => self.0.push((now, starts)),
        }
        self.0.sort_unstable();
        let mut total: i64 = self.0.iter().map(|(_, k)| (*k).max(0)).sum();
        while let Some(&(_, oldest)) = self.0.first() {
            if total - oldest.max(0) >= count {
                total -= oldest.max(0);
                self.0.remove(0);
            } else {
                break;
            }
        }
    }
}

/// A limited group as a claim reads it (under its row lock on PostgreSQL and MySQL).
#[derive(Debug, Clone)]
pub(crate) struct LimitState {
    /// The group.
    pub group: String,
    /// Its concurrency limit.
    pub max_running: Option<i64>,
    /// Its rate count and period (milliseconds).
    pub rate: Option<(i64, i64)>,
    /// The rate's record (`None`: unreadable, the window counts as full).
    pub log: Option<StartLog>,
}

/// The limits a stored row holds.
pub(crate) fn limit_of(state: &LimitState) -> Result<GroupLimit> {
    let corrupt = |what: &str| Error::Corrupt {
        what: "group limit",
        id: 0,
        message: format!("group {}: {what}", state.group),
    };
    let concurrency = state
        .max_running
        .map(|n| u32::try_from(n).map_err(|_| corrupt("max_running out of range")))
        .transpose()?;
    let rate = state
        .rate
        .map(|(count, period)| {
            let ms = u64::try_from(period).map_err(|_| corrupt("rate_period_ms negative"))?;
            Ok::<_, Error>(RateLimit::new(
                u32::try_from(count).map_err(|_| corrupt("rate_count out of range"))?,
                Duration::from_millis(ms),
            ))
        })
        .transpose()?;
    Ok(GroupLimit { concurrency, rate })
}

impl LimitState {
    /// Starts in the rate window ending at `now` (0 without a rate or with an unreadable
    /// record).
    pub(crate) fn recent_starts(&self, now: i64) -> i64 {
        match (self.rate, &self.log) {
            (Some((_, period)), Some(log)) => log.recent(now, period),
            _ => 0,
        }
    }
}

/// How many actions of the group a claim at `now` may start, given `occupied` (running, or
/// finished after `now`): the least of what the concurrency and the rate leave, never below 0.
pub(crate) fn allowance(state: &LimitState, occupied: i64, now: i64) -> i64 {
    let by_concurrency = state
        .max_running
        .map_or(i64::MAX, |max| max.saturating_sub(occupied));
    let by_rate = match (state.rate, &state.log) {
        (None, _) => i64::MAX,
        (Some(_), None) => 0,
        (Some((count, period)), Some(log)) => count.saturating_sub(log.recent(now, period)),
    };
    by_concurrency.min(by_rate).max(0)
}

/// One claimable row, for merging the ordinary pick with each limited group's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The action.
    pub id: i64,
    /// Its priority.
    pub priority: i32,
    /// Its due time (backend units; only the order matters).
    pub scheduled_at: i64,
}

/// The first `n` candidates in claim order (priority, scheduled_at, id), duplicates dropped.
pub(crate) fn first_in_claim_order(mut all: Vec<Candidate>, n: i64) -> Vec<i64> {
    all.sort_by_key(|c| (c.priority, c.scheduled_at, c.id));
    all.dedup_by_key(|c| c.id);
    all.truncate(usize::try_from(n.max(0)).unwrap_or(usize::MAX));
    all.into_iter().map(|c| c.id).collect()
}

/// How many of `claimed` (their groups) fall in each of `groups`.
pub(crate) fn starts_per_group<'a>(
    groups: impl Iterator<Item = &'a str>,
    claimed: &[Option<String>],
) -> Vec<(String, i64)> {
    groups
        .map(|g| {
            let n = claimed.iter().filter(|c| c.as_deref() == Some(g)).count();
            (g.to_string(), i64::try_from(n).unwrap_or(i64::MAX))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_and_without_a_number_before_the_unit() {
        let r = |s: &str| s.parse::<RateLimit>();
        assert_eq!(
            r("10/s").unwrap(),
            RateLimit::new(10, Duration::from_secs(1))
        );
        assert_eq!(
            r("10/1s").unwrap(),
            RateLimit::new(10, Duration::from_secs(1))
        );
        assert_eq!(
            r(" 100 / 5m ").unwrap(),
            RateLimit::new(100, Duration::from_secs(300))
        );
        assert_eq!(
            r("3/250ms").unwrap(),
            RateLimit::new(3, Duration::from_millis(250))
        );
        assert_eq!(
            r("1/1h30m").unwrap(),
            RateLimit::new(1, Duration::from_secs(5400))
        );
        assert_eq!(r("7/2s").unwrap().to_string(), "7/2s");
        assert_eq!(r("7/90s").unwrap().to_string(), "7/1m30s");
    }

    #[test]
    fn bad_rates_name_the_field_and_say_why() {
        for (text, why) in [
            ("10", "no `/`"),
            ("x/s", "not a whole number"),
            ("-1/s", "not a whole number"),
            ("0/s", "at least 1"),
            ("10/0s", "at least 1ms"),
            ("10/fortnight", "unknown unit"),
            ("10/", "missing unit"),
            ("10/31d", "at most 30d"),
            ("10001/s", "at most 10000"),
        ] {
            let e = text.parse::<RateLimit>().unwrap_err().to_string();
            assert!(e.starts_with("invalid rate:"), "{text}: {e}");
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn limits_validate_each_field() {
        let e = |l: GroupLimit| l.validate().unwrap_err().to_string();
        assert!(e(GroupLimit::default()).starts_with("invalid limit:"));
        assert!(e(GroupLimit {
            concurrency: Some(0),
            rate: None
        })
        .starts_with("invalid concurrency: must be at least 1"));
        assert!(e(GroupLimit {
            concurrency: Some(2),
            rate: Some(RateLimit::new(0, Duration::from_secs(1)))
        })
        .starts_with("invalid rate:"));
        assert!(GroupLimit {
            concurrency: Some(2),
            rate: None
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn the_start_log_keeps_the_most_recent_count_starts() {
        let mut log = StartLog::default();
        log.record(100, 3, 5);
        log.record(200, 1, 5);
        log.record(200, 1, 5);
        assert_eq!(log.0, vec![(100, 3), (200, 2)]);
        log.record(300, 2, 5);
        // 3 + 2 + 2 = 7; dropping (100, 3) leaves 4 < 5: it stays.
        assert_eq!(log.0.len(), 3);
        log.record(400, 1, 5);
        assert_eq!(log.0, vec![(200, 2), (300, 2), (400, 1)]);
        assert_eq!(log.recent(400, 150), 3, "after 250: 300 and 400");
        assert_eq!(log.recent(250, 100), 5, "later than now counts too");
        let text = log.encode();
        assert_eq!(StartLog::decode(Some(&text)), Some(log));
        assert_eq!(StartLog::decode(None), Some(StartLog::default()));
        assert_eq!(StartLog::decode(Some("not json")), None);
    }

    #[test]
    fn allowance_is_the_least_of_both_limits() {
        let mut log = StartLog::default();
        log.record(1_000, 8, 10);
        let state = LimitState {
            group: "g".into(),
            max_running: Some(4),
            rate: Some((10, 1_000)),
            log: Some(log),
        };
        assert_eq!(allowance(&state, 1, 1_500), 2, "rate: 10 - 8");
        assert_eq!(allowance(&state, 3, 1_500), 1, "concurrency: 4 - 3");
        assert_eq!(allowance(&state, 1, 2_000), 3, "the window moved past 1000");
        assert_eq!(allowance(&state, 9, 2_000), 0, "never below zero");
        let broken = LimitState { log: None, ..state };
        assert_eq!(
            allowance(&broken, 0, 5_000),
            0,
            "an unreadable record is full"
        );
    }

    #[test]
    fn candidates_merge_in_claim_order() {
        let c = |id, priority, scheduled_at| Candidate {
            id,
            priority,
            scheduled_at,
        };
        let all = vec![
            c(5, 10, 1),
            c(2, 5, 9),
            c(3, 10, 1),
            c(2, 5, 9),
            c(9, 10, 0),
        ];
        assert_eq!(first_in_claim_order(all.clone(), 3), vec![2, 9, 3]);
        assert_eq!(first_in_claim_order(all, 10), vec![2, 9, 3, 5]);
        let groups = ["a", "b"];
        let claimed = vec![Some("a".to_string()), None, Some("a".to_string())];
        assert_eq!(
            starts_per_group(groups.iter().copied(), &claimed),
            vec![("a".to_string(), 2), ("b".to_string(), 0)]
        );
    }
}
