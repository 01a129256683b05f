//! Batches (`/batches`, `/batches/{id}`): the jobs that fanned out, with their progress from
//! the parent's counters (written in each child's terminal transaction, so they are never a
//! stale cache), and a batch's page with its counters, worklist state, failed children, and an
//! operator buttons to cancel the remaining children (B5) and, once the batch is final, to
//! re-run its failed children as a new batch (`Jobs::rerun_failed`).
//!
//! Data: `Store::search_jobs` (batch parents; children by parent), `Store::batch_state`.
//! A failed child is final and counted in its parent, so "retry failed" is a re-run: a new
//! batch parent whose children run the failed items again (`crate::batch::rerun`).

use super::jobs::{filters, job_status, job_table, pager, JobParams};
use super::layout::{self, Nav, Notice};
use super::MsgQuery;
use crate::batch::BatchState;
use crate::error::{Error, Result};
use crate::search::JobSearch;
use crate::state::JobStatus;
use crate::ui::router::{audit, AppState, Ctx};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};

/// `GET /batches`.
pub(crate) async fn list(
    State(st): State<AppState>,
    ctx: Ctx,
    Query(p): Query<JobParams>,
) -> Response {
    let result = async {
        let search = JobSearch { batches_only: true, ..p.search(st.cfg.page_size)? };
        let page = st.store.search_jobs(&search).await?;
        let mut rows = Vec::with_capacity(page.rows.len());
        for j in &page.rows {
            rows.push((j, st.store.batch_state(j.id).await?));
        }
        let body = html! {
            h1 { "Batches" }
            (filters(&ctx, &p, "/batches"))
            table.rows {
                thead { tr { th { "parent" } th { "pipeline" } th { "status" } th { "progress" } th.num { "items" } th.num { "failed" } th { "updated" } } }
                tbody {
                    @for (j, b) in &rows {
                        tr {
                            td { a href=(ctx.href(&format!("/batches/{}", j.id))) { (j.id) } }
                            td { code { (j.pipeline) } }
                            td { (job_status(j.status)) }
                            td { @if let Some(b) = b { (progress(b)) } }
                            td.num { @if let Some(b) = b { (layout::count(b.items_total)) } }
                            td.num { @if let Some(b) = b { (layout::count(b.children_failed)) } }
                            td { (layout::time_rel(&ctx, j.updated_at)) }
                        }
                    }
                    @if rows.is_empty() { tr { td colspan="7" .muted { "No batches match." } } }
                }
            }
            (pager(&ctx, &p, "/batches", &page))
        };
        Ok(layout::page(&ctx, Nav::Batches, "Batches", body))
    }
    .await;
    ctx.respond(result)
}

/// A `<progress>` of terminal children over items (no inline style: CSP).
fn progress(b: &BatchState) -> Markup {
    let total = b.items_total.max(b.children_total).max(1);
    html! {
        progress max=(total) value=(b.children_terminal) { (b.children_terminal) "/" (total) }
        " " span.muted { (layout::count(b.children_terminal)) " / " (layout::count(b.items_total)) }
    }
}

/// `GET /batches/{id}`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Path(id): Path<i64>,
    Query(q): Query<MsgQuery>,
) -> Response {
    let result = async {
        let body = detail(&st, &ctx, id, q.notice()).await?;
        Ok(layout::page(
            &ctx,
            Nav::Batches,
            &format!("Batch {id}"),
            body,
        ))
    }
    .await;
    ctx.respond(result)
}

async fn detail(st: &AppState, ctx: &Ctx, id: i64, notice: Option<Notice>) -> Result<Markup> {
    let job = st
        .store
        .get_job(id)
        .await?
        .ok_or(Error::NotFound { what: "job", id })?;
    let b = st
        .store
        .batch_state(id)
        .await?
        .ok_or_else(|| Error::invalid("batch", format!("job {id} did not fan out")))?;
    let failed = st
        .store
        .search_jobs(&JobSearch {
            parent_id: Some(id),
            status: Some(JobStatus::Failed),
            limit: 50,
            ..JobSearch::default()
        })
        .await?;
    let rerunnable = st.jobs().pipeline_steps(&job.pipeline).is_some();
    let rerun_by = st
        .store
        .engine_data(id)
        .await?
        .and_then(|(data, _)| crate::batch::rerun::rerun_by(&data));
    Ok(html! {
        h1 { "Batch " (id) " " (job_status(job.status)) }
        (layout::notice(ctx, notice, None))
        p { (progress(&b)) }
        dl.fields {
            dt { "pipeline" } dd { a href=(ctx.href(&format!("/jobs/{id}"))) { code { (job.pipeline) } } }
            dt { "items" } dd { (layout::count(b.items_total)) " in chunks of " (b.chunk_size) " (child step " (b.child_step) ")" }
            dt { "children" } dd { (layout::count(b.children_total)) " created, " (layout::count(b.children_terminal)) " finished" }
            dt { "completed" } dd { (layout::count(b.children_completed)) }
            dt { "failed" } dd { (layout::count(b.children_failed)) }
            dt { "skipped" } dd { (layout::count(b.children_skipped)) }
            dt { "worklist" } dd { (b.ready) " ready, " (b.leased) " leased, " (b.completed_rows) " done, " (b.discarded_rows) " discarded" }
            dt { "fenced" } dd { (if b.fenced { "yes: every child is created" } else { "no: chunks still scheduling" }) }
            dt { "outcome" } dd { (b.outcome.as_deref().unwrap_or("—")) }
            @if let Some(r) = rerun_by { dt { "re-run by" } dd { a href=(ctx.href(&format!("/jobs/{r}"))) { "job " (r) } } }
        }
        @if !job.status.is_final() && ctx.operator() {
            div.actions { (layout::post_button(ctx, &format!("/batches/{id}/cancel"), "Cancel remaining children", "danger")) }
        }
        h2 { "Failed children" }
        @if b.children_failed > 0 {
            p.hint { "A failed child is final and counted in this batch. \"Re-run failed children\" (once, when the batch is final) starts a new batch that claims their items again and runs them from the child step; an item another job holds, or processed since, is left out." }
            @if let Some(r) = rerun_by {
                p.hint { "Re-run already by " a href=(ctx.href(&format!("/jobs/{r}"))) { "job " (r) } ": what fails there is re-run from its own batch page." }
            } @else if job.status.is_final() && ctx.operator() {
                @if rerunnable {
                    div.actions { (layout::post_button(ctx, &format!("/batches/{id}/rerun"), "Re-run failed children", "primary")) }
                } @else {
                    p.hint { "Pipeline `" (job.pipeline) "` is not registered in this dashboard: re-run from the program that runs it (the dashboard it mounts, or Jobs::rerun_failed)." }
                }
            }
        }
        (job_table(ctx, &failed.rows))
        @if failed.next.is_some() {
            p { a href=(ctx.href(&format!("/jobs?status=failed&parent={id}"))) { "More…" } }
        }
    })
}

/// `POST /batches/{id}/cancel`: `Jobs::cancel` on the parent (B5).
pub(crate) async fn cancel(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    let result = async {
        st.store
            .get_job(id)
            .await?
            .ok_or(Error::NotFound { what: "job", id })?;
        let done = st.jobs().cancel(id).await?;
        audit(
            &ctx,
            "batch_cancel",
            &id.to_string(),
            1,
            u64::from(done.changed),
        );
        let notice = if done.changed {
            Notice::BatchCanceled
        } else {
            Notice::JobAlreadyFinal
        };
        ctx.done(&format!("/batches/{id}"), notice, || async {
            detail(&st, &ctx, id, Some(notice)).await
        })
        .await
    }
    .await;
    ctx.respond(result)
}

/// `POST /batches/{id}/rerun`: `Jobs::rerun_failed` on a final batch; answers with the new
/// job's page (303, or `HX-Redirect` for htmx).
pub(crate) async fn rerun(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    let result = async {
        let rerun = st.jobs().rerun_failed(id).await?;
        audit(&ctx, "batch_rerun_failed", &id.to_string(), 1, 1);
        let to = format!(
            "{}?msg={}",
            ctx.href(&format!("/jobs/{rerun}")),
            Notice::RerunStarted.code()
        );
        Ok(if ctx.hx {
            ([("HX-Redirect", to)], "").into_response()
        } else {
            Redirect::to(&to).into_response()
        })
    }
    .await;
    ctx.respond(result)
}
