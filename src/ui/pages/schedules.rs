//! Schedules (`/schedules`): every recurring schedule with its recurrence, state, next run and
//! the next five runs. Operators can run one occurrence now and enable or disable a schedule.
//!
//! Data: `Store::schedules()`; next runs from [`Recurrence::upcoming`]. Run now enqueues
//! `schedule.occurrence(now)` (unique key `s:{id}:{ms}`, keeps `schedule_id`, so a fixed-delay
//! series re-arms from its finish); enable/disable is `Store::set_schedule_enabled`.

use super::layout::{self, Nav, Notice};
use super::MsgQuery;
use crate::error::{Error, Result};
use crate::schedule::{Recurrence, Schedule};
use crate::ui::router::{audit, AppState, Ctx};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{html, Markup};

/// How many upcoming runs a row lists.
const UPCOMING: usize = 5;

/// `GET /schedules`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Query(q): Query<MsgQuery>,
) -> Response {
    let result = async {
        let schedules = st.store.schedules().await?;
        let body = body(&ctx, &schedules, q.notice(), q.id);
        Ok(layout::page(&ctx, Nav::Schedules, "Schedules", body))
    }
    .await;
    ctx.respond(result)
}

/// `POST /schedules/{id}/run`: enqueue the occurrence at now.
pub(crate) async fn run_now(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    let result = async {
        let schedule = find(&st, id).await?;
        let at = crate::clock::to_millis(ctx.now);
        let enqueued = st.store.enqueue(&schedule.occurrence(at)?, ctx.now).await?;
        let notice = if enqueued.inserted {
            Notice::RunNow
        } else {
            Notice::RunNowDuplicate
        };
        audit(
            &ctx,
            "schedule_run_now",
            &id.to_string(),
            1,
            u64::from(enqueued.inserted),
        );
        let to = format!("/schedules?id={}", enqueued.id);
        ctx.done(&to, notice, || async {
            let schedules = st.store.schedules().await?;
            Ok(body(&ctx, &schedules, Some(notice), Some(enqueued.id)))
        })
        .await
    }
    .await;
    ctx.respond(result)
}

/// `POST /schedules/{id}/enable`.
pub(crate) async fn enable(st: State<AppState>, ctx: Ctx, id: Path<i64>) -> Response {
    set_enabled(st, ctx, id, true).await
}

/// `POST /schedules/{id}/disable`.
pub(crate) async fn disable(st: State<AppState>, ctx: Ctx, id: Path<i64>) -> Response {
    set_enabled(st, ctx, id, false).await
}

async fn set_enabled(
    State(st): State<AppState>,
    ctx: Ctx,
    Path(id): Path<i64>,
    enabled: bool,
) -> Response {
    let result = async {
        if !st.store.set_schedule_enabled(id, enabled).await? {
            return Err(Error::NotFound {
                what: "schedule",
                id,
            });
        }
        let op = if enabled {
            "schedule_enable"
        } else {
            "schedule_disable"
        };
        audit(&ctx, op, &id.to_string(), 1, 1);
        let notice = if enabled {
            Notice::Enabled
        } else {
            Notice::Disabled
        };
        ctx.done("/schedules", notice, || async {
            let schedules = st.store.schedules().await?;
            Ok(body(&ctx, &schedules, Some(notice), None))
        })
        .await
    }
    .await;
    ctx.respond(result)
}

async fn find(st: &AppState, id: i64) -> Result<Schedule> {
    st.store
        .schedules()
        .await?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or(Error::NotFound {
            what: "schedule",
            id,
        })
}

fn body(ctx: &Ctx, schedules: &[Schedule], notice: Option<Notice>, id: Option<i64>) -> Markup {
    html! {
        h1 { "Schedules" }
        (layout::notice(ctx, notice, id))
        p.hint {
            "Disabled schedules materialise nothing. Re-enabling one fires it once at "
            code { "COALESCE(next_run_at, updated_at)" }
            " (right away when that is past; missed runs are not replayed), then it follows its recurrence. "
            "Run now enqueues one extra occurrence and leaves the series as it is."
        }
        @if schedules.is_empty() {
            p.muted { "No schedules." }
        } @else {
            div.panel { (table(ctx, schedules)) }
        }
    }
}

fn table(ctx: &Ctx, schedules: &[Schedule]) -> Markup {
    html! {
        table.rows {
            thead {
                tr {
                    th { "Name" } th { "Hook" } th { "Recurrence" } th { "Timezone" }
                    th { "State" } th { "Next run" } th { "Next " (UPCOMING) " runs" }
                    @if ctx.operator() { th {} }
                }
            }
            tbody {
                @for s in schedules { (row(ctx, s)) }
            }
        }
    }
}

fn row(ctx: &Ctx, s: &Schedule) -> Markup {
    html! {
        tr id={ "schedule-" (s.id) } {
            td.name { (s.name) }
            td { code { (s.hook) } @if let Some(g) = &s.group { br; span.muted { "group " (g) } } }
            td { (recurrence(&s.recurrence)) }
            td { @match &s.recurrence { Recurrence::Cron { timezone, .. } => (timezone), _ => span.muted { "—" } } }
            td {
                @if s.enabled { span.badge.s-enabled { "enabled" } } @else { span.badge.s-disabled { "disabled" } }
            }
            td { (next_run(ctx, s)) }
            td { (upcoming_list(ctx, s)) }
            @if ctx.operator() { td { (buttons(ctx, s)) } }
        }
    }
}

fn recurrence(r: &Recurrence) -> Markup {
    match r {
        Recurrence::Interval { every, fixed_delay } => {
            let d = layout::duration(every.num_milliseconds().max(0).unsigned_abs());
            html! {
                "every " (d)
                br;
                span.muted { (if *fixed_delay { "after each finish (fixed delay)" } else { "fixed rate" }) }
            }
        }
        Recurrence::Cron { expr, .. } => html! { "cron " code { (expr) } },
    }
}

fn next_run(ctx: &Ctx, s: &Schedule) -> Markup {
    match s.next_run_at {
        Some(t) => layout::time_rel(ctx, t),
        None => html! { span.muted { "after the outstanding occurrence finishes" } },
    }
}

/// The next runs after (and including) `next_run_at`. A fixed-delay series has only the next
/// one: the rest depend on when each run finishes.
pub(crate) fn upcoming(s: &Schedule) -> Result<Vec<DateTime<Utc>>> {
    let Some(first) = s.next_run_at else {
        return Ok(Vec::new());
    };
    if matches!(
        s.recurrence,
        Recurrence::Interval {
            fixed_delay: true,
            ..
        }
    ) {
        return Ok(vec![first]);
    }
    let mut out = vec![first];
    out.extend(s.recurrence.upcoming(first, UPCOMING - 1)?);
    Ok(out)
}

fn upcoming_list(ctx: &Ctx, s: &Schedule) -> Markup {
    if !s.enabled {
        return html! { span.muted { "— (disabled)" } };
    }
    match upcoming(s) {
        Ok(times) if times.is_empty() => html! { span.muted { "—" } },
        Ok(times) => html! {
            ol.upcoming { @for t in times { li { (layout::time(ctx, t)) } } }
        },
        Err(e) => html! { span.error { (e.to_string()) } },
    }
}

fn buttons(ctx: &Ctx, s: &Schedule) -> Markup {
    let id = s.id;
    html! {
        div.actions {
            (layout::post_button(ctx, &format!("/schedules/{id}/run"), "Run now", "small primary"))
            @if s.enabled {
                (layout::post_button(ctx, &format!("/schedules/{id}/disable"), "Disable", "small"))
            } @else {
                (layout::post_button(ctx, &format!("/schedules/{id}/enable"), "Enable", "small"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use serde_json::json;

    fn schedule(recurrence: Recurrence, next: Option<DateTime<Utc>>) -> Schedule {
        Schedule {
            id: 1,
            name: "n".into(),
            hook: "h".into(),
            args: json!({}),
            group: None,
            priority: 10,
            max_attempts: 5,
            timeout_ms: None,
            recurrence,
            next_run_at: next,
            enabled: true,
        }
    }

    #[test]
    fn next_runs_start_at_next_run_at() {
        let t = DateTime::<Utc>::from_timestamp(1_774_612_800, 0).unwrap_or_default();
        let every = schedule(
            Recurrence::Interval {
                every: Duration::minutes(5),
                fixed_delay: false,
            },
            Some(t),
        );
        let got = upcoming(&every).unwrap_or_default();
        let want: Vec<_> = (0..5).map(|k| t + Duration::minutes(5 * k)).collect();
        assert_eq!(got, want);
        let delay = schedule(
            Recurrence::Interval {
                every: Duration::minutes(5),
                fixed_delay: true,
            },
            Some(t),
        );
        assert_eq!(upcoming(&delay).unwrap_or_default(), vec![t]);
        let outstanding = schedule(
            Recurrence::Interval {
                every: Duration::minutes(5),
                fixed_delay: true,
            },
            None,
        );
        assert!(upcoming(&outstanding).unwrap_or_default().is_empty());
        let cron = schedule(
            Recurrence::Cron {
                expr: "0 9 * * *".into(),
                timezone: "UTC".into(),
            },
            Some(t + Duration::hours(21)),
        );
        let got = upcoming(&cron).unwrap_or_default();
        assert_eq!(got.len(), 5);
        assert_eq!(got[1] - got[0], Duration::days(1));
    }
}
