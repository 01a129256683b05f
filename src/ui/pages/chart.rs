//! The throughput chart: an inline SVG with one polyline for completed and one for failed
//! actions per time bucket. Presentation attributes and classes only (no `style`), so it
//! passes the CSP; colours come from app.css (`svg.chart .completed`, `.failed`).
//!
//! **Size:** the SVG has a `viewBox` and no width of its own; app.css gives it the whole width
//! of its card (`width: 100%`, height from the aspect ratio), so it scales with the card
//! instead of leaving part of it empty. The wide aspect ratio ([`WIDTH`] by [`HEIGHT`]) keeps
//! it low on a wide screen.
//!
//! **Axis:** the time labels at both ends show the date too when the ends fall on different
//! days (the day chart's two ends share a time of day, so times alone would read "12:00 …
//! 12:00").
//!
//! **Data:** [`throughput_chart`] takes `(bucket start, completed, failed)` rows, oldest first,
//! as `Store::throughput` (plan commit 3) will give them. Until that method exists the
//! overview renders it with no rows.

use chrono::{DateTime, Utc};
use maud::{html, Markup};
use std::fmt::Write;

/// The viewBox width (user units, scaled to the card's width by CSS).
const WIDTH: f64 = 1000.0;
/// The viewBox height.
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 22.0;

/// **The throughput chart.** `buckets` are `(start, completed, failed)`, oldest first, evenly
/// spaced. An empty slice renders a short "no data" line instead of an empty chart.
pub(crate) fn throughput_chart(buckets: &[(DateTime<Utc>, i64, i64)]) -> Markup {
    let (Some(first), Some(last)) = (buckets.first(), buckets.last()) else {
        return html! { p.muted { "No finished actions in this window." } };
    };
    let max = buckets
        .iter()
        .map(|(_, c, f)| (*c).max(*f))
        .max()
        .unwrap_or(0)
        .max(1);
    let completed: i64 = buckets.iter().map(|(_, c, _)| *c).sum();
    let failed: i64 = buckets.iter().map(|(_, _, f)| *f).sum();
    let label = format!(
        "Throughput from {} to {} UTC: {completed} completed, {failed} failed",
        first.0.format("%Y-%m-%d %H:%M"),
        last.0.format("%Y-%m-%d %H:%M")
    );
    let plot_h = HEIGHT - TOP - BOTTOM;
    let (from, to) = axis_labels(first.0, last.0);
    html! {
        figure.chart-box {
            svg.chart viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-label=(label)
                xmlns="http://www.w3.org/2000/svg" {
                title { (label) }
                @for (value, y) in [(max, TOP), (max / 2, TOP + plot_h / 2.0), (0, TOP + plot_h)] {
                    line.grid x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y) y2=(y) {}
                    text.axis-label x=(LEFT - 4.0) y=(y + 3.0) text-anchor="end" { (value) }
                }
                text.axis-label x=(LEFT) y=(HEIGHT - 6.0) text-anchor="start" { (from) }
                text.axis-label x=(WIDTH - RIGHT) y=(HEIGHT - 6.0) text-anchor="end" {
                    (to) " UTC"
                }
                polyline.line.completed points=(points(buckets, max, |b| b.1)) {}
                polyline.line.failed points=(points(buckets, max, |b| b.2)) {}
            }
            figcaption.legend {
                span.completed { "■ completed " (completed) }
                " · "
                span.failed { "■ failed " (failed) }
            }
        }
    }
}

/// The time labels of the axis's two ends: `HH:MM` when both ends are on the same day,
/// `Mon DD HH:MM` when they are not (a 24-hour window's ends share their time of day).
fn axis_labels(first: DateTime<Utc>, last: DateTime<Utc>) -> (String, String) {
    let fmt = if first.date_naive() == last.date_naive() {
        "%H:%M"
    } else {
        "%b %d %H:%M"
    };
    (first.format(fmt).to_string(), last.format(fmt).to_string())
}

/// The `points` attribute of one series: x evenly spread over the plot, y scaled to `max`.
fn points(
    buckets: &[(DateTime<Utc>, i64, i64)],
    max: i64,
    value: impl Fn(&(DateTime<Utc>, i64, i64)) -> i64,
) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let n = buckets.len();
    let mut out = String::with_capacity(n * 12);
    for (i, b) in buckets.iter().enumerate() {
        let x = if n == 1 {
            LEFT + plot_w / 2.0
        } else {
            LEFT + plot_w * i as f64 / (n - 1) as f64
        };
        let y = TOP + plot_h * (1.0 - value(b).max(0) as f64 / max as f64);
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{x:.1},{y:.1}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn at(min: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_774_612_800, 0).unwrap_or_default()
            + Duration::minutes(min)
    }

    fn attr<'a>(svg: &'a str, class: &str) -> &'a str {
        let start = svg
            .find(&format!("class=\"line {class}\" points=\""))
            .map(|i| i + format!("class=\"line {class}\" points=\"").len())
            .unwrap_or_else(|| panic!("no {class} polyline in {svg}"));
        let len = svg[start..].find('"').unwrap_or(0);
        &svg[start..start + len]
    }

    #[test]
    fn no_rows_no_chart() {
        let s = throughput_chart(&[]).into_string();
        assert!(!s.contains("<svg"), "{s}");
        assert!(s.contains("No finished actions"));
    }

    #[test]
    fn series_are_scaled_to_the_largest_value() {
        let rows = [(at(0), 10, 0), (at(1), 5, 2), (at(2), 0, 10)];
        let s = throughput_chart(&rows).into_string();
        // Three points each, left edge to right edge; 10 is the top (y = 8), 0 the bottom
        // (y = 178), 5 half-way.
        assert_eq!(attr(&s, "completed"), "44.0,8.0 518.0,93.0 992.0,178.0");
        assert_eq!(attr(&s, "failed"), "44.0,178.0 518.0,144.0 992.0,8.0");
        assert!(s.contains("completed 15") && s.contains("failed 12"), "{s}");
        assert!(s.contains(">12:00<") && s.contains("12:02 UTC"), "{s}");
        // CSP: no inline style anywhere.
        assert!(!s.contains("style"), "{s}");
    }

    #[test]
    fn one_bucket_and_all_zero_do_not_divide_by_zero() {
        let s = throughput_chart(&[(at(0), 0, 0)]).into_string();
        assert_eq!(attr(&s, "completed"), "518.0,178.0");
        assert!(!s.contains("NaN") && !s.contains("inf"), "{s}");
    }

    #[test]
    fn scales_with_its_card() {
        let s = throughput_chart(&[(at(0), 1, 0), (at(1), 2, 0)]).into_string();
        // A viewBox and no fixed size: app.css sizes it to the card.
        assert!(s.contains("viewBox=\"0 0 1000 200\""), "{s}");
        assert!(!s.contains("width=") && !s.contains("height="), "{s}");
    }

    #[test]
    fn a_day_window_labels_its_ends_with_the_date() {
        // 24 hours per 15 minutes: both ends at 12:00, on different days.
        let rows: Vec<_> = (0..=96).map(|i| (at(i * 15), 1, 0)).collect();
        let s = throughput_chart(&rows).into_string();
        assert!(s.contains(">Mar 27 12:00<"), "{s}");
        assert!(s.contains(">Mar 28 12:00 UTC<"), "{s}");
        // An hour inside one day: times only.
        let rows: Vec<_> = (0..=60).map(|i| (at(i), 1, 0)).collect();
        let s = throughput_chart(&rows).into_string();
        assert!(s.contains(">12:00<") && s.contains(">13:00 UTC<"), "{s}");
    }
}
