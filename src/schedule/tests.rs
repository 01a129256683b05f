//! Unit tests of schedules: fixed-rate, fixed-delay and cron recurrences, their timezones, and
//! the pipeline schedules.

use super::*;
use chrono::{Datelike, TimeZone, Weekday};

#[test]
fn pipeline_schedules_carry_their_name_group_and_option() {
    let now = Utc.with_ymd_and_hms(2026, 3, 29, 10, 0, 0).unwrap();
    let every = || Recurrence::every(Duration::minutes(5)).unwrap();
    let p = ScheduleSpec::pipeline("nightly", "import", serde_json::json!({"a": 1}), every())
        .no_overlap()
        .prepare(now)
        .unwrap();
    assert_eq!(p.name, "nightly");
    assert_eq!(p.template.hook, SCHEDULED_START_HOOK);
    assert_eq!(p.template.group.as_deref(), Some("pipeline:import"));
    let args: ScheduledStartArgs = serde_json::from_str(&p.template.args_json).unwrap();
    assert_eq!(
        args,
        ScheduledStartArgs {
            pipeline: "import".into(),
            input: serde_json::json!({"a": 1}),
            schedule: "nightly".into(),
            no_overlap: true,
        }
    );

    let plain = ScheduleSpec::new("mail", serde_json::json!({}), every()).no_overlap();
    let e = plain.prepare(now).unwrap_err().to_string();
    assert!(e.contains("no_overlap") && e.contains("pipeline"), "{e}");

    let regrouped =
        ScheduleSpec::pipeline("n", "import", serde_json::json!({}), every()).group("elsewhere");
    let e = regrouped.prepare(now).unwrap_err().to_string();
    assert!(e.contains("pipeline:import"), "{e}");
}

#[test]
fn weekday_crons_run_monday_to_friday_as_in_unix_cron() {
    // Sunday 2026-03-29 10:00 UTC; `1-5` must give Mon..Fri, `0` and `7` Sunday.
    let sunday = Utc.with_ymd_and_hms(2026, 3, 29, 10, 0, 0).unwrap();
    let days = |expr: &str, n| -> Vec<Weekday> {
        Recurrence::cron(expr, "UTC")
            .unwrap()
            .upcoming(sunday, n)
            .unwrap()
            .iter()
            .map(|t| t.weekday())
            .collect()
    };
    use Weekday::*;
    assert_eq!(days("0 9 * * 1-5", 5), vec![Mon, Tue, Wed, Thu, Fri]);
    assert_eq!(days("0 9 * * MON-FRI", 5), vec![Mon, Tue, Wed, Thu, Fri]);
    assert_eq!(days("0 9 * * 0", 2), vec![Sun, Sun]);
    assert_eq!(days("0 9 * * 7", 1), vec![Sun]);
    assert_eq!(
        days("30 0 9 * * 6", 1),
        vec![Sat],
        "six fields: seconds first"
    );
    assert!(Recurrence::cron("0 9 * * 8", "UTC")
        .unwrap_err()
        .to_string()
        .contains("day-of-week"));
    // Day of month and day of week both restricted: a day must match both (the cron
    // crate's rule; Unix cron would take either). 2026-06-01 is the next Monday the 1st.
    let both = Recurrence::cron("0 9 1 * MON", "UTC")
        .unwrap()
        .upcoming(sunday, 1)
        .unwrap();
    assert_eq!(
        both,
        vec![Utc.with_ymd_and_hms(2026, 6, 1, 9, 0, 0).unwrap()]
    );
}

fn utc(y: i32, m: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, mi, 0).unwrap()
}

#[test]
fn paris_nine_am_across_spring_dst() {
    // 2026-03-29: Paris moves from UTC+1 to UTC+2.
    let r = Recurrence::cron("0 9 * * *", "Europe/Paris").unwrap();
    let times = r.upcoming(utc(2026, 3, 27, 12, 0), 4).unwrap();
    assert_eq!(
        times,
        vec![
            utc(2026, 3, 28, 8, 0),
            utc(2026, 3, 29, 7, 0),
            utc(2026, 3, 30, 7, 0),
            utc(2026, 3, 31, 7, 0)
        ]
    );
}

#[test]
fn paris_nine_am_across_autumn_dst() {
    // 2026-10-25: back to UTC+1.
    let r = Recurrence::cron("0 9 * * *", "Europe/Paris").unwrap();
    let times = r.upcoming(utc(2026, 10, 24, 12, 0), 2).unwrap();
    assert_eq!(
        times,
        vec![utc(2026, 10, 25, 8, 0), utc(2026, 10, 26, 8, 0)]
    );
}

#[test]
fn bad_cron_and_timezone_name_the_field() {
    let e = Recurrence::cron("not a cron", "UTC")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid cron"), "{e}");
    let e = Recurrence::cron("61 * * * *", "UTC")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid cron"), "{e}");
    let e = Recurrence::cron("* * * * *", "Mars/Olympus")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid timezone"), "{e}");
}

#[test]
fn zero_and_negative_intervals_are_refused() {
    for d in [Duration::zero(), Duration::seconds(-5)] {
        let e = Recurrence::every(d).unwrap_err().to_string();
        assert!(e.starts_with("invalid interval"), "{e}");
        assert!(Recurrence::every_after_finish(d).is_err());
    }
}

#[test]
fn fixed_rate_is_anchored_and_collapses_missed_runs() {
    let r = Recurrence::every(Duration::seconds(10)).unwrap();
    let t0 = utc(2026, 1, 1, 0, 0);
    // On time: next is exactly one period later, no drift from a late materialisation.
    assert_eq!(
        r.next_after_occurrence(t0, t0 + Duration::seconds(3))
            .unwrap(),
        Some(t0 + Duration::seconds(10))
    );
    // 95 s behind: one late run, then the next anchored time after now.
    assert_eq!(
        r.next_after_occurrence(t0, t0 + Duration::seconds(95))
            .unwrap(),
        Some(t0 + Duration::seconds(100))
    );
}

#[test]
fn fixed_delay_has_no_precomputed_next() {
    let r = Recurrence::every_after_finish(Duration::seconds(10)).unwrap();
    let t0 = utc(2026, 1, 1, 0, 0);
    assert_eq!(r.next_after_occurrence(t0, t0).unwrap(), None);
}

#[test]
fn six_field_cron_has_seconds() {
    let r = Recurrence::cron("*/15 * * * * *", "UTC").unwrap();
    let t0 = utc(2026, 1, 1, 0, 0);
    assert_eq!(r.first_after(t0).unwrap(), Some(t0 + Duration::seconds(15)));
}

#[test]
fn impossible_date_ends_instead_of_looping() {
    let r = Recurrence::cron("0 0 30 2 *", "UTC").unwrap();
    assert_eq!(r.first_after(utc(2026, 1, 1, 0, 0)).unwrap(), None);
}
