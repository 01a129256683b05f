//! The action list (`/actions`): status tabs with capped counts, filters kept in the URL
//! ([`ListParams`]), keyset pages (never OFFSET) with previous/next links, and for operators
//! a checkbox per row feeding the bulk form (`bulk` module).
//!
//! Data: `Store::search_actions` for the page, `Store::count_actions` (capped at
//! `UiConfig::count_cap`) for each tab.

use super::layout::{self, Nav, Notice};
use super::MsgQuery;
use crate::error::Result;
use crate::search::{ActionPage, ActionSearch, ActionSummary};
use crate::state::ActionStatus;
use crate::store::Capped;
use crate::ui::params::{sorts_for, ListParams};
use crate::ui::router::{AppState, Ctx};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};

/// The tabs: all, then each status.
const TABS: [Option<ActionStatus>; 6] = [
    None,
    Some(ActionStatus::Pending),
    Some(ActionStatus::Running),
    Some(ActionStatus::Complete),
    Some(ActionStatus::Failed),
    Some(ActionStatus::Canceled),
];

/// `GET /actions`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Query(params): Query<ListParams>,
    Query(msg): Query<MsgQuery>,
) -> Response {
    let result = async {
        let body = render(&st, &ctx, &params, msg.notice(), msg.counts()).await?;
        Ok(layout::page(&ctx, Nav::Actions, "Actions", body))
    }
    .await;
    ctx.respond(result)
}

/// The list's content (also the fragment a bulk POST answers htmx with).
pub(crate) async fn render(
    st: &AppState,
    ctx: &Ctx,
    params: &ListParams,
    notice: Option<Notice>,
    counts: Option<(u64, u64)>,
) -> Result<Markup> {
    let search = params.search(st.cfg.page_size, ctx.tz)?;
    let page = st.store.search_actions(&search).await?;
    let mut tab_counts = Vec::with_capacity(TABS.len());
    for status in TABS {
        let s = ActionSearch {
            status,
            sort: crate::ui::params::default_sort(status),
            after: None,
            before: None,
            ..search.clone()
        };
        tab_counts.push((status, st.store.count_actions(&s, st.cfg.count_cap).await?));
    }
    Ok(html! {
        h1 { "Actions" }
        (layout::notice(ctx, notice, None))
        @if let Some((changed, skipped)) = counts {
            p.notice role="status" { "Changed " (changed) ", skipped " (skipped) "." }
        }
        (tabs(ctx, params, &tab_counts))
        (filters(ctx, params, &search))
        (table(ctx, params, &search, &page))
        (pager(ctx, params, &page))
        (super::bulk::all_matching_form(ctx, params))
    })
}

fn capped(c: &Capped) -> String {
    if c.capped {
        format!("{}+", layout::count(c.n))
    } else {
        layout::count(c.n)
    }
}

fn tabs(ctx: &Ctx, params: &ListParams, counts: &[(Option<ActionStatus>, Capped)]) -> Markup {
    let current = params.status().ok().flatten();
    html! {
        nav.tabs aria-label="Status" {
            @for (status, n) in counts {
                a href=(ctx.href(&params.with_status(*status).href(&[])))
                  aria-current=[(*status == current).then_some("page")] {
                    (status.map_or("all", ActionStatus::as_str)) " "
                    span.count { (capped(n)) }
                }
            }
        }
    }
}

fn filters(ctx: &Ctx, params: &ListParams, search: &ActionSearch) -> Markup {
    html! {
        form.filters method="get" action=(ctx.href("/actions")) role="search" {
            @if !params.status.is_empty() {
                input type="hidden" name="status" value=(params.status);
            }
            label { "Sort "
                select name="sort" {
                    @for (sort, label) in sorts_for(search.status) {
                        option value=(sort.as_str()) selected[*sort == search.sort] { (label) }
                    }
                }
            }
            label { "Hook " input type="search" name="hook" value=(params.hook); }
            label { "Group " input type="text" name="group" value=(params.group) placeholder="- for none"; }
            label { "Priority " input.narrow type="number" name="pmin" value=(params.pmin) placeholder="min";
                " – " input.narrow type="number" name="pmax" value=(params.pmax) placeholder="max"; }
            label { "From " input type="text" name="from" value=(params.from) placeholder="2026-01-31T09:00"; }
            label { "To " input type="text" name="to" value=(params.to) placeholder="RFC 3339 or local"; }
            label { "Args contain " input.wide type="text" name="args" value=(params.args) placeholder=r#"{"user_id": 42}"#; }
            label { input type="checkbox" name="internal" value="1" checked[!params.internal.is_empty()]; " internal" }
            button type="submit" { "Filter" }
            " " a href=(ctx.href(&clear(params))) { "Clear" }
        }
    }
}

/// The list of the same status tab without filters.
fn clear(params: &ListParams) -> String {
    ListParams {
        status: params.status.clone(),
        ..ListParams::default()
    }
    .href(&[])
}

fn table(ctx: &Ctx, params: &ListParams, search: &ActionSearch, page: &ActionPage) -> Markup {
    let op = ctx.operator();
    let rows = html! {
        table.rows {
            thead { tr {
                @if op { th { span.sr-only { "Select" } } }
                th { "id" } th { "hook" } th { "group" } th { "status" } th { "prio" }
                th { "scheduled" } th { "attempts" } th { (time_label(search)) } th { "args" } th { "error" }
            } }
            tbody {
                @for row in &page.rows { (table_row(ctx, row, search, op)) }
                @if page.rows.is_empty() {
                    tr { td colspan="11" .muted { "No actions match." } }
                }
            }
        }
    };
    // Read-only callers get no form at all (only operators can post).
    if !op {
        return rows;
    }
    html! {
        form #bulk method="post" action=(ctx.href("/actions/bulk")) {
            input type="hidden" name="_csrf" value=(ctx.csrf);
            input type="hidden" name="back" value=(params.href(&[]));
            (super::bulk::selected_buttons())
            (rows)
        }
    }
}

fn time_label(search: &ActionSearch) -> &'static str {
    match search.status {
        Some(ActionStatus::Running) => "lease until",
        _ => "finished",
    }
}

fn table_row(ctx: &Ctx, r: &ActionSummary, search: &ActionSearch, op: bool) -> Markup {
    let link = ctx.href(&format!("/actions/{}", r.id));
    html! {
        tr {
            @if op { td { input type="checkbox" name="id" value=(r.id) aria-label={ "Select " (r.id) }; } }
            td { a href=(link) { (r.id) } }
            td { code { (r.hook) } }
            td { (r.group.as_deref().unwrap_or("—")) }
            td { (layout::status(r.status)) }
            td.num { (r.priority) }
            td { (layout::time_rel(ctx, r.scheduled_at)) }
            td.num { (r.attempt) "/" (r.max_attempts) }
            td {
                @if search.status == Some(ActionStatus::Running) || r.status == ActionStatus::Running {
                    (layout::time_opt(ctx, r.lease_until))
                    @if let Some(o) = &r.lease_owner { br; span.muted { (o) } }
                } @else {
                    (layout::time_opt(ctx, r.finished_at))
                }
            }
            td { code.clip { (r.args_head) } }
            td { span.clip.err { (r.error_head.as_deref().unwrap_or("")) } }
        }
    }
}

fn pager(ctx: &Ctx, params: &ListParams, page: &ActionPage) -> Markup {
    let first = ListParams {
        after: String::new(),
        before: String::new(),
        ..params.clone()
    };
    html! {
        nav.pager aria-label="Pages" {
            a href=(ctx.href(&first.href(&[]))) { "First" }
            @if let Some(prev) = &page.prev {
                a rel="prev" href=(ctx.href(&first.href(&[("before", &prev.to_string())]))) { "← Previous" }
            }
            @if let Some(next) = &page.next {
                a rel="next" href=(ctx.href(&first.href(&[("after", &next.to_string())]))) { "Next →" }
            }
        }
    }
}
