//! Groups (`/groups`): per action group, the capped pending, due and running counts and the
//! lag of its oldest due action, each row linking to the group's actions.
//!
//! Data: `Store::group_overview` (group names found by skipping through the group index, at
//! most [`MAX_GROUPS`]; every count capped at `UiConfig::count_cap`). Pausing a group is not
//! offered yet: it needs a change of the claim statement on every backend (plan commit 13).

use super::layout::{self, Nav};
use crate::search::GroupStat;
use crate::store::Capped;
use crate::ui::router::{AppState, Ctx};
use axum::extract::State;
use axum::response::Response;
use maud::{html, Markup};

/// The most groups a page lists.
pub(crate) const MAX_GROUPS: i64 = 200;

/// `GET /groups`.
pub(crate) async fn page(State(st): State<AppState>, ctx: Ctx) -> Response {
    let result = async {
        let groups = st
            .store
            .group_overview(ctx.now, st.cfg.count_cap, MAX_GROUPS)
            .await?;
        Ok(layout::page(
            &ctx,
            Nav::Groups,
            "Groups",
            body(&ctx, &groups),
        ))
    }
    .await;
    ctx.respond(result)
}

/// "12", or "100,000+" at the cap.
pub(crate) fn capped(c: Capped) -> String {
    if c.capped {
        format!("{}+", layout::count(c.n))
    } else {
        layout::count(c.n)
    }
}

fn body(ctx: &Ctx, groups: &[GroupStat]) -> Markup {
    html! {
        h1 { "Groups" }
        @if groups.is_empty() {
            p.muted { "No pending or running actions." }
        } @else {
            (table(ctx, groups))
            @if groups.len() as i64 > MAX_GROUPS {
                p.muted { "Only the first " (MAX_GROUPS) " groups by name are listed." }
            }
        }
    }
}

/// The group table (also on the overview).
pub(crate) fn table(ctx: &Ctx, groups: &[GroupStat]) -> Markup {
    html! {
        table.rows {
            thead { tr { th { "group" } th.num { "pending" } th.num { "due now" } th.num { "running" } th { "lag" } } }
            tbody {
                @for g in groups {
                    @let name = g.group.as_deref().unwrap_or("-");
                    @let link = format!("/actions?status=pending&group={}", layout::query_value(name));
                    tr {
                        td { a href=(ctx.href(&link)) { (g.group.as_deref().unwrap_or("(none)")) } }
                        td.num { (capped(g.pending)) }
                        td.num { (capped(g.due)) }
                        td.num { (capped(g.running)) }
                        td {
                            @match g.oldest_due {
                                Some(t) => { (layout::duration((ctx.now - t).num_milliseconds().max(0).unsigned_abs())) }
                                None => { span.muted { "—" } }
                            }
                        }
                    }
                }
            }
        }
    }
}
