//! Overview (`/`): counts per status and per group, the past-due count and the oldest due
//! lag, and the throughput chart.
//!
//! Data today: `Store::stats(now)` (exact counts; one grouped scan). Plan commit 6 swaps it for
//! the capped, cached `count_actions` and `group_overview`, and feeds
//! [`super::chart::throughput_chart`] from `Store::throughput`.

use super::chart::throughput_chart;
use super::layout::{self, count, Nav};
use crate::state::ActionStatus;
use crate::store::QueueStats;
use crate::ui::router::{AppState, Ctx};
use axum::extract::State;
use axum::response::Response;
use maud::{html, Markup};

/// `GET /`.
pub(crate) async fn page(State(st): State<AppState>, ctx: Ctx) -> Response {
    let result = async {
        let stats = st.store.stats(ctx.now).await?;
        Ok(layout::page(
            &ctx,
            Nav::Overview,
            "Overview",
            body(&ctx, &stats),
        ))
    }
    .await;
    ctx.respond(result)
}

fn body(ctx: &Ctx, stats: &QueueStats) -> Markup {
    html! {
        h1 { "Overview" }
        (status_cards(ctx, stats))
        (due_cards(stats))
        h2 { "Throughput" }
        div.panel {
            // Fed by `Store::throughput` once it exists (plan commit 3).
            (throughput_chart(&[]))
        }
        h2 { "Groups" }
        (groups(ctx, stats))
    }
}

fn status_count(stats: &QueueStats, s: ActionStatus) -> i64 {
    stats.by_status.get(s.as_str()).copied().unwrap_or(0)
}

fn status_cards(ctx: &Ctx, stats: &QueueStats) -> Markup {
    html! {
        div.cards {
            @for s in ActionStatus::ALL {
                a.card href=(ctx.href(&format!("/actions?status={}", s.as_str()))) {
                    div.label { (layout::status(s)) }
                    div.value { (count(status_count(stats, s))) }
                }
            }
        }
    }
}

fn due_cards(stats: &QueueStats) -> Markup {
    html! {
        div.cards {
            div.card {
                div.label { "Past due" }
                div.value { (count(stats.past_due)) }
            }
            div.card title="How late the oldest due pending action is" {
                div.label { "Oldest due lag" }
                div.value {
                    @match stats.oldest_due_lag_ms {
                        Some(ms) => (layout::duration(ms.max(0).unsigned_abs())),
                        None => span.muted { "—" },
                    }
                }
            }
        }
    }
}

fn groups(ctx: &Ctx, stats: &QueueStats) -> Markup {
    if stats.by_group.is_empty() {
        return html! { p.muted { "No actions yet." } };
    }
    html! {
        div.panel {
            table.rows {
                thead {
                    tr {
                        th { "Group" }
                        @for s in ActionStatus::ALL { th.num { (s.as_str()) } }
                    }
                }
                tbody {
                    @for (group, counts) in &stats.by_group {
                        tr {
                            td { (group_link(ctx, group)) }
                            @for s in ActionStatus::ALL {
                                td.num { (count(counts.get(s.as_str()).copied().unwrap_or(0))) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn group_link(ctx: &Ctx, group: &str) -> Markup {
    if group.is_empty() {
        return html! { span.muted { "(no group)" } };
    }
    let href = ctx.href(&format!("/actions?group={}", layout::query_value(group)));
    html! { a href=(href) { (group) } }
}
