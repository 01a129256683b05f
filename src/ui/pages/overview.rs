//! Overview (`/`): capped counts per status, how many pending actions are due and how late the
//! oldest is, throughput and failures per minute over the last hour and per 15 minutes over the
//! last day (inline SVG), and the groups with their depth, running count and lag.
//!
//! Data: `Store::count_actions` per status (capped at `UiConfig::count_cap`),
//! `Store::group_overview`, `Store::throughput`; counts and groups are cached for
//! `UiConfig::cache_ttl`, the hour chart for 10 s and the day chart for 60 s, each behind a
//! single-flight slot (`ui::cache`), so many open dashboards cost one query set per period.

use super::chart::throughput_chart;
use super::groups::{self, capped};
use super::layout::{self, Nav};
use crate::error::Result;
use crate::search::{ActionSearch, ActionSort, GroupStat};
use crate::state::ActionStatus;
use crate::store::{Capped, ThroughputBucket};
use crate::ui::router::{AppState, Ctx};
use axum::extract::State;
use axum::response::Response;
use chrono::Duration;
use maud::{html, Markup};

/// What the overview's counts show (cached together).
#[derive(Debug, Clone)]
pub(crate) struct Counts {
    /// Per status, capped.
    by_status: Vec<(ActionStatus, Capped)>,
    /// Pending actions due now, capped.
    due: Capped,
    /// Per group.
    groups: Vec<GroupStat>,
}

/// The overview's cached reads.
pub(crate) struct OverviewCache {
    counts: super::super::cache::Slot<Counts>,
    hour: super::super::cache::Slot<Vec<ThroughputBucket>>,
    day: super::super::cache::Slot<Vec<ThroughputBucket>>,
}

impl OverviewCache {
    /// Empty slots.
    pub(crate) fn new() -> Self {
        Self {
            counts: super::super::cache::Slot::new(),
            hour: super::super::cache::Slot::new(),
            day: super::super::cache::Slot::new(),
        }
    }
}

/// `GET /`.
pub(crate) async fn page(State(st): State<AppState>, ctx: Ctx) -> Response {
    let result = async {
        let body = body(&st, &ctx).await?;
        Ok(layout::page(&ctx, Nav::Overview, "Overview", body))
    }
    .await;
    ctx.respond(result)
}

async fn load_counts(st: &AppState, ctx: &Ctx) -> Result<Counts> {
    let cap = st.cfg.count_cap;
    let mut by_status = Vec::with_capacity(ActionStatus::ALL.len());
    for status in ActionStatus::ALL {
        let s = ActionSearch {
            status: Some(status),
            ..ActionSearch::default()
        };
        by_status.push((status, st.store.count_actions(&s, cap).await?));
    }
    let due_search = ActionSearch {
        status: Some(ActionStatus::Pending),
        sort: ActionSort::Scheduled,
        to: Some(ctx.now + Duration::milliseconds(1)),
        ..ActionSearch::default()
    };
    let due = st.store.count_actions(&due_search, cap).await?;
    let groups = st
        .store
        .group_overview(ctx.now, cap, groups::MAX_GROUPS)
        .await?;
    Ok(Counts {
        by_status,
        due,
        groups,
    })
}

fn as_rows(b: &[ThroughputBucket]) -> Vec<(chrono::DateTime<chrono::Utc>, i64, i64)> {
    b.iter().map(|b| (b.start, b.completed, b.failed)).collect()
}

async fn body(st: &AppState, ctx: &Ctx) -> Result<Markup> {
    let cache = &st.overview;
    let counts = cache
        .counts
        .get(st.cfg.cache_ttl, || load_counts(st, ctx))
        .await?;
    // The current (partial) bucket included.
    let until = ctx.now + Duration::milliseconds(1);
    let hour = cache
        .hour
        .get(
            std::time::Duration::from_secs(10).min(st.cfg.cache_ttl * 2),
            || {
                st.store
                    .throughput(ctx.now - Duration::hours(1), until, Duration::minutes(1))
            },
        )
        .await?;
    let day = cache
        .day
        .get(
            std::time::Duration::from_secs(60).min(st.cfg.cache_ttl * 12),
            || {
                st.store
                    .throughput(ctx.now - Duration::days(1), until, Duration::minutes(15))
            },
        )
        .await?;
    let oldest = counts.groups.iter().filter_map(|g| g.oldest_due).min();
    Ok(html! {
        h1 { "Overview" }
        div.cards {
            @for (s, n) in &counts.by_status {
                a.card href=(ctx.href(&format!("/actions?status={}", s.as_str()))) {
                    div.label { (layout::status(*s)) }
                    div.value { (capped(*n)) }
                }
            }
        }
        div.cards {
            a.card href=(ctx.href("/actions?status=pending&sort=s")) {
                div.label { "Due now" }
                div.value { (capped(counts.due)) }
            }
            div.card title="How late the oldest due pending action is" {
                div.label { "Oldest due lag" }
                div.value {
                    @match oldest {
                        Some(t) => (layout::duration((ctx.now - t).num_milliseconds().max(0).unsigned_abs())),
                        None => span.muted { "—" },
                    }
                }
            }
        }
        h2 { "Last hour, per minute" }
        div.panel { (throughput_chart(&as_rows(&hour))) }
        h2 { "Last day, per 15 minutes" }
        div.panel { (throughput_chart(&as_rows(&day))) }
        h2 { "Groups" }
        @if counts.groups.is_empty() {
            p.muted { "No pending or running actions." }
        } @else {
            div.panel { (groups::table(ctx, &counts.groups)) }
        }
        p.muted { "Counts stop at " (layout::count(st.cfg.count_cap)) " and are at most "
            (st.cfg.cache_ttl.as_secs()) " s old." }
    })
}
