//! Cron expressions and timezones (§5 rows 1–2): for random valid 5/6-field expressions, random
//! IANA zones and random start instants (some within hours of a DST change), the next fire time
//! is strictly later than the start and found promptly; impossible dates end with `None`; the
//! documented DST rule holds for daily times; garbage expressions and unknown zone names are a
//! typed error naming the input, never a panic and never silently UTC.

use crate::support::check;
use chrono::{DateTime, Duration, NaiveDate, TimeZone, Timelike, Utc};
use chrono_tz::{Tz, TZ_VARIANTS};
use dockhand::schedule::{parse_cron, parse_timezone};
use dockhand::{Error, Recurrence};
use proptest::prelude::*;
use std::time::Instant;

/// A lookup slower than this counts as a hang (debug build, shared machine: generous).
const HANG: std::time::Duration = std::time::Duration::from_secs(5);

/// One field: `*`, a value, a range, a step over `*`/a value/a range, or a list of values.
fn field(min: u32, max: u32) -> BoxedStrategy<String> {
    let v = min..=max;
    prop_oneof![
        Just("*".to_string()),
        v.clone().prop_map(|a| a.to_string()),
        (v.clone(), v.clone()).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        (1..=max.max(2)).prop_map(|s| format!("*/{s}")),
        (v.clone(), 1..=max.max(2)).prop_map(|(a, s)| format!("{a}/{s}")),
        (v.clone(), v.clone(), 1..=max.max(2)).prop_map(|(a, b, s)| format!(
            "{}-{}/{s}",
            a.min(b),
            a.max(b)
        )),
        prop::collection::btree_set(v, 1..4).prop_map(|s| s
            .into_iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")),
    ]
    .boxed()
}

/// A valid expression: 5 fields (m h dom mon dow) or 6 (with leading seconds).
fn valid_expr() -> impl Strategy<Value = String> {
    (
        prop::option::of(field(0, 59)),
        field(0, 59),
        field(0, 23),
        field(1, 31),
        field(1, 12),
        field(1, 7),
    )
        .prop_map(|(s, m, h, dom, mon, dow)| {
            let five = format!("{m} {h} {dom} {mon} {dow}");
            match s {
                Some(s) => format!("{s} {five}"),
                None => five,
            }
        })
}

fn any_zone() -> impl Strategy<Value = Tz> {
    (0..TZ_VARIANTS.len()).prop_map(|i| TZ_VARIANTS[i])
}

/// Known offset changes: (zone, UTC instant of the change).
fn dst_changes() -> Vec<(Tz, DateTime<Utc>)> {
    let at = |y, mo, d, h, mi| Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap();
    vec![
        (chrono_tz::Europe::Paris, at(2026, 3, 29, 1, 0)),
        (chrono_tz::Europe::Paris, at(2026, 10, 25, 1, 0)),
        (chrono_tz::America::New_York, at(2026, 3, 8, 7, 0)),
        (chrono_tz::America::New_York, at(2026, 11, 1, 6, 0)),
        (chrono_tz::Australia::Sydney, at(2026, 4, 4, 16, 0)),
        (chrono_tz::Australia::Sydney, at(2026, 10, 3, 16, 0)),
        // Half-hour DST.
        (chrono_tz::Australia::Lord_Howe, at(2026, 4, 4, 15, 0)),
        (chrono_tz::Australia::Lord_Howe, at(2026, 10, 3, 15, 30)),
        (chrono_tz::America::Santiago, at(2026, 4, 5, 3, 0)),
        (chrono_tz::America::Santiago, at(2026, 9, 6, 4, 0)),
        // Midnight changes (the local day itself is affected).
        (chrono_tz::America::Havana, at(2026, 3, 8, 5, 0)),
        (chrono_tz::Asia::Beirut, at(2026, 3, 28, 22, 0)),
    ]
}

/// A zone and a start instant: anywhere 1970–2100 in any zone, or within ±6 h (to the second)
/// of a known DST change.
fn zone_and_start() -> impl Strategy<Value = (Tz, DateTime<Utc>)> {
    let changes = dst_changes();
    let n = changes.len();
    prop_oneof![
        (any_zone(), 0i64..4_102_444_800)
            .prop_map(|(tz, s)| (tz, DateTime::from_timestamp(s, 0).unwrap())),
        (0..n, -6 * 3600i64..6 * 3600)
            .prop_map(move |(i, off)| (changes[i].0, changes[i].1 + Duration::seconds(off))),
    ]
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    let t = Instant::now();
    let out = f();
    prop_assert!(t.elapsed() < HANG, "{what} took {:?}", t.elapsed());
    Ok(out)
}

#[test]
fn next_fire_is_strictly_later_and_prompt() {
    check(
        400,
        (valid_expr(), zone_and_start()),
        |(expr, (tz, start))| {
            let r = Recurrence::cron(expr.as_str(), tz.name());
            prop_assert!(r.is_ok(), "valid `{expr}` refused: {:?}", r.err());
            let r = r.unwrap();
            let times = timed("upcoming", || r.upcoming(start, 3))?;
            let times = times.map_err(|e| TestCaseError::fail(format!("`{expr}`: {e}")))?;
            let mut prev = start;
            for t in &times {
                prop_assert!(*t > prev, "`{expr}` in {tz}: {t} not after {prev}");
                if expr.split_whitespace().count() == 5 {
                    prop_assert_eq!(t.second(), 0, "5-field fires on the minute");
                }
                prev = *t;
            }
            Ok(())
        },
    );
}

/// Impossible dates (30/31 February, 31 April …) end with `None` promptly, never loop.
#[test]
fn impossible_dates_end() {
    let cases = (
        prop_oneof![
            Just((30, 2)),
            Just((31, 2)),
            Just((31, 4)),
            Just((31, 6)),
            Just((31, 9)),
            Just((31, 11))
        ],
        zone_and_start(),
    );
    check(64, cases, |((dom, mon), (tz, start))| {
        let r = Recurrence::cron(format!("0 0 {dom} {mon} *"), tz.name()).unwrap();
        let next = timed("first_after", || r.first_after(start))?;
        prop_assert_eq!(next.unwrap(), None);
        Ok(())
    });
}

/// The documented DST rule for a daily local time `s m h * * *`: every fire is at exactly
/// h:m:s local time, at most once per local day (a time repeated by a fall-back fires once),
/// and a day is skipped only when h:m:s does not exist that day (spring-forward gap).
#[test]
fn daily_local_time_follows_the_dst_rule() {
    check(
        300,
        (0u32..60, 0u32..60, 0u32..24, zone_and_start()),
        |(s, m, h, (tz, start))| {
            let r = Recurrence::cron(format!("{s} {m} {h} * * *"), tz.name()).unwrap();
            let times = timed("upcoming", || r.upcoming(start, 3))?.unwrap();
            prop_assert_eq!(times.len(), 3);
            let mut prev_day: Option<NaiveDate> = None;
            let mut expect_after = start;
            for t in times {
                let local = t.with_timezone(&tz);
                prop_assert_eq!(
                    (local.hour(), local.minute(), local.second()),
                    (h, m, s),
                    "fire {} in {}",
                    local,
                    tz
                );
                let day = local.date_naive();
                if let Some(p) = prev_day {
                    prop_assert!(day > p, "two fires on local day {day} in {tz}");
                    // Days between p and day were skipped: h:m:s must not exist on them.
                    let mut d = p.succ_opt().unwrap();
                    while d < day {
                        let wall = d.and_hms_opt(h, m, s).unwrap();
                        prop_assert!(
                            tz.from_local_datetime(&wall).earliest().is_none(),
                            "{wall} exists in {tz} but did not fire"
                        );
                        d = d.succ_opt().unwrap();
                    }
                }
                // A repeated local time fires at its first (earliest) instance.
                let wall = local.naive_local();
                let first = tz.from_local_datetime(&wall).earliest().unwrap();
                if first > expect_after {
                    prop_assert_eq!(first.with_timezone(&Utc), t, "not the first of {}", wall);
                }
                prev_day = Some(day);
                expect_after = t;
            }
            Ok(())
        },
    );
}

/// Cron-ish garbage: tokens from the cron alphabet (digits, `*/-,?#LW`, names, spaces) and
/// arbitrary text.
fn garbage() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        "[0-9*/,?#LW-]{1,6}",
        "[0-9]{1,25}",
        Just("MON".to_string()),
        Just("jan-dec".to_string()),
        Just("*/0".to_string()),
        Just("0/0".to_string()),
        Just("59-0".to_string()),
        Just("L-3".to_string()),
        "\\PC{0,4}",
    ];
    prop_oneof![
        prop::collection::vec(token, 0..9).prop_map(|t| t.join(" ")),
        "\\PC{0,40}",
        ".{0,40}",
    ]
}

#[test]
fn garbage_is_a_typed_error_naming_the_input() {
    check(2000, garbage(), |expr| {
        let parsed = timed("parse", || parse_cron(&expr))?;
        match Recurrence::cron(expr.as_str(), "UTC") {
            Ok(r) => {
                prop_assert!(parsed.is_ok());
                let start = Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap();
                if let Some(t) = timed("first_after", || r.first_after(start))?.unwrap() {
                    prop_assert!(t > start);
                }
            }
            Err(Error::InvalidInput { field, message }) => {
                prop_assert_eq!(field, "cron");
                prop_assert!(message.contains(&format!("`{expr}`")), "{}", message);
                prop_assert!(!message.contains('\n'), "one line: {}", message);
            }
            Err(other) => prop_assert!(false, "untyped error {other:?}"),
        }
        Ok(())
    });
}

/// Names that are not IANA zones (random text, and real names altered) are refused with a
/// typed error naming the input; every real name is accepted.
#[test]
fn unknown_timezones_are_errors_never_utc() {
    let altered = (any_zone(), 0..4usize).prop_map(|(tz, how)| {
        let n = tz.name();
        match how {
            0 => n.to_lowercase(),
            1 => format!("{n}x"),
            2 => format!(" {n}"),
            _ => n.replace('/', "\\"),
        }
    });
    let names = prop_oneof![altered, "\\PC{0,30}", "[A-Za-z_/+-]{1,20}"];
    check(2000, names, |name| {
        let known = TZ_VARIANTS.iter().any(|tz| tz.name() == name);
        match parse_timezone(&name) {
            Ok(tz) => prop_assert!(known && tz.name() == name, "`{name}` accepted as {tz}"),
            Err(Error::InvalidInput { field, message }) => {
                prop_assert!(!known, "real zone `{name}` refused");
                prop_assert_eq!(field, "timezone");
                prop_assert!(message.contains(&format!("`{name}`")), "{}", message);
            }
            Err(other) => prop_assert!(false, "untyped error {other:?}"),
        }
        let r = Recurrence::cron("* * * * *", name.as_str());
        prop_assert_eq!(r.is_ok(), known);
        Ok(())
    });
}
