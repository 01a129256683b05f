//! Bulk operator changes from the action list: retry, cancel, run now and delete, on the
//! selected rows (`POST /actions/bulk`) or on every action matching the list's filter — first
//! a dry run that counts them and fixes the highest id (`POST /actions/bulk/preview`), then
//! the change itself (`POST /actions/bulk/all`), walked in keyset chunks of
//! `UiConfig::bulk_chunk`, one transaction each, with `UiConfig::bulk_pause` between them so
//! the workers keep the database. Actions enqueued after the dry run are never touched, and
//! one run changes at most `UiConfig::count_cap` rows. Every request writes one audit event.

use super::layout::{self, Nav};
use crate::error::{Error, Result};
use crate::search::MAX_PAGE;
use crate::store::BulkOutcome;
use crate::ui::params::ListParams;
use crate::ui::router::{audit_bulk, AppState, Ctx};
use axum::extract::{Query, State};
use axum::response::Response;
use axum::Form;
use maud::{html, Markup};

/// A bulk change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkOp {
    /// Failed or canceled → pending, attempts reset.
    Retry,
    /// Pending or running → canceled.
    Cancel,
    /// Pending and due later → due now.
    RunNow,
    /// Removed with its log (never a running action).
    Delete,
}

const OPS: [(BulkOp, &str, &str); 4] = [
    (BulkOp::Retry, "retry", "Retry"),
    (BulkOp::Cancel, "cancel", "Cancel"),
    (BulkOp::RunNow, "run_now", "Run now"),
    (BulkOp::Delete, "delete", "Delete"),
];

impl BulkOp {
    fn parse(s: &str) -> Result<Self> {
        OPS.iter()
            .find(|(_, name, _)| *name == s)
            .map(|(op, _, _)| *op)
            .ok_or_else(|| {
                Error::invalid(
                    "op",
                    format!("unknown bulk change `{s}` (retry, cancel, run_now, delete)"),
                )
            })
    }

    /// The name in forms and audit events.
    pub(crate) fn as_str(self) -> &'static str {
        OPS.iter()
            .find(|(op, _, _)| *op == self)
            .map_or("", |(_, n, _)| n)
    }

    fn label(self) -> &'static str {
        OPS.iter()
            .find(|(op, _, _)| *op == self)
            .map_or("", |(_, _, l)| l)
    }

    async fn apply(self, st: &AppState, ctx: &Ctx, ids: &[i64]) -> Result<BulkOutcome> {
        let actor = format!("ui:{}", ctx.user);
        match self {
            BulkOp::Retry => st.store.retry_many(ids, &actor, ctx.now).await,
            BulkOp::Cancel => st.store.cancel_many(ids, &actor, ctx.now).await,
            BulkOp::RunNow => st.store.run_now(ids, &actor, ctx.now).await,
            BulkOp::Delete => st.store.delete_actions(ids).await,
        }
    }
}

/// The buttons over the list that act on the checked rows (operators only; the caller
/// renders them inside the list's form).
pub(crate) fn selected_buttons() -> Markup {
    html! {
        div.bulkbar {
            span.muted { "Checked rows: " }
            @for (_, name, label) in OPS {
                button.small type="submit" name="op" value=(name) { (label) }
            }
        }
    }
}

/// The form that starts a dry run over every action matching the filter (operators only).
pub(crate) fn all_matching_form(ctx: &Ctx, params: &ListParams) -> Markup {
    if !ctx.operator() {
        return html! {};
    }
    html! {
        form.bulkall method="post" action=(ctx.href("/actions/bulk/preview")) {
            input type="hidden" name="_csrf" value=(ctx.csrf);
            (filter_fields(params))
            label { "All matching this filter: "
                select name="op" { @for (_, name, label) in OPS { option value=(name) { (label) } } }
            }
            " " button.small type="submit" { "Count first…" }
        }
    }
}

fn filter_fields(params: &ListParams) -> Markup {
    html! {
        @for (k, v) in params.filter_pairs() { input type="hidden" name=(k) value=(v); }
    }
}

/// The fields of a bulk POST: the list's filter, the change, and the rest as pairs.
struct BulkForm {
    params: ListParams,
    op: BulkOp,
    ids: Vec<i64>,
    max_id: Option<i64>,
    back: String,
}

fn read_form(pairs: Vec<(String, String)>) -> Result<BulkForm> {
    let mut params = ListParams::default();
    let (mut op, mut ids, mut max_id, mut back) = (None, Vec::new(), None, String::new());
    for (k, v) in pairs {
        let slot = match k.as_str() {
            "op" => {
                op = Some(BulkOp::parse(&v)?);
                continue;
            }
            "id" => {
                ids.push(
                    v.parse::<i64>()
                        .map_err(|_| Error::invalid("id", format!("`{v}` is not an id")))?,
                );
                continue;
            }
            "max_id" => {
                max_id = Some(
                    v.parse::<i64>()
                        .map_err(|_| Error::invalid("max_id", format!("`{v}` is not an id")))?,
                );
                continue;
            }
            "back" => {
                back = v;
                continue;
            }
            "status" => &mut params.status,
            "sort" => &mut params.sort,
            "hook" => &mut params.hook,
            "group" => &mut params.group,
            "pmin" => &mut params.pmin,
            "pmax" => &mut params.pmax,
            "from" => &mut params.from,
            "to" => &mut params.to,
            "args" => &mut params.args,
            "internal" => &mut params.internal,
            _ => continue,
        };
        *slot = v;
    }
    let op = op.ok_or_else(|| Error::invalid("op", "no bulk change chosen"))?;
    if ids.len() as i64 > MAX_PAGE {
        return Err(Error::invalid(
            "id",
            format!("{} rows checked; at most {MAX_PAGE}", ids.len()),
        ));
    }
    if back.is_empty() {
        back = params.href(&[]);
    } else {
        check_back(&back)?;
    }
    if params == ListParams::default() {
        // The checked-rows form sends its list's filter as `back` only: the htmx answer
        // renders that list.
        if let Ok(uri) = back.parse::<axum::http::Uri>() {
            if let Ok(Query(p)) = Query::<ListParams>::try_from_uri(&uri) {
                params = ListParams {
                    after: String::new(),
                    before: String::new(),
                    ..p
                };
            }
        }
    }
    Ok(BulkForm {
        params,
        op,
        ids,
        max_id,
        back,
    })
}

/// Characters a `back` query may hold besides letters and digits: the rest of RFC 3986's
/// unreserved and sub-delims, `:`, `@`, `/`, `?` and `%` (escapes stay escaped).
const BACK_QUERY_CHARS: &[u8] = b"-._~!$&'()*+,;=:@/?%";

/// Checks `back`, the list a bulk change returns to, before anything is changed: it must be
/// a path of the action list, `/actions` or `/actions?<query>`, in visible ASCII that a URL
/// and a `Location` header hold as it is (no CR, LF, NUL, DEL, space, `\` or `#`), so it
/// is neither an open redirect nor an answer that fails after the change.
fn check_back(back: &str) -> Result<()> {
    let query = match back.strip_prefix("/actions") {
        Some("") => Some(""),
        Some(rest) => rest.strip_prefix('?'),
        None => None,
    };
    let ok = query.is_some_and(|q| {
        q.bytes()
            .all(|b| b.is_ascii_alphanumeric() || BACK_QUERY_CHARS.contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "back",
            format!(
                "`{}` is not a path of the action list (/actions?…, URL-encoded); nothing was changed",
                back.escape_debug()
            ),
        ))
    }
}

/// `POST /actions/bulk`: the change on the checked rows.
pub(crate) async fn selected(
    State(st): State<AppState>,
    ctx: Ctx,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let result = async {
        let form = read_form(pairs)?;
        if form.ids.is_empty() {
            return Err(Error::invalid("id", "no rows checked"));
        }
        let outcome = form.op.apply(&st, &ctx, &form.ids).await?;
        audit_bulk(
            &ctx,
            form.op.as_str(),
            &ids_text(&form.ids),
            false,
            form.ids.len() as u64,
            &outcome,
        );
        done(&st, &ctx, &form, &outcome).await
    }
    .await;
    ctx.respond(result)
}

fn ids_text(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

async fn done(st: &AppState, ctx: &Ctx, form: &BulkForm, o: &BulkOutcome) -> Result<Response> {
    let to = format!(
        "{}{}changed={}&skipped={}",
        form.back,
        if form.back.contains('?') { '&' } else { '?' },
        o.changed.len(),
        o.skipped.len()
    );
    ctx.done(&to, layout::Notice::Bulk, || async {
        let counts = (o.changed.len() as u64, o.skipped.len() as u64);
        super::actions::render(
            st,
            ctx,
            &form.params,
            Some(layout::Notice::Bulk),
            Some(counts),
        )
        .await
    })
    .await
}

/// `POST /actions/bulk/preview`: the dry run — how many actions match now, up to which id.
pub(crate) async fn preview(
    State(st): State<AppState>,
    ctx: Ctx,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let result = async {
        let form = read_form(pairs)?;
        let search = form.params.search(1, ctx.tz)?;
        let count = st.store.count_actions(&search, st.cfg.count_cap).await?;
        // The newest action of all, not of the filter: the filter's time range is on its
        // sort's column (scheduled, finished…), which the id order does not keep.
        let newest = st
            .store
            .search_actions(&crate::search::ActionSearch {
                sort: crate::search::ActionSort::IdDesc,
                limit: 1,
                ..crate::search::ActionSearch::default()
            })
            .await?;
        let max_id = newest.rows.first().map_or(0, |r| r.id);
        let dry = BulkOutcome::default();
        audit_bulk(&ctx, form.op.as_str(), "", true, count.n as u64, &dry);
        let body = html! {
            h1 { (form.op.label()) " all matching actions?" }
            p {
                @if count.capped {
                    "At least " strong { (layout::count(count.n)) } " actions match; this run changes the first "
                    (layout::count(count.n)) " of them (run it again for the rest)."
                } @else {
                    strong { (layout::count(count.n)) } " actions match the filter now."
                }
                " Actions enqueued from now on (id above " (max_id) ") are left alone; rows in a status "
                (form.op.label().to_lowercase()) " does not apply to are skipped."
            }
            @if count.n > 0 {
                form method="post" action=(ctx.href("/actions/bulk/all")) {
                    input type="hidden" name="_csrf" value=(ctx.csrf);
                    (filter_fields(&form.params))
                    input type="hidden" name="op" value=(form.op.as_str());
                    input type="hidden" name="max_id" value=(max_id);
                    button.danger type="submit" { (form.op.label()) " " (layout::count(count.n)) " actions" }
                }
            }
            p { a href=(ctx.href(&form.params.href(&[]))) { "Back to the list" } }
        };
        Ok(layout::page(&ctx, Nav::Actions, "Confirm bulk change", body))
    }
    .await;
    ctx.respond(result)
}

/// `POST /actions/bulk/all`: the change on every matching action up to the dry run's id.
pub(crate) async fn all(
    State(st): State<AppState>,
    ctx: Ctx,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let result = async {
        let form = read_form(pairs)?;
        let max_id = form.max_id.ok_or_else(|| Error::invalid("max_id", "missing: count first"))?;
        let chunk = st.cfg.bulk_chunk.clamp(1, MAX_PAGE);
        let mut search = form.params.search(chunk, ctx.tz)?;
        search.max_id = Some(max_id);
        let mut total = BulkOutcome::default();
        let mut seen: i64 = 0;
        while seen < st.cfg.count_cap {
            search.limit = chunk.min(st.cfg.count_cap - seen);
            let page = st.store.search_actions(&search).await?;
            let ids: Vec<i64> = page.rows.iter().map(|r| r.id).collect();
            if ids.is_empty() {
                break;
            }
            seen += ids.len() as i64;
            let o = form.op.apply(&st, &ctx, &ids).await?;
            tracing::debug!(target: "dockhand::ui", op = form.op.as_str(), changed = o.changed.len(), skipped = o.skipped.len(), "bulk chunk");
            total.changed.extend(o.changed);
            total.skipped.extend(o.skipped);
            match page.next {
                Some(next) => search.after = Some(next),
                None => break,
            }
            tokio::time::sleep(st.cfg.bulk_pause).await;
        }
        audit_bulk(&ctx, form.op.as_str(), &format!("filter up to id {max_id}"), false, seen as u64, &total);
        done(&st, &ctx, &form, &total).await
    }
    .await;
    ctx.respond(result)
}

#[cfg(test)]
mod tests {
    use super::check_back;

    #[test]
    fn back_is_a_path_of_the_action_list_that_a_location_holds() {
        for ok in [
            "/actions",
            "/actions?status=pending",
            "/actions?hook=a%0D%0Ab&args=%7B%22a%22%3A1%7D",
        ] {
            assert!(check_back(ok).is_ok(), "{ok}");
        }
        for bad in [
            "/actions?x=1\r\nSet-Cookie: a=b",
            "/actions?x=\n",
            "/actions?x=\0",
            "/actions?x=\x7f",
            "/actions?x=a b",
            "/actions?x=é",
            "/actions#top",
            "/actions/../groups",
            "/actionsfoo",
            "/groups",
            "//evil.example/actions",
            "https://evil.example/actions",
            "/actions?\\evil",
        ] {
            let e = check_back(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("invalid back"), "{bad:?}: {e}");
        }
    }
}
