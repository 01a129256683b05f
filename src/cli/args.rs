//! Parsing and formatting of command-line values: durations (`30s`, `5m`, `1h30m`, `250ms`),
//! RFC 3339 times, action, job and claim statuses and sort orders, plus the human formats used
//! in tables.
//!
//! The clap value parsers here only check syntax. Whether a value makes sense (a positive
//! interval, a non-negative delay) is decided by the library, so its errors name the field.

use crate::action::ActionOrder;
use crate::error::{Error, Result};
use crate::state::{ActionStatus, ClaimStatus, JobStatus};
use chrono::{DateTime, Duration, SecondsFormat, Utc};

const DURATION_HELP: &str =
    "use a number and a unit (ms, s, m, h, d), e.g. 250ms, 30s, 5m, 2h, 1d or 1h30m";

/// The clap parser of `--args`: the text as given, refused with a message naming `--args` when
/// it is not valid UTF-8 (clap's own message names no option). `@FILE` and `-` are kept as
/// they are and read by [`read_args`] when the command runs.
#[derive(Debug, Clone, Copy)]
pub struct ArgsText;

impl clap::builder::TypedValueParser for ArgsText {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> std::result::Result<String, clap::Error> {
        value.to_str().map(str::to_owned).ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidUtf8,
                "--args is not valid UTF-8: give JSON text, or --args @FILE to read a file, \
                 or --args - to read stdin\n",
            )
            .with_cmd(cmd)
        })
    }
}

/// The JSON text `--args` stands for: `@FILE` reads the file, `-` reads stdin (both past the
/// OS argument-size limit), anything else is the JSON itself. Errors name `args`.
pub fn read_args(given: &str) -> Result<String> {
    use std::io::Read;
    let read = |what: &str, r: std::io::Result<Vec<u8>>| -> Result<String> {
        let bytes = r.map_err(|e| Error::invalid("args", format!("cannot read {what}: {e}")))?;
        String::from_utf8(bytes)
            .map_err(|_| Error::invalid("args", format!("{what} is not valid UTF-8")))
    };
    if given == "-" {
        let mut buf = Vec::new();
        let r = std::io::stdin().lock().read_to_end(&mut buf).map(|_| buf);
        read("stdin", r)
    } else if let Some(path) = given.strip_prefix('@') {
        read(&format!("file {path}"), std::fs::read(path))
    } else {
        Ok(given.to_string())
    }
}

/// For commands that only read: a `sqlite:` URL naming a file that does not exist is an error
/// saying so (opening it would create an empty database). Other URLs pass.
pub fn require_existing_sqlite_file(url: &str) -> Result<()> {
    use std::str::FromStr;
    if !url.starts_with("sqlite:") || url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(());
    }
    let Ok(options) = sqlx::sqlite::SqliteConnectOptions::from_str(url) else {
        return Ok(()); // connecting reports the bad URL
    };
    let path = options.get_filename();
    if path.exists() {
        Ok(())
    } else {
        Err(Error::Connect {
            target: format!("SQLite database {}", path.display()),
            reason: format!(
                "SQLite database {} does not exist (check --database-url or \
                 DOCKHAND_DATABASE_URL; `dockhand migrate` creates it)",
                path.display()
            ),
        })
    }
}

/// [`parse_duration`] for an interval: at least one second.
pub fn parse_positive_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::seconds(1) {
        return Err(format!("invalid interval `{text}`: at least 1s"));
    }
    d.to_std()
        .map_err(|_| format!("invalid interval `{text}`: too large"))
}

/// Parses a duration such as `30s`, `5m`, `2h`, `1d`, `250ms` or `1h30m`; a leading `-` makes it
/// negative (so that the library, not the parser, refuses it with the field's name).
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let bad = |why: &str| format!("invalid duration `{text}`: {why}; {DURATION_HELP}");
    let trimmed = text.trim();
    let (negative, mut rest) = match trimmed.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, trimmed.strip_prefix('+').unwrap_or(trimmed)),
    };
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut total_ms: i64 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let number: i64 = rest[..digits]
            .parse()
            .map_err(|_| bad("number too large"))?;
        rest = &rest[digits..];
        let letters = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit_ms: i64 = match &rest[..letters] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(bad("missing unit")),
            other => return Err(bad(&format!("unknown unit `{other}`"))),
        };
        rest = &rest[letters..];
        total_ms = number
            .checked_mul(unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .filter(|ms| *ms <= Duration::MAX.num_milliseconds())
            .ok_or_else(|| bad("too large"))?;
    }
    Ok(Duration::milliseconds(if negative {
        -total_ms
    } else {
        total_ms
    }))
}

/// Converts a parsed duration for a setting that must not be negative, naming the field.
pub fn non_negative(field: &'static str, d: Duration) -> Result<std::time::Duration> {
    d.to_std()
        .map_err(|_| Error::invalid(field, "must not be negative"))
}

/// Parses an RFC 3339 time such as `2030-01-01T09:00:00Z` or `2030-01-01T10:00:00+01:00`.
pub fn parse_time(text: &str) -> std::result::Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("`{text}` is not an RFC 3339 time ({e}); e.g. 2030-01-01T09:00:00Z"))
}

/// Parses a status name (`pending`, `running`, `complete`, `failed`, `canceled`).
pub fn parse_status(text: &str) -> std::result::Result<ActionStatus, String> {
    text.trim()
        .parse::<ActionStatus>()
        .map_err(|e| e.to_string())
}

/// Parses a job status name (`pending`, `processing`, `waiting`, `completed`,
/// `completed_no_items`, `skipped`, `failed`, `cancelled`).
pub fn parse_job_status(text: &str) -> std::result::Result<JobStatus, String> {
    text.trim().parse::<JobStatus>().map_err(|e| e.to_string())
}

/// Parses an item-claim status name (`claimed`, `processed`, `deferred`).
pub fn parse_claim_status(text: &str) -> std::result::Result<ClaimStatus, String> {
    text.trim()
        .parse::<ClaimStatus>()
        .map_err(|e| e.to_string())
}

/// Parses a sort order: `scheduled`, `-scheduled`, `id` or `-id` (a `-` means newest first).
pub fn parse_order(text: &str) -> std::result::Result<ActionOrder, String> {
    match text.trim() {
        "scheduled" => Ok(ActionOrder::ScheduledAsc),
        "-scheduled" => Ok(ActionOrder::ScheduledDesc),
        "id" => Ok(ActionOrder::IdAsc),
        "-id" => Ok(ActionOrder::IdDesc),
        other => Err(format!(
            "unknown order `{other}`; use scheduled, -scheduled, id or -id"
        )),
    }
}

/// An exact compact form of a duration in milliseconds: `1d2h`, `30s`, `1m30s`, `250ms`.
pub fn format_exact(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    if ms < 0 {
        out.push('-');
    }
    let mut rest = ms.unsigned_abs();
    for (unit, size) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

/// A rounded human form of a duration in milliseconds, for lags and wall times:
/// `250ms`, `12.3s`, `5m 3s`, `2h 5m`, `3d 4h`.
pub fn format_approx(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let a = ms.unsigned_abs();
    let body = match a {
        0..=999 => format!("{a}ms"),
        1_000..=59_999 => format!("{:.1}s", a as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m {}s", a / 60_000, a % 60_000 / 1_000),
        3_600_000..=86_399_999 => format!("{}h {}m", a / 3_600_000, a % 3_600_000 / 60_000),
        _ => format!("{}d {}h", a / 86_400_000, a % 86_400_000 / 3_600_000),
    };
    format!("{sign}{body}")
}

/// A time for tables: RFC 3339 in UTC, whole seconds.
pub fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A time for detail views: RFC 3339 in UTC with milliseconds.
pub fn fmt_time_ms(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// ` (in 5m 3s)`, ` (2.0s ago)` or, within a second, ` (now)`.
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let ms = (t - now).num_milliseconds();
    if ms.abs() < 1_000 {
        " (now)".into()
    } else if ms >= 0 {
        format!(" (in {})", format_approx(ms))
    } else {
        format!(" ({} ago)", format_approx(-ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_and_compound_durations() {
        let ms = |s: &str| parse_duration(s).unwrap().num_milliseconds();
        assert_eq!(ms("250ms"), 250);
        assert_eq!(ms("30s"), 30_000);
        assert_eq!(ms("5m"), 300_000);
        assert_eq!(ms("2h"), 7_200_000);
        assert_eq!(ms("1d"), 86_400_000);
        assert_eq!(ms("1h30m"), 5_400_000);
        assert_eq!(ms(" 1m30s "), 90_000);
        assert_eq!(ms("0s"), 0);
        assert_eq!(ms("-5s"), -5_000);
    }

    #[test]
    fn rejects_malformed_durations_with_a_hint() {
        for bad in [
            "",
            "-",
            "30",
            "s",
            "5 m",
            "5x",
            "1.5h",
            "1h30",
            "99999999999999999999d",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.starts_with("invalid duration"), "{bad}: {e}");
            assert!(e.contains("e.g. 250ms"), "{bad}: {e}");
        }
    }

    #[test]
    fn zero_and_negative_intervals_are_refused_by_the_library_naming_interval() {
        for text in ["0s", "-5s"] {
            let d = parse_duration(text).unwrap();
            let e = crate::schedule::Recurrence::every(d)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("invalid interval"), "{e}");
        }
        let e = non_negative("keep_finished", parse_duration("-1d").unwrap()).unwrap_err();
        assert!(e.to_string().starts_with("invalid keep_finished"), "{e}");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(format_exact(0), "0s");
        assert_eq!(format_exact(90_000), "1m30s");
        assert_eq!(format_exact(86_400_000 * 7), "7d");
        assert_eq!(format_exact(1_250), "1s250ms");
        assert_eq!(format_approx(250), "250ms");
        assert_eq!(format_approx(12_340), "12.3s");
        assert_eq!(format_approx(303_000), "5m 3s");
        assert_eq!(format_approx(-2_000), "-2.0s");
        assert_eq!(format_approx(90_000_000), "1d 1h");
    }

    #[test]
    fn parses_orders_statuses_and_times() {
        assert_eq!(parse_order("-id").unwrap(), ActionOrder::IdDesc);
        assert!(parse_order("name").is_err());
        assert_eq!(parse_status("failed").unwrap(), ActionStatus::Failed);
        assert!(parse_status("done").unwrap_err().contains("unknown status"));
        assert_eq!(
            parse_job_status(" completed_no_items").unwrap(),
            JobStatus::CompletedNoItems
        );
        let e = parse_job_status("canceled").unwrap_err();
        assert!(
            e.contains("unknown job status `canceled`") && e.contains("cancelled"),
            "{e}"
        );
        assert_eq!(
            parse_claim_status("deferred").unwrap(),
            ClaimStatus::Deferred
        );
        let e = parse_claim_status("done").unwrap_err();
        assert!(e.contains("claimed, processed, deferred"), "{e}");
        let t = parse_time("2030-01-01T10:00:00+01:00").unwrap();
        assert_eq!(fmt_time(t), "2030-01-01T09:00:00Z");
        assert!(parse_time("tomorrow").is_err());
    }
}
