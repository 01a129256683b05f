//! The limits section of the groups page (`/groups`): each limited group's concurrency limit
//! beside its running actions (buffered ones included) and its rate beside the starts in the
//! current window; operators set a group's limits (`POST /groups/limit`: group, concurrency,
//! rate such as `10/s`; an empty field is no limit of that kind) and clear them
//! (`POST /groups/unlimit`). Read-only callers see the table without the forms.
//!
//! Data: `Store::group_limits`, `Store::set_group_limit`, `Store::clear_group_limit`; what the
//! limits mean is [`crate::limits`].

use super::groups::render;
use super::layout::{Notice, MAIN_ID};
use crate::error::{Error, Result};
use crate::limits::{GroupLimit, GroupLimitInfo, RateLimit};
use crate::ui::router::{audit, AppState, Ctx};
use axum::extract::State;
use axum::response::Response;
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

/// The form of the limit editor.
#[derive(Debug, Deserialize)]
pub(crate) struct LimitForm {
    #[serde(default)]
    group: String,
    #[serde(default)]
    concurrency: String,
    #[serde(default)]
    rate: String,
}

impl LimitForm {
    /// The limits the form asks for; errors name the field.
    fn limit(&self) -> Result<GroupLimit> {
        let concurrency = match self.concurrency.trim() {
            "" => None,
            n => Some(n.parse::<u32>().map_err(|_| {
                Error::invalid(
                    "concurrency",
                    format!("`{n}` is not a whole number of at least 1"),
                )
            })?),
        };
        let rate = match self.rate.trim() {
            "" => None,
            r => Some(r.parse::<RateLimit>()?),
        };
        let limit = GroupLimit { concurrency, rate };
        limit.validate()?;
        Ok(limit)
    }
}

fn named(group: &str) -> Result<&str> {
    let group = group.trim();
    if group.is_empty() {
        return Err(Error::invalid(
            "group",
            "no group named (actions without a group cannot be limited)",
        ));
    }
    Ok(group)
}

/// `POST /groups/limit`.
pub(crate) async fn set(
    State(st): State<AppState>,
    ctx: Ctx,
    Form(form): Form<LimitForm>,
) -> Response {
    let result = async {
        let group = named(&form.group)?;
        let limit = form.limit()?;
        let actor = format!("ui:{}", ctx.user);
        st.store
            .set_group_limit(group, &limit, &actor, ctx.now)
            .await?;
        audit(&ctx, "group_limit", group, 1, 1);
        let notice = Notice::GroupLimitSet;
        ctx.done("/groups", notice, || async {
            render(&st, &ctx, Some(notice)).await
        })
        .await
    }
    .await;
    ctx.respond(result)
}

/// `POST /groups/unlimit`.
pub(crate) async fn clear(
    State(st): State<AppState>,
    ctx: Ctx,
    Form(form): Form<LimitForm>,
) -> Response {
    let result = async {
        let group = named(&form.group)?;
        let changed = st.store.clear_group_limit(group).await?;
        audit(&ctx, "group_unlimit", group, 1, u64::from(changed));
        let notice = Notice::GroupLimitCleared;
        ctx.done("/groups", notice, || async {
            render(&st, &ctx, Some(notice)).await
        })
        .await
    }
    .await;
    ctx.respond(result)
}

/// A POST form aimed at the main element, with the CSRF token.
fn form(ctx: &Ctx, path: &str, inner: Markup) -> Markup {
    let url = ctx.href(path);
    html! {
        form.inline method="post" action=(url) hx-post=(url)
            hx-target={ "#" (MAIN_ID) } hx-swap="innerHTML" {
            input type="hidden" name="_csrf" value=(ctx.csrf);
            (inner)
        }
    }
}

/// The editor: group, concurrency and rate, prefilled from `current`.
fn editor(ctx: &Ctx, group: Option<&str>, current: Option<&GroupLimit>) -> Markup {
    let concurrency = current
        .and_then(|l| l.concurrency)
        .map(|n| n.to_string())
        .unwrap_or_default();
    let rate = current
        .and_then(|l| l.rate)
        .map(|r| r.to_string())
        .unwrap_or_default();
    form(
        ctx,
        "/groups/limit",
        html! {
            @match group {
                Some(g) => { input type="hidden" name="group" value=(g); }
                None => { input type="text" name="group" placeholder="group" size="14" required; }
            }
            " "
            input type="number" name="concurrency" min="1" placeholder="concurrency" size="6"
                value=(concurrency) title="at most this many running at once (empty: no limit)";
            " "
            input type="text" name="rate" placeholder="rate, e.g. 10/s" size="10" value=(rate)
                title="at most N starts per period: 10/s, 100/5m (empty: no limit)";
            " "
            button.small type="submit" { @if group.is_some() { "Save" } @else { "Set limit" } }
        },
    )
}

/// The limits section.
pub(crate) fn section(ctx: &Ctx, limits: &[GroupLimitInfo]) -> Markup {
    html! {
        h2 { "Limits" }
        p.muted {
            "Per group, for every runner on this database: at most N running at once "
            "(actions claimed ahead into a runner's buffer count as running), at most N starts "
            "in any window of the period."
        }
        @if limits.is_empty() {
            p.muted { "No group has limits." }
        } @else {
            table.rows {
                thead { tr {
                    th { "group" } th.num { "running / limit" } th.num { "starts / rate" }
                    th { "set" } th { "by" } @if ctx.operator() { th {} }
                } }
                tbody {
                    @for l in limits {
                        tr {
                            td { (l.group) }
                            td.num {
                                (l.running) " / "
                                @match l.limit.concurrency { Some(n) => { (n) } None => { span.muted { "—" } } }
                            }
                            td.num {
                                @match l.limit.rate {
                                    Some(r) => { (l.recent_starts) " / " (r) }
                                    None => { span.muted { "—" } }
                                }
                            }
                            td { (super::layout::time_rel(ctx, l.set_at)) }
                            td { (l.set_by) }
                            @if ctx.operator() {
                                td {
                                    (editor(ctx, Some(&l.group), Some(&l.limit)))
                                    " "
                                    (form(ctx, "/groups/unlimit", html! {
                                        input type="hidden" name="group" value=(l.group);
                                        button.small type="submit" { "Clear" }
                                    }))
                                }
                            }
                        }
                    }
                }
            }
        }
        @if ctx.operator() {
            p { (editor(ctx, None, None)) }
        }
    }
}
