//! Item claims (`/claims`): per scope, capped counts of held, processed and deferred claims
//! and of stale ones (held past their expiry); below, a keyset-paged list filtered by scope,
//! status, job, or staleness. Claims held by a job that is already final are reported by
//! `dockhand check`.
//!
//! Data: `Store::claim_scopes` and `Store::search_claims`.

use super::groups::capped;
use super::layout::{self, Nav};
use crate::error::{Error, Result};
use crate::search::{ClaimPage, ClaimSearch, ScopeStat};
use crate::state::ClaimStatus;
use crate::ui::router::{AppState, Ctx};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;

/// The most scopes the summary lists.
const MAX_SCOPES: i64 = 100;

/// The query string of `/claims`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ClaimParams {
    #[serde(default)]
    scope: String,
    /// `claimed` (default), `processed`, `deferred`, or `all`.
    #[serde(default)]
    status: String,
    #[serde(default)]
    job: String,
    /// `1`: only stale claims.
    #[serde(default)]
    stale: String,
    #[serde(default)]
    after: String,
    #[serde(default)]
    before: String,
}

fn id_field(field: &'static str, s: &str) -> Result<Option<i64>> {
    let t = s.trim();
    if t.is_empty() {
        return Ok(None);
    }
    t.parse()
        .map(Some)
        .map_err(|_| Error::invalid(field, format!("`{t}` is not an id")))
}

impl ClaimParams {
    fn search(&self, ctx: &Ctx, limit: i64) -> Result<ClaimSearch> {
        let status = match self.status.trim() {
            "" | "claimed" => Some(ClaimStatus::Claimed),
            "processed" => Some(ClaimStatus::Processed),
            "deferred" => Some(ClaimStatus::Deferred),
            "all" => None,
            other => {
                return Err(Error::invalid(
                    "status",
                    format!("unknown claim status `{other}`"),
                ))
            }
        };
        let stale = !self.stale.trim().is_empty();
        let s = ClaimSearch {
            scope: Some(self.scope.trim())
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
            status: if stale { None } else { status },
            job_id: id_field("job", &self.job)?,
            stale_at: stale.then_some(ctx.now),
            after: id_field("after", &self.after)?,
            before: id_field("before", &self.before)?,
            limit,
        };
        s.validate()?;
        Ok(s)
    }

    fn href(&self, cursor: Option<(&str, i64)>) -> String {
        let mut pairs: Vec<String> = [
            ("scope", &self.scope),
            ("status", &self.status),
            ("job", &self.job),
            ("stale", &self.stale),
        ]
        .into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| format!("{k}={}", layout::query_value(v.trim())))
        .collect();
        if let Some((k, id)) = cursor {
            pairs.push(format!("{k}={id}"));
        }
        if pairs.is_empty() {
            "/claims".into()
        } else {
            format!("/claims?{}", pairs.join("&"))
        }
    }
}

/// `GET /claims`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Query(p): Query<ClaimParams>,
) -> Response {
    let result = async {
        let search = p.search(&ctx, st.cfg.page_size)?;
        let scopes = st.store.claim_scopes(ctx.now, st.cfg.count_cap, MAX_SCOPES).await?;
        let page = st.store.search_claims(&search).await?;
        let body = html! {
            h1 { "Item claims" }
            (scope_table(&ctx, &scopes))
            (filters(&ctx, &p))
            (claim_table(&ctx, &page))
            nav.pager aria-label="Pages" {
                a href=(ctx.href(&p.href(None))) { "First" }
                @if let Some(prev) = page.prev { a rel="prev" href=(ctx.href(&p.href(Some(("before", prev))))) { "← Previous" } }
                @if let Some(next) = page.next { a rel="next" href=(ctx.href(&p.href(Some(("after", next))))) { "Next →" } }
            }
        };
        Ok(layout::page(&ctx, Nav::Claims, "Claims", body))
    }
    .await;
    ctx.respond(result)
}

fn scope_table(ctx: &Ctx, scopes: &[ScopeStat]) -> Markup {
    html! {
        table.rows {
            thead { tr { th { "scope" } th.num { "held" } th.num { "stale" } th.num { "processed" } th.num { "deferred" } } }
            tbody {
                @for s in scopes {
                    @let q = layout::query_value(&s.scope);
                    tr {
                        td { a href=(ctx.href(&format!("/claims?scope={q}"))) { (s.scope) } }
                        td.num { (capped(s.claimed)) }
                        td.num {
                            @if s.stale.n > 0 { a.warn href=(ctx.href(&format!("/claims?scope={q}&stale=1"))) { (capped(s.stale)) } }
                            @else { "0" }
                        }
                        td.num { (capped(s.processed)) }
                        td.num { (capped(s.deferred)) }
                    }
                }
                @if scopes.is_empty() { tr { td colspan="5" .muted { "No claims." } } }
            }
        }
    }
}

fn filters(ctx: &Ctx, p: &ClaimParams) -> Markup {
    html! {
        form.filters method="get" action=(ctx.href("/claims")) role="search" {
            label { "Scope " input type="search" name="scope" value=(p.scope); }
            label { "Status "
                select name="status" {
                    @for s in ["claimed", "processed", "deferred", "all"] {
                        option value=(s) selected[p.status == s || (p.status.is_empty() && s == "claimed")] { (s) }
                    }
                }
            }
            label { "Job " input.narrow type="text" name="job" value=(p.job); }
            label { input type="checkbox" name="stale" value="1" checked[!p.stale.is_empty()]; " stale only" }
            button type="submit" { "Filter" }
        }
    }
}

fn claim_table(ctx: &Ctx, page: &ClaimPage) -> Markup {
    html! {
        table.rows {
            thead { tr { th { "id" } th { "scope" } th { "source" } th { "item" } th { "status" } th { "job" } th { "claimed" } th { "expires" } } }
            tbody {
                @for r in &page.rows {
                    @let c = &r.claim;
                    @let stale = c.status == ClaimStatus::Claimed && c.expires_at.is_some_and(|e| e < ctx.now);
                    tr {
                        td { (r.id) }
                        td { (c.identity.scope) }
                        td { (c.identity.source_type) }
                        td { code.clip { (c.identity.item_id) } }
                        td { span class={ "badge c-" (c.status.as_str()) } { (c.status.as_str()) } @if stale { " " span.badge.s-failed { "stale" } } }
                        td { @if let Some(j) = c.job_id { a href=(ctx.href(&format!("/jobs/{j}"))) { (j) } } }
                        td { (layout::time_opt(ctx, c.claimed_at)) }
                        td { (layout::time_opt(ctx, c.expires_at)) }
                    }
                }
                @if page.rows.is_empty() { tr { td colspan="8" .muted { "No claims match." } } }
            }
        }
    }
}
