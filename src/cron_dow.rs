//! The day-of-week field of a cron expression, read the way Unix cron, Oban, Sidekiq-cron and
//! Action Scheduler read it — `0` and `7` are Sunday, `1` is Monday, so `1-5` is Monday to
//! Friday — and rewritten for the `cron` crate, which numbers Sunday `1` and Saturday `7`
//! (there `1-5` would be Sunday to Thursday). Names (`MON`, `fri`) mean the same in both.
//!
//! The field is expanded to the explicit list of days (`2,3,4,5,6` for `1-5`), so lists,
//! ranges (also wrapping through Sunday as `5-7`), steps (`*/2`, `1-5/2`) and names all keep
//! their Unix meaning. `*` and `?` are left as they are. Anything else (Quartz's `L`, `#`, `W`)
//! is refused naming the field.

use crate::error::{Error, Result};

const NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

fn bad(field: &str, why: &str) -> Error {
    Error::invalid(
        "cron",
        format!(
            "day-of-week `{field}`: {why} (0-7 with 0 and 7 = Sunday, names SUN-SAT, lists, \
             ranges and steps)"
        ),
    )
}

/// A day number 0-7 or a name, as Unix numbers it.
fn day(field: &str, s: &str) -> Result<u32> {
    if let Some(i) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(s)) {
        return Ok(i as u32);
    }
    match s.parse::<u32>() {
        Ok(n) if n <= 7 => Ok(n),
        Ok(_) => Err(bad(field, &format!("`{s}` is not a day"))),
        Err(_) => Err(bad(field, &format!("`{s}` is not a day number or name"))),
    }
}

/// Rewrites a Unix day-of-week field for the `cron` crate.
pub(crate) fn translate(field: &str) -> Result<String> {
    if field == "*" || field == "?" {
        return Ok(field.to_string());
    }
    let mut days = [false; 7];
    for item in field.split(',') {
        let (base, step) = match item.split_once('/') {
            Some((b, s)) => {
                let step =
                    s.parse::<u32>().ok().filter(|s| *s >= 1).ok_or_else(|| {
                        bad(field, &format!("step `{s}` is not a positive number"))
                    })?;
                (b, step)
            }
            None => (item, 1),
        };
        let (lo, hi) = match base {
            "*" | "?" => (0, 6),
            _ => match base.split_once('-') {
                Some((a, b)) => (day(field, a)?, day(field, b)?),
                // `a/step` runs from a to the end of the week (7, Sunday, included).
                None if item.contains('/') => (day(field, base)?, 7),
                None => {
                    let d = day(field, base)?;
                    (d, d)
                }
            },
        };
        if lo > hi {
            return Err(bad(field, &format!("range `{base}` runs backwards")));
        }
        for n in (lo..=hi).step_by(step as usize) {
            days[(n % 7) as usize] = true;
        }
    }
    let list: Vec<String> = (0..7)
        .filter(|d| days[*d])
        .map(|d| (d + 1).to_string())
        .collect();
    if list.is_empty() {
        return Err(bad(field, "no day"));
    }
    Ok(list.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_numbers_become_the_crate_numbers() {
        for (unix, crate_form) in [
            ("1-5", "2,3,4,5,6"),
            ("0", "1"),
            ("7", "1"),
            ("0,7", "1"),
            ("6", "7"),
            ("5-7", "1,6,7"),
            ("*/2", "1,3,5,7"),
            ("1-5/2", "2,4,6"),
            ("MON-FRI", "2,3,4,5,6"),
            ("sun,sat", "1,7"),
            ("1/3", "1,2,5"),
            ("7/1", "1"),
            ("*", "*"),
            ("?", "?"),
        ] {
            assert_eq!(translate(unix).unwrap(), crate_form, "{unix}");
        }
    }

    #[test]
    fn what_unix_cron_refuses_is_refused_by_name() {
        for bad in ["8", "L", "5L", "1#2", "5-1", "*/0", "", "MON-", "x"] {
            let e = translate(bad).unwrap_err().to_string();
            assert!(
                e.contains("cron") && e.contains("day-of-week"),
                "{bad}: {e}"
            );
        }
    }
}
