//! Groups (`/groups`): per action group, the capped pending, due and running counts and the
//! lag of its oldest due action, each row linking to the group's actions.
//!
//! Operators pause a group (claims skip its pending actions; running ones finish) and resume
//! it (`POST /groups/pause`, `/groups/resume`, the group in the form). Group limits are shown
//! and edited below the table ([`super::group_limits`]).
//!
//! Data: `Store::group_overview` (group names found by skipping through the group index, at
//! most [`MAX_GROUPS`]; every count capped at `UiConfig::count_cap`), `Store::paused_groups`,
//! `Store::set_group_paused`, `Store::group_limits`.

use super::layout::{self, Nav, Notice, MAIN_ID};
use super::MsgQuery;
use crate::error::{Error, Result};
use crate::limits::GroupLimitInfo;
use crate::search::{GroupPause, GroupStat};
use crate::store::Capped;
use crate::ui::router::{audit, AppState, Ctx};
use axum::extract::{Query, State};
use axum::response::Response;
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

/// The most groups a page lists.
pub(crate) const MAX_GROUPS: i64 = 200;

/// `GET /groups`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Query(q): Query<MsgQuery>,
) -> Response {
    let result = async {
        let body = render(&st, &ctx, q.notice()).await?;
        Ok(layout::page(&ctx, Nav::Groups, "Groups", body))
    }
    .await;
    ctx.respond(result)
}

/// The page's main element.
pub(crate) async fn render(st: &AppState, ctx: &Ctx, notice: Option<Notice>) -> Result<Markup> {
    let groups = st
        .store
        .group_overview(ctx.now, st.cfg.count_cap, MAX_GROUPS)
        .await?;
    let paused = st.store.paused_groups().await?;
    let limits = st.store.group_limits(ctx.now).await?;
    Ok(body(ctx, &groups, &paused, &limits, notice))
}

/// The form of the pause and resume buttons.
#[derive(Debug, Deserialize)]
pub(crate) struct GroupForm {
    #[serde(default)]
    group: String,
}

/// `POST /groups/pause`.
pub(crate) async fn pause(st: State<AppState>, ctx: Ctx, form: Form<GroupForm>) -> Response {
    set_paused(st, ctx, form, true).await
}

/// `POST /groups/resume`.
pub(crate) async fn resume(st: State<AppState>, ctx: Ctx, form: Form<GroupForm>) -> Response {
    set_paused(st, ctx, form, false).await
}

async fn set_paused(
    State(st): State<AppState>,
    ctx: Ctx,
    Form(form): Form<GroupForm>,
    paused: bool,
) -> Response {
    let result = async {
        let group = form.group.trim();
        if group.is_empty() {
            return Err(Error::invalid(
                "group",
                "no group named (actions without a group cannot be paused)",
            ));
        }
        let actor = format!("ui:{}", ctx.user);
        let changed = st
            .store
            .set_group_paused(group, paused, &actor, ctx.now)
            .await?;
        let op = if paused {
            "group_pause"
        } else {
            "group_resume"
        };
        audit(&ctx, op, group, 1, u64::from(changed));
        let notice = if paused {
            Notice::GroupPaused
        } else {
            Notice::GroupResumed
        };
        ctx.done("/groups", notice, || async {
            render(&st, &ctx, Some(notice)).await
        })
        .await
    }
    .await;
    ctx.respond(result)
}

fn group_button(ctx: &Ctx, group: &str, paused: bool) -> Markup {
    if !ctx.operator() {
        return html! {};
    }
    let (path, label) = if paused {
        ("/groups/resume", "Resume")
    } else {
        ("/groups/pause", "Pause")
    };
    let url = ctx.href(path);
    html! {
        form.inline method="post" action=(url) hx-post=(url)
            hx-target={ "#" (MAIN_ID) } hx-swap="innerHTML" {
            input type="hidden" name="_csrf" value=(ctx.csrf);
            input type="hidden" name="group" value=(group);
            button.small type="submit" { (label) }
        }
    }
}

/// "12", or "100,000+" at the cap.
pub(crate) fn capped(c: Capped) -> String {
    if c.capped {
        format!("{}+", layout::count(c.n))
    } else {
        layout::count(c.n)
    }
}

fn body(
    ctx: &Ctx,
    groups: &[GroupStat],
    paused: &[GroupPause],
    limits: &[GroupLimitInfo],
    notice: Option<Notice>,
) -> Markup {
    html! {
        h1 { "Groups" }
        (layout::notice(ctx, notice, None))
        @if !paused.is_empty() {
            h2 { "Paused" }
            table.rows {
                thead { tr { th { "group" } th { "since" } th { "by" } th {} } }
                tbody {
                    @for p in paused {
                        tr {
                            td { (p.group) " " span.badge.s-canceled { "paused" } }
                            td { (layout::time_rel(ctx, p.paused_at)) }
                            td { (p.paused_by) }
                            td { (group_button(ctx, &p.group, true)) }
                        }
                    }
                }
            }
            h2 { "All groups" }
        }
        @if groups.is_empty() {
            p.muted { "No pending or running actions." }
        } @else {
            (table_with(ctx, groups, paused))
            @if groups.len() as i64 > MAX_GROUPS {
                p.muted { "Only the first " (MAX_GROUPS) " groups by name are listed." }
            }
        }
        (super::group_limits::section(ctx, limits))
    }
}

/// The group table (the overview's, without buttons).
pub(crate) fn table(ctx: &Ctx, groups: &[GroupStat]) -> Markup {
    table_inner(ctx, groups, None)
}

fn table_with(ctx: &Ctx, groups: &[GroupStat], paused: &[GroupPause]) -> Markup {
    table_inner(ctx, groups, Some(paused))
}

fn table_inner(ctx: &Ctx, groups: &[GroupStat], paused: Option<&[GroupPause]>) -> Markup {
    let is_paused = |g: &str| paused.is_some_and(|p| p.iter().any(|p| p.group == g));
    html! {
        table.rows {
            thead { tr { th { "group" } th.num { "pending" } th.num { "due now" } th.num { "running" } th { "lag" } @if paused.is_some() { th {} } } }
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
                        @if paused.is_some() {
                            td {
                                @if let Some(name) = &g.group {
                                    @if is_paused(name) { span.badge.s-canceled { "paused" } " " }
                                    (group_button(ctx, name, is_paused(name)))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
