//! The frame around every page (head, navigation, theme and timezone toggles, footer), and
//! the small pieces pages share: times, status badges, notices, and POST buttons (rendered
//! only for operators, each a `<form method=post>` with the CSRF field that htmx also
//! enhances).

use crate::state::ActionStatus;
use crate::ui::assets;
use crate::ui::router::{Ctx, Theme};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

/// htmx settings (docs/dashboard_plan.md §1): no injected indicator style (CSP), no eval, no
/// script tags from responses, requests to this origin only, no history cache (args stay out
/// of localStorage).
pub(crate) const HTMX_CONFIG: &str = r#"{"includeIndicatorStyles":false,"allowEval":false, "allowScriptTags":false,"selfRequestsOnly":true,"historyCacheSize":0}"#;

/// The navigation entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    /// `/`.
    Overview,
    /// `/actions`.
    Actions,
    /// `/groups`.
    Groups,
    /// `/schedules`.
    Schedules,
    /// `/jobs`.
    Jobs,
    /// `/batches`.
    Batches,
    /// `/claims`.
    Claims,
    /// None highlighted (error pages).
    None,
}

const NAV: [(Nav, &str, &str); 7] = [
    (Nav::Overview, "/", "Overview"),
    (Nav::Actions, "/actions", "Actions"),
    (Nav::Groups, "/groups", "Groups"),
    (Nav::Schedules, "/schedules", "Schedules"),
    (Nav::Jobs, "/jobs", "Jobs"),
    (Nav::Batches, "/batches", "Batches"),
    (Nav::Claims, "/claims", "Claims"),
];

/// The id of the element htmx swaps (`hx-target`) and fragments replace.
pub(crate) const MAIN_ID: &str = "dh-main";

/// An HTML response.
pub(crate) fn html(markup: Markup) -> Response {
    Html(markup.into_string()).into_response()
}

/// A whole page around `body`, or only `body` (the content of `<main>`) when htmx asked.
pub(crate) fn page(ctx: &Ctx, nav: Nav, title: &str, body: Markup) -> Response {
    if ctx.hx {
        html(body)
    } else {
        html(document(ctx, nav, title, body))
    }
}

fn document(ctx: &Ctx, nav: Nav, title: &str, body: Markup) -> Markup {
    let theme = match ctx.theme {
        Some(Theme::Dark) => Some("dark"),
        Some(Theme::Light) => Some("light"),
        None => None,
    };
    let base = if ctx.base.is_empty() { "/" } else { &ctx.base };
    html! {
        (DOCTYPE)
        html lang="en" class=[theme] data-base=(base) data-tz=(tz_name(ctx)) {
            (head(ctx, title))
            body hx-headers=(csrf_headers(ctx)) {
                (topbar(ctx, nav))
                main #(MAIN_ID) data-refresh-default=(default_refresh(nav)) { (body) }
                (footer(ctx))
            }
        }
    }
}

/// The live refresh a page starts with when the `dh_refresh` cookie does not choose one: every
/// 5 s on the overview (cached, cheap), off on the lists (large tables; a refresh would also
/// drop checked rows).
fn default_refresh(nav: Nav) -> u32 {
    match nav {
        Nav::Overview => 5,
        _ => 0,
    }
}

/// The choices of the refresh selector, in seconds (0 = off).
const REFRESH_CHOICES: [u32; 5] = [0, 2, 5, 15, 60];

fn refresh_select(ctx: &Ctx, nav: Nav) -> Markup {
    let current = ctx.refresh.unwrap_or_else(|| default_refresh(nav));
    html! {
        label.refresh hidden data-refresh title="Reload this page's content every few seconds" {
            "Refresh "
            select.small data-refresh-select {
                @for s in REFRESH_CHOICES {
                    option value=(s) selected[s == current] {
                        @if s == 0 { "off" } @else { (s) " s" }
                    }
                }
            }
        }
    }
}

fn head(ctx: &Ctx, title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="htmx-config" content=(HTMX_CONFIG);
            meta name="referrer" content="no-referrer";
            title { (title) " · dockhand" }
            link rel="icon" type="image/svg+xml" href=(ctx.href(&assets::favicon_path()));
            link rel="stylesheet" href=(ctx.href(&assets::app_css_path()));
            script src=(ctx.href(assets::HTMX_PATH)) defer {}
            script src=(ctx.href(&assets::app_js_path())) defer {}
        }
    }
}

/// `{"X-CSRF-Token": "<token>"}` for `hx-headers`.
fn csrf_headers(ctx: &Ctx) -> String {
    serde_json::json!({ "X-CSRF-Token": ctx.csrf }).to_string()
}

fn topbar(ctx: &Ctx, active: Nav) -> Markup {
    html! {
        header.topbar {
            a.brand href=(ctx.href("/")) { "dockhand" }
            nav {
                ul.nav {
                    @for (nav, path, label) in NAV {
                        li {
                            a href=(ctx.href(path))
                              aria-current=[(nav == active).then_some("page")] { (label) }
                        }
                    }
                }
            }
            div.tools {
                span.access title="Your access level" { (ctx.access.as_str()) }
                (refresh_select(ctx, active))
                button.small type="button" data-toggle="tz" hidden
                    title="Show times in UTC or in your browser's timezone" {
                    (if ctx.tz.is_some() { "Local time" } else { "UTC" })
                }
                button.small type="button" data-toggle="theme" hidden title="Light or dark theme" {
                    "Theme"
                }
            }
        }
    }
}

fn footer(ctx: &Ctx) -> Markup {
    html! {
        footer {
            "dockhand " (env!("CARGO_PKG_VERSION"))
            " · times in " (tz_name(ctx))
            " · keys: / search, j/k select, Enter open, r refresh · "
            a href=(ctx.href(assets::HTMX_LICENSE_PATH)) { "htmx license" }
        }
    }
}

fn tz_name(ctx: &Ctx) -> String {
    ctx.tz
        .map_or_else(|| "utc".to_string(), |tz| tz.name().to_string())
}

/// An error page (or fragment) with the status and message.
pub(crate) fn error_page(ctx: &Ctx, status: StatusCode, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = html! {
        h1 { (status.as_u16()) " " (title) }
        p.error role="alert" { (message) }
        p { a href=(ctx.href("/")) { "Back to the overview" } }
    };
    page(ctx, Nav::None, title, body)
}

/// A time in the caller's timezone, with the exact UTC instant in `datetime` and `title`.
pub(crate) fn time(ctx: &Ctx, t: DateTime<Utc>) -> Markup {
    let shown = match ctx.tz {
        Some(tz) => t
            .with_timezone(&tz)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        None => t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    };
    let exact = t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    html! { time datetime=(exact) title=(exact) { (shown) } }
}

/// A time followed by how far it is from now ("in 5m", "2h 3m ago").
pub(crate) fn time_rel(ctx: &Ctx, t: DateTime<Utc>) -> Markup {
    html! { (time(ctx, t)) " " span.muted { "(" (relative(ctx.now, t)) ")" } }
}

/// An optional time, or a dash.
pub(crate) fn time_opt(ctx: &Ctx, t: Option<DateTime<Utc>>) -> Markup {
    match t {
        Some(t) => time_rel(ctx, t),
        None => html! { span.muted { "—" } },
    }
}

/// "in 5m 3s", "2h 3m ago", "now".
pub(crate) fn relative(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let ms = (t - now).num_milliseconds();
    if ms.abs() < 1000 {
        return "now".into();
    }
    let d = duration(ms.unsigned_abs());
    if ms > 0 {
        format!("in {d}")
    } else {
        format!("{d} ago")
    }
}

/// A duration in milliseconds as its two largest units: "850ms", "4s", "5m 3s", "2h 3m",
/// "3d 4h".
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => two(s / 60, "m", s % 60, "s"),
        3600..=86_399 => two(s / 3600, "h", s % 3600 / 60, "m"),
        _ => two(s / 86_400, "d", s % 86_400 / 3600, "h"),
    }
}

fn two(a: u64, ua: &str, b: u64, ub: &str) -> String {
    if b == 0 {
        format!("{a}{ua}")
    } else {
        format!("{a}{ua} {b}{ub}")
    }
}

/// A number with thousands separators: 100000 → "100,000".
pub(crate) fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A query-string value, percent-encoded (everything but unreserved characters).
pub(crate) fn query_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A status badge.
pub(crate) fn status(s: ActionStatus) -> Markup {
    html! { span class={ "badge s-" (s.as_str()) } { (s.as_str()) } }
}

/// What a POST did, shown once after it (`?msg=<code>` after a 303, inline in a fragment).
/// Only these fixed texts are shown, so nothing from the URL is reflected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Retry done.
    Retried,
    /// Retry refused (not failed or canceled).
    NotRetried,
    /// Cancel done.
    Canceled,
    /// Cancel refused (already final).
    NotCanceled,
    /// Run now enqueued an occurrence.
    RunNow,
    /// Run now found the same occurrence already pending or running.
    RunNowDuplicate,
    /// Schedule enabled.
    Enabled,
    /// Schedule disabled.
    Disabled,
    /// A bulk change ran (the counts follow as `changed`/`skipped`).
    Bulk,
    /// A job failed by the operator.
    JobFailed,
    /// A job cancelled by the operator.
    JobCanceled,
    /// Fail or cancel found the job final already.
    JobAlreadyFinal,
    /// A batch parent cancelled with its remaining children.
    BatchCanceled,
    /// A group paused.
    GroupPaused,
    /// A group resumed.
    GroupResumed,
    /// A group's limits set.
    GroupLimitSet,
    /// A group's limits cleared.
    GroupLimitCleared,
    /// A re-run of a batch's failed children started (this job).
    RerunStarted,
}

const NOTICES: [(Notice, &str, &str); 18] = [
    (
        Notice::Retried,
        "retried",
        "Retried: the action is pending again with fresh attempts.",
    ),
    (
        Notice::NotRetried,
        "not-retried",
        "Nothing to retry: only failed or canceled actions can be retried, and not while another active action holds their unique key.",
    ),
    (
        Notice::Canceled,
        "canceled",
        "Canceled. A running handler is not interrupted; its result is discarded.",
    ),
    (
        Notice::NotCanceled,
        "not-canceled",
        "Nothing to cancel: the action is already final.",
    ),
    (Notice::RunNow, "run", "Enqueued one occurrence to run now."),
    (
        Notice::RunNowDuplicate,
        "run-duplicate",
        "That occurrence is already pending or running.",
    ),
    (Notice::Enabled, "enabled", "Schedule enabled."),
    (Notice::Disabled, "disabled", "Schedule disabled."),
    (
        Notice::Bulk,
        "bulk",
        "Bulk change done. Rows in a status it does not apply to were skipped.",
    ),
    (
        Notice::JobFailed,
        "job-failed",
        "Job failed through the terminal bridge; its claims were given back.",
    ),
    (
        Notice::JobCanceled,
        "job-canceled",
        "Job cancelled through the terminal bridge; its claims were given back.",
    ),
    (
        Notice::JobAlreadyFinal,
        "job-final",
        "Nothing changed: the job was already final.",
    ),
    (
        Notice::BatchCanceled,
        "batch-canceled",
        "Batch cancelled: children not yet created will not be, running ones finish.",
    ),
    (
        Notice::GroupPaused,
        "group-paused",
        "Group paused: its pending actions wait; running ones finish.",
    ),
    (Notice::GroupResumed, "group-resumed", "Group resumed."),
    (
        Notice::GroupLimitSet,
        "group-limited",
        "Group limits set: claims on every runner keep to them from now on.",
    ),
    (
        Notice::GroupLimitCleared,
        "group-unlimited",
        "Group limits cleared: its waiting actions can be claimed now.",
    ),
    (
        Notice::RerunStarted,
        "rerun-started",
        "Re-run started: this new job claims the failed children's items again and runs them from the child step.",
    ),
];

impl Notice {
    /// The `msg` code.
    pub(crate) fn code(self) -> &'static str {
        NOTICES
            .iter()
            .find(|(n, _, _)| *n == self)
            .map_or("", |(_, c, _)| c)
    }

    /// The notice a `msg` code names.
    pub(crate) fn parse(code: &str) -> Option<Notice> {
        NOTICES
            .iter()
            .find(|(_, c, _)| *c == code)
            .map(|(n, _, _)| *n)
    }

    fn text(self) -> &'static str {
        NOTICES
            .iter()
            .find(|(n, _, _)| *n == self)
            .map_or("", |(_, _, t)| t)
    }
}

/// The notice banner, if any, with a link to the action it is about.
pub(crate) fn notice(ctx: &Ctx, n: Option<Notice>, action: Option<i64>) -> Markup {
    html! {
        @if let Some(n) = n {
            p.notice role="status" {
                (n.text())
                @if let Some(id) = action {
                    " " a href=(ctx.href(&format!("/actions/{id}"))) { "Action #" (id) }
                }
            }
        }
    }
}

/// The fragment after a change that was made but whose page failed to render: the notice,
/// the failure, and a link to `to` (a path under the base).
pub(crate) fn changed_but_not_shown(
    ctx: &Ctx,
    n: Notice,
    to: &str,
    error: &crate::Error,
) -> Markup {
    html! {
        (notice(ctx, Some(n), None))
        p.error role="alert" {
            "The change was made, but the page could not be shown again (" (error) "). "
            a href=(ctx.href(to)) { "Reload" }
        }
    }
}

/// A POST button to `action` (a path under the base), as a form that works without script
/// and that htmx submits in place (the answer replaces `<main>`). Empty for read-only callers.
pub(crate) fn post_button(ctx: &Ctx, action: &str, label: &str, class: &str) -> Markup {
    if !ctx.operator() {
        return html! {};
    }
    let url = ctx.href(action);
    html! {
        form.inline method="post" action=(url) hx-post=(url)
            hx-target={ "#" (MAIN_ID) } hx-swap="innerHTML" {
            input type="hidden" name="_csrf" value=(ctx.csrf);
            button type="submit" class=(class) { (label) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_counts_read_well() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(4_000), "4s");
        assert_eq!(duration(303_000), "5m 3s");
        assert_eq!(duration(7_380_000), "2h 3m");
        assert_eq!(duration(3_600_000), "1h");
        assert_eq!(duration(273_600_000), "3d 4h");
        let t = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap_or_default();
        assert_eq!(relative(t, t + chrono::Duration::seconds(90)), "in 1m 30s");
        assert_eq!(relative(t, t - chrono::Duration::hours(2)), "2h ago");
        assert_eq!(relative(t, t), "now");
        assert_eq!(count(100_000), "100,000");
        assert_eq!(count(999), "999");
        assert_eq!(count(-1_234_567), "-1,234,567");
        assert_eq!(count(0), "0");
        assert_eq!(query_value("a b/é&c"), "a%20b%2F%C3%A9%26c");
    }

    #[test]
    fn notices_round_trip_and_unknown_codes_show_nothing() {
        for (n, code, _) in NOTICES {
            assert_eq!(Notice::parse(code), Some(n));
            assert_eq!(n.code(), code);
        }
        assert_eq!(Notice::parse("<script>"), None);
    }
}
