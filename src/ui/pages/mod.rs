//! One module per page. Each exposes its axum handlers (`page` for the GET, one function per
//! POST), loads what it shows through the [`crate::store::Store`] methods, and renders with
//! many small `fn … -> Markup` so the compiler type-checks small bodies.
//!
//! The pattern a new page follows (see `schedules`):
//! - `pub(crate) async fn page(State(st): State<AppState>, ctx: Ctx, Query(q): Query<…>) ->
//!   Response { ctx.respond(render(&st, &ctx, q).await) }`;
//! - `render` loads, then returns `layout::page(ctx, Nav::…, title, body(…))`;
//! - a POST handler writes, calls `router::audit`, and answers with `ctx.done(to, notice,
//!   || async { fragment })`.

pub(crate) mod action;
pub(crate) mod actions;
pub(crate) mod batches;
pub(crate) mod bulk;
pub(crate) mod chart;
pub(crate) mod claims;
pub(crate) mod group_limits;
pub(crate) mod groups;
pub(crate) mod jobs;
pub(crate) mod layout;
pub(crate) mod overview;
pub(crate) mod schedules;

use serde::Deserialize;

/// The query string a page reads after a POST's 303: which notice to show, and the record it
/// is about.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MsgQuery {
    /// A [`layout::Notice`] code; unknown codes show nothing.
    pub(crate) msg: Option<String>,
    /// The action the notice is about (run now links to it).
    pub(crate) id: Option<i64>,
    /// Rows a bulk change changed (numbers only, so nothing else is reflected).
    pub(crate) changed: Option<u64>,
    /// Rows a bulk change skipped.
    pub(crate) skipped: Option<u64>,
}

impl MsgQuery {
    /// The notice to show, if the code is known.
    pub(crate) fn notice(&self) -> Option<layout::Notice> {
        self.msg.as_deref().and_then(layout::Notice::parse)
    }

    /// A bulk change's counts, when the query carries both.
    pub(crate) fn counts(&self) -> Option<(u64, u64)> {
        self.changed.zip(self.skipped)
    }
}
