//! Jobs (`/jobs`, `/jobs/{id}`): a keyset-paged list filtered by status and pipeline, and a
//! job's page — its steps as a stepper, status and reason, the actions that drive it, the
//! item claims it holds, its batch (when it fanned out) — with operator buttons to fail or
//! cancel it through the terminal bridge (`Jobs::manual_fail`, `Jobs::cancel`; cancelling a
//! batch parent cancels its remaining children, B5).
//!
//! Data: `Store::search_jobs`, `Store::get_job`, `Store::job_actions`, `Store::list_claims`.

use super::layout::{self, Nav, Notice};
use super::MsgQuery;
use crate::claims::ClaimFilter;
use crate::error::{Error, Result};
use crate::jobs::Job;
use crate::search::{ActionSummary, JobSearch};
use crate::state::JobStatus;
use crate::ui::router::{audit, AppState, Ctx};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;

/// The query string of `/jobs` (and of `/batches`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct JobParams {
    #[serde(default)]
    pub(crate) status: String,
    #[serde(default)]
    pub(crate) pipeline: String,
    /// Only children of this batch parent.
    #[serde(default)]
    pub(crate) parent: String,
    #[serde(default)]
    pub(crate) after: String,
    #[serde(default)]
    pub(crate) before: String,
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

impl JobParams {
    /// The search; errors name the field.
    pub(crate) fn search(&self, limit: i64) -> Result<JobSearch> {
        let status = match self.status.trim() {
            "" => None,
            s => Some(s.parse::<JobStatus>()?),
        };
        let s = JobSearch {
            status,
            pipeline: Some(self.pipeline.trim())
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
            parent_id: id_field("parent", &self.parent)?,
            after: id_field("after", &self.after)?,
            before: id_field("before", &self.before)?,
            limit,
            ..JobSearch::default()
        };
        s.validate()?;
        Ok(s)
    }

    /// `path?…` with these filters and an optional cursor.
    pub(crate) fn href(&self, path: &str, cursor: Option<(&str, i64)>) -> String {
        let mut pairs: Vec<String> = [
            ("status", &self.status),
            ("pipeline", &self.pipeline),
            ("parent", &self.parent),
        ]
        .into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| format!("{k}={}", layout::query_value(v.trim())))
        .collect();
        if let Some((k, id)) = cursor {
            pairs.push(format!("{k}={id}"));
        }
        if pairs.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", pairs.join("&"))
        }
    }
}

/// `GET /jobs`.
pub(crate) async fn list(
    State(st): State<AppState>,
    ctx: Ctx,
    Query(p): Query<JobParams>,
) -> Response {
    let result = async {
        let page = st.store.search_jobs(&p.search(st.cfg.page_size)?).await?;
        let body = html! {
            h1 { "Jobs" }
            (filters(&ctx, &p, "/jobs"))
            (job_table(&ctx, &page.rows))
            (pager(&ctx, &p, "/jobs", &page))
        };
        Ok(layout::page(&ctx, Nav::Jobs, "Jobs", body))
    }
    .await;
    ctx.respond(result)
}

/// The status and pipeline filter of a job list.
pub(crate) fn filters(ctx: &Ctx, p: &JobParams, path: &str) -> Markup {
    html! {
        form.filters method="get" action=(ctx.href(path)) role="search" {
            label { "Status "
                select name="status" {
                    option value="" selected[p.status.is_empty()] { "any" }
                    @for s in JobStatus::ALL { option value=(s.as_str()) selected[p.status == s.as_str()] { (s.as_str()) } }
                }
            }
            label { "Pipeline " input type="search" name="pipeline" value=(p.pipeline); }
            @if !p.parent.is_empty() { input type="hidden" name="parent" value=(p.parent); }
            button type="submit" { "Filter" }
        }
    }
}

/// Previous/next links of a job list.
pub(crate) fn pager<T>(
    ctx: &Ctx,
    p: &JobParams,
    path: &str,
    page: &crate::search::IdPage<T>,
) -> Markup {
    let first = JobParams {
        after: String::new(),
        before: String::new(),
        ..p.clone()
    };
    html! {
        nav.pager aria-label="Pages" {
            a href=(ctx.href(&first.href(path, None))) { "First" }
            @if let Some(prev) = page.prev { a rel="prev" href=(ctx.href(&first.href(path, Some(("before", prev))))) { "← Previous" } }
            @if let Some(next) = page.next { a rel="next" href=(ctx.href(&first.href(path, Some(("after", next))))) { "Next →" } }
        }
    }
}

/// A job status badge.
pub(crate) fn job_status(s: JobStatus) -> Markup {
    let class = match s {
        JobStatus::Completed | JobStatus::CompletedNoItems => "s-complete",
        JobStatus::Failed => "s-failed",
        JobStatus::Cancelled | JobStatus::Skipped => "s-canceled",
        JobStatus::Processing => "s-running",
        _ => "s-pending",
    };
    html! { span class={ "badge " (class) } { (s.as_str()) } }
}

/// A table of jobs.
pub(crate) fn job_table(ctx: &Ctx, jobs: &[Job]) -> Markup {
    html! {
        table.rows {
            thead { tr { th { "id" } th { "pipeline" } th { "status" } th { "reason" } th.num { "step" } th { "parent" } th { "updated" } } }
            tbody {
                @for j in jobs {
                    tr {
                        td { a href=(ctx.href(&format!("/jobs/{}", j.id))) { (j.id) } }
                        td { code { (j.pipeline) } }
                        td { (job_status(j.status)) }
                        td { span.clip { (j.reason.as_deref().unwrap_or("")) } }
                        td.num { (j.step_index) }
                        td { @if let Some(p) = j.parent_id { a href=(ctx.href(&format!("/batches/{p}"))) { (p) } } }
                        td { (layout::time_rel(ctx, j.updated_at)) }
                    }
                }
                @if jobs.is_empty() { tr { td colspan="7" .muted { "No jobs match." } } }
            }
        }
    }
}

/// `GET /jobs/{id}`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Path(id): Path<i64>,
    Query(q): Query<MsgQuery>,
) -> Response {
    let result = async {
        let body = detail(&st, &ctx, id, q.notice()).await?;
        Ok(layout::page(&ctx, Nav::Jobs, &format!("Job {id}"), body))
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
    let actions = st.store.job_actions(id, 100).await?;
    let claims = st
        .store
        .list_claims(&ClaimFilter {
            job_id: Some(id),
            limit: 200,
            ..ClaimFilter::default()
        })
        .await?;
    let batch = st.store.batch_state(id).await?;
    let rerun_of = st
        .store
        .engine_data(id)
        .await?
        .and_then(|(data, _)| crate::batch::rerun::rerun_of(&data));
    let steps = st.jobs().pipeline_steps(&job.pipeline);
    Ok(html! {
        h1 { "Job " (id) " " (job_status(job.status)) }
        (layout::notice(ctx, notice, None))
        dl.fields {
            dt { "pipeline" } dd { code { (job.pipeline) } }
            dt { "reason" } dd { (job.reason.as_deref().unwrap_or("—")) }
            dt { "created" } dd { (layout::time_rel(ctx, job.created_at)) }
            dt { "updated" } dd { (layout::time_rel(ctx, job.updated_at)) }
            dt { "finished" } dd { (layout::time_opt(ctx, job.finished_at)) }
            dt { "engine data version" } dd { (job.engine_version) }
            @if let Some(p) = job.parent_id { dt { "batch" } dd { a href=(ctx.href(&format!("/batches/{p}"))) { "parent job " (p) } } }
            @if let Some(p) = rerun_of { dt { "re-run of" } dd { a href=(ctx.href(&format!("/batches/{p}"))) { "failed children of batch " (p) } } }
            @if batch.is_some() { dt { "fan-out" } dd { a href=(ctx.href(&format!("/batches/{id}"))) { "batch progress" } } }
        }
        h2 { "Steps" }
        (stepper(&job, steps.as_deref()))
        @if !job.status.is_final() && ctx.operator() {
            div.actions {
                (layout::post_button(ctx, &format!("/jobs/{id}/fail"), "Fail job", "danger"))
                (layout::post_button(ctx, &format!("/jobs/{id}/cancel"), if batch.is_some() { "Cancel job and its remaining children" } else { "Cancel job" }, "danger"))
            }
        }
        h2 { "Actions" }
        (action_table(ctx, &actions))
        h2 { "Item claims (" (claims.len()) ")" }
        table.rows {
            thead { tr { th { "scope" } th { "item" } th { "status" } th { "expires" } } }
            tbody {
                @for c in &claims {
                    tr { td { (c.identity.scope) } td { code.clip { (c.identity.item_id) } } td { (c.status.as_str()) } td { (layout::time_opt(ctx, c.expires_at)) } }
                }
                @if claims.is_empty() { tr { td colspan="4" .muted { "None held." } } }
            }
        }
    })
}

/// Steps 0..=step_index as an ordered list; the current one marked, names when known.
fn stepper(job: &Job, names: Option<&[String]>) -> Markup {
    let total = names
        .map_or(job.step_index as usize + 1, <[String]>::len)
        .max(job.step_index as usize + 1);
    html! {
        ol.stepper {
            @for i in 0..total {
                @let state = if (i as i32) < job.step_index { "done" } else if i as i32 == job.step_index { if job.status.is_final() { "last" } else { "current" } } else { "todo" };
                li class=(state) {
                    span.n { (i) } " "
                    (names.and_then(|n| n.get(i)).map_or_else(|| format!("step {i}"), Clone::clone))
                }
            }
        }
    }
}

fn action_table(ctx: &Ctx, actions: &[ActionSummary]) -> Markup {
    html! {
        table.rows {
            thead { tr { th { "id" } th { "key" } th { "status" } th { "attempts" } th { "scheduled" } th { "error" } } }
            tbody {
                @for a in actions {
                    tr {
                        td { a href=(ctx.href(&format!("/actions/{}", a.id))) { (a.id) } }
                        td { code { (a.unique_key.as_deref().unwrap_or("")) } }
                        td { (layout::status(a.status)) }
                        td.num { (a.attempt) "/" (a.max_attempts) }
                        td { (layout::time_rel(ctx, a.scheduled_at)) }
                        td { span.clip.err { (a.error_head.as_deref().unwrap_or("")) } }
                    }
                }
                @if actions.is_empty() { tr { td colspan="6" .muted { "None." } } }
            }
        }
    }
}

/// `POST /jobs/{id}/fail`: `Jobs::manual_fail` (reason `manual_fail`).
pub(crate) async fn fail(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    finish(st, ctx, id, false).await
}

/// `POST /jobs/{id}/cancel`: `Jobs::cancel` (a batch parent cancels its remaining children).
pub(crate) async fn cancel(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    finish(st, ctx, id, true).await
}

async fn finish(st: AppState, ctx: Ctx, id: i64, cancel: bool) -> Response {
    let result = async {
        st.store
            .get_job(id)
            .await?
            .ok_or(Error::NotFound { what: "job", id })?;
        let jobs = st.jobs();
        let why = format!("operator ui:{}", ctx.user);
        let done = if cancel {
            jobs.cancel(id).await?
        } else {
            jobs.manual_fail(id, Some(&why)).await?
        };
        audit(
            &ctx,
            if cancel { "job_cancel" } else { "job_fail" },
            &id.to_string(),
            1,
            u64::from(done.changed),
        );
        let notice = match (done.changed, cancel) {
            (false, _) => Notice::JobAlreadyFinal,
            (true, true) => Notice::JobCanceled,
            (true, false) => Notice::JobFailed,
        };
        let to = format!("/jobs/{id}");
        ctx.done(&to, notice, || async {
            detail(&st, &ctx, id, Some(notice)).await
        })
        .await
    }
    .await;
    ctx.respond(result)
}
