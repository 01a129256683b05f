//! Action detail (`/actions/{id}`): fields, lease, args (pretty, cut at 64 KB; the whole
//! document at `/actions/{id}/args.json`), the attempts read from the log, and the log.
//! Operators get retry (failed or canceled) and cancel (pending or running) buttons.
//!
//! Data: `Store::get` + `Store::logs_tail(id, LOG_TAIL)` (a snoozing action can log 10^5
//! entries; the page shows the latest ones, so the first attempts may be cut).

use super::layout::{self, Nav, Notice};
use super::MsgQuery;
use crate::action::{Action, ActionLog};
use crate::error::{Error, Result};
use crate::state::ActionStatus;
use crate::ui::router::{audit, AppState, Ctx};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup};

/// Args longer than this (pretty-printed) are cut on the page.
pub(crate) const ARGS_SHOWN: usize = 64 * 1024;

/// `GET /actions/{id}`.
pub(crate) async fn page(
    State(st): State<AppState>,
    ctx: Ctx,
    Path(id): Path<i64>,
    Query(q): Query<MsgQuery>,
) -> Response {
    let result = async {
        let (action, logs) = load(&st, id).await?;
        let title = format!("Action {id}");
        let body = body(&ctx, &action, &logs, q.notice());
        Ok(layout::page(&ctx, Nav::Actions, &title, body))
    }
    .await;
    ctx.respond(result)
}

/// `GET /actions/{id}/args.json`: the whole args document.
pub(crate) async fn args_json(
    State(st): State<AppState>,
    ctx: Ctx,
    Path(id): Path<i64>,
) -> Response {
    let result = async {
        let action = get(&st, id).await?;
        let text = serde_json::to_string_pretty(&action.args)
            .map_err(|e| Error::invalid("args", e.to_string()))?;
        Ok((
            [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
            text,
        )
            .into_response())
    }
    .await;
    ctx.respond(result)
}

/// `POST /actions/{id}/retry`: `Store::retry_many` with this one id (failed or canceled →
/// pending, attempts reset; the log names the operator).
pub(crate) async fn retry(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    let result = act(&st, &ctx, id, Op::Retry).await;
    ctx.respond(result)
}

/// `POST /actions/{id}/cancel`: `Store::cancel_many` with this one id (pending or running →
/// canceled; the log names the operator).
pub(crate) async fn cancel(State(st): State<AppState>, ctx: Ctx, Path(id): Path<i64>) -> Response {
    let result = act(&st, &ctx, id, Op::Cancel).await;
    ctx.respond(result)
}

#[derive(Clone, Copy)]
enum Op {
    Retry,
    Cancel,
}

async fn act(st: &AppState, ctx: &Ctx, id: i64, op: Op) -> Result<Response> {
    get(st, id).await?;
    let (name, changed, notice) = match op {
        Op::Retry => {
            let actor = format!("ui:{}", ctx.user);
            let done = !st
                .store
                .retry_many(&[id], &actor, ctx.now)
                .await?
                .changed
                .is_empty();
            let n = if done {
                Notice::Retried
            } else {
                Notice::NotRetried
            };
            ("retry", done, n)
        }
        Op::Cancel => {
            let actor = format!("ui:{}", ctx.user);
            let done = !st
                .store
                .cancel_many(&[id], &actor, ctx.now)
                .await?
                .changed
                .is_empty();
            let n = if done {
                Notice::Canceled
            } else {
                Notice::NotCanceled
            };
            ("cancel", done, n)
        }
    };
    audit(ctx, name, &id.to_string(), 1, u64::from(changed));
    ctx.done(&format!("/actions/{id}"), notice, || async {
        let (action, logs) = load(st, id).await?;
        Ok(body(ctx, &action, &logs, Some(notice)))
    })
    .await
}

/// How many of an action's latest log entries the page reads.
const LOG_TAIL: i64 = 1000;

async fn get(st: &AppState, id: i64) -> Result<Action> {
    st.store
        .get(id)
        .await?
        .ok_or(Error::NotFound { what: "action", id })
}

async fn load(st: &AppState, id: i64) -> Result<(Action, Vec<ActionLog>)> {
    let action = get(st, id).await?;
    let logs = st.store.logs_tail(id, LOG_TAIL).await?;
    Ok((action, logs))
}

/// The content of `<main>`.
fn body(ctx: &Ctx, a: &Action, logs: &[ActionLog], notice: Option<Notice>) -> Markup {
    html! {
        h1 { "Action " (a.id) " · " code { (a.hook) } " " (layout::status(a.status)) }
        (layout::notice(ctx, notice, None))
        (buttons(ctx, a))
        div.panel { (fields(ctx, a)) }
        h2 { "Lease" }
        div.panel { (lease(ctx, a)) }
        h2 { "Args" }
        (args(ctx, a))
        h2 { "Attempts" }
        (attempts_table(ctx, &attempts(logs)))
        h2 { "Log" }
        (log_table(ctx, logs))
    }
}

/// What drives this action: a job step, a batch chunk or finalize, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driver {
    /// `j:{job}:{step}`: a job's step action.
    Job(i64),
    /// `b:{parent}:{offset}` or `f:{parent}`: a batch parent's chunk or finalize action.
    Batch(i64),
}

/// Reads the unique key's prefix (see `jobs::StepAction`, `batch::chunk_action`,
/// `batch::finalize_action`).
pub(crate) fn driver(unique_key: Option<&str>) -> Option<Driver> {
    let key = unique_key?;
    let (kind, rest) = key.split_once(':')?;
    let id = rest.split(':').next()?.parse().ok()?;
    match kind {
        "j" if rest.contains(':') => Some(Driver::Job(id)),
        "b" if rest.contains(':') => Some(Driver::Batch(id)),
        "f" => Some(Driver::Batch(id)),
        _ => None,
    }
}

fn buttons(ctx: &Ctx, a: &Action) -> Markup {
    if !ctx.operator() {
        return html! {};
    }
    let id = a.id;
    // The store refuses the cancel of exactly these (`JOB_OWNED_HOOKS`).
    let drives_job = crate::store::operator::owning_job(&a.hook, &a.args).is_some();
    html! {
        div.actions {
            @if matches!(a.status, ActionStatus::Failed | ActionStatus::Canceled) {
                (layout::post_button(ctx, &format!("/actions/{id}/retry"), "Retry", "primary"))
            }
            @if matches!(a.status, ActionStatus::Pending | ActionStatus::Running) {
                @if drives_job {
                    span.hint {
                        "This action drives a job: canceling it would strand the job. Cancel the job instead."
                    }
                } @else {
                    (layout::post_button(ctx, &format!("/actions/{id}/cancel"), "Cancel", "danger"))
                }
            }
        }
    }
}

fn fields(ctx: &Ctx, a: &Action) -> Markup {
    html! {
        dl.fields {
            dt { "Hook" } dd { code { (a.hook) } }
            dt { "Group" } dd { (a.group.as_deref().unwrap_or("—")) }
            dt { "Priority" } dd { (a.priority) }
            dt { "Status" } dd { (layout::status(a.status)) }
            dt { "Scheduled" } dd { (layout::time_rel(ctx, a.scheduled_at)) }
            dt { "Attempts" } dd { (a.attempt) " of " (a.max_attempts) }
            dt { "Timeout" } dd {
                @match a.timeout_ms {
                    Some(ms) => (layout::duration(ms.max(0).unsigned_abs())),
                    None => "none",
                }
            }
            dt { "Created" } dd { (layout::time_rel(ctx, a.created_at)) }
            dt { "Finished" } dd { (layout::time_opt(ctx, a.finished_at)) }
            dt { "Unique key" } dd { (unique_key(ctx, a.unique_key.as_deref())) }
            dt { "Schedule" } dd {
                @match a.schedule_id {
                    Some(s) => a href=(ctx.href(&format!("/schedules#schedule-{s}"))) { "#" (s) },
                    None => "—",
                }
            }
            dt { "Last error" } dd.wrap { (a.last_error.as_deref().unwrap_or("—")) }
        }
    }
}

fn unique_key(ctx: &Ctx, key: Option<&str>) -> Markup {
    let Some(k) = key else {
        return html! { "—" };
    };
    html! {
        code { (k) }
        @match driver(Some(k)) {
            Some(Driver::Job(j)) => { " · " a href=(ctx.href(&format!("/jobs/{j}"))) { "job " (j) } },
            Some(Driver::Batch(b)) => { " · " a href=(ctx.href(&format!("/batches/{b}"))) { "batch " (b) } },
            None => {},
        }
    }
}

fn lease(ctx: &Ctx, a: &Action) -> Markup {
    html! {
        dl.fields {
            dt { "Owner" } dd { code { (a.lease_owner.as_deref().unwrap_or("—")) } }
            dt { "Lease until" } dd { (layout::time_opt(ctx, a.lease_until)) }
            dt { "Fencing token" } dd { (a.lease_token) }
        }
        p.hint {
            "Heartbeats move the lease expiry forward; no separate heartbeat time is stored. "
            "A running action whose lease has expired is put back by the reaper."
        }
    }
}

/// Pretty-printed args, cut at [`ARGS_SHOWN`] bytes on a character boundary.
pub(crate) fn pretty_args(args: &serde_json::Value) -> (String, bool) {
    let mut text = serde_json::to_string_pretty(args).unwrap_or_else(|_| args.to_string());
    if text.len() <= ARGS_SHOWN {
        return (text, false);
    }
    let mut end = ARGS_SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

fn args(ctx: &Ctx, a: &Action) -> Markup {
    let (text, cut) = pretty_args(&a.args);
    let full = ctx.href(&format!("/actions/{}/args.json", a.id));
    html! {
        @if cut {
            p.hint { "Cut at 64 KB. " a href=(full) { "The whole document" } "." }
        }
        pre.args { (text) }
        @if !cut { p.hint { a href=(full) { "args.json" } } }
    }
}

/// One run of the handler, read from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// 1 for the first `started`.
    pub(crate) n: usize,
    /// When it started.
    pub(crate) started_at: DateTime<Utc>,
    /// The runner that claimed it (the `started` detail).
    pub(crate) owner: Option<String>,
    /// When it ended; `None` while running (or when its end was never logged).
    pub(crate) ended_at: Option<DateTime<Utc>>,
    /// The event that ended it.
    pub(crate) outcome: Option<String>,
    /// The ending event's detail (error text, next run time).
    pub(crate) error: Option<String>,
}

/// Log events that end the attempt in progress. `lease_lost` is not one: it records a
/// previous holder's refused late finish, after its attempt was already closed (by
/// `lease_expired` or `canceled`), possibly while a newer attempt runs.
const CLOSING: [&str; 8] = [
    "retry",
    "failed",
    "completed",
    "lease_expired",
    "lease_expired_failed",
    "released",
    "snoozed",
    "canceled",
];

/// The attempts in a log (oldest first): `started` opens attempt n (detail = owner); a
/// closing event closes it with its detail as the error. Closing events with no attempt open
/// (canceling a pending action) open nothing.
pub(crate) fn attempts(logs: &[ActionLog]) -> Vec<Attempt> {
    let mut out: Vec<Attempt> = Vec::new();
    let mut open = false;
    for log in logs {
        if log.event == "started" {
            out.push(Attempt {
                n: out.len() + 1,
                started_at: log.at,
                owner: log.detail.clone(),
                ended_at: None,
                outcome: None,
                error: None,
            });
            open = true;
        } else if open && CLOSING.contains(&log.event.as_str()) {
            if let Some(last) = out.last_mut() {
                last.ended_at = Some(log.at);
                last.outcome = Some(log.event.clone());
                last.error = log.detail.clone();
            }
            open = false;
        }
    }
    out
}

fn attempts_table(ctx: &Ctx, attempts: &[Attempt]) -> Markup {
    if attempts.is_empty() {
        return html! { p.muted { "Not started yet." } };
    }
    html! {
        div.panel {
            table {
                thead { tr { th.num { "#" } th { "Started" } th { "Owner" } th { "Ended" } th.num { "Took" } th { "Outcome" } th { "Error / detail" } } }
                tbody {
                    @for at in attempts {
                        tr {
                            td.num { (at.n) }
                            td { (layout::time(ctx, at.started_at)) }
                            td { code { (at.owner.as_deref().unwrap_or("—")) } }
                            td { @if let Some(e) = at.ended_at { (layout::time(ctx, e)) } @else { span.muted { "—" } } }
                            td.num { @if let Some(e) = at.ended_at { (layout::duration((e - at.started_at).num_milliseconds().max(0).unsigned_abs())) } }
                            td { (at.outcome.as_deref().unwrap_or("running or unknown")) }
                            td.wrap { (at.error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

fn log_table(ctx: &Ctx, logs: &[ActionLog]) -> Markup {
    html! {
        div.panel {
            table.rows {
                thead { tr { th { "At" } th { "Event" } th { "Detail" } } }
                tbody {
                    @for l in logs {
                        tr {
                            td { (layout::time(ctx, l.at)) }
                            td { code { (l.event) } }
                            td.wrap { (l.detail.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn log(sec: i64, event: &str, detail: Option<&str>) -> ActionLog {
        ActionLog {
            action_id: 1,
            at: DateTime::<Utc>::from_timestamp(1_774_612_800 + sec, 0).unwrap_or_default(),
            event: event.into(),
            detail: detail.map(str::to_string),
        }
    }

    #[test]
    fn attempts_open_on_started_and_close_on_the_ending_event() {
        let logs = [
            log(0, "created", None),
            log(1, "started", Some("w1")),
            log(2, "retry", Some("boom (next run …)")),
            log(3, "started", Some("w2")),
            log(9, "lease_expired", None),
            log(10, "started", Some("w3")),
            // w2's late finish is refused while w3 runs: it must not close w3's attempt.
            log(
                11,
                "lease_lost",
                Some("token 2 tried to record `completed`"),
            ),
            log(12, "snoozed", Some("until …")),
            log(13, "started", Some("w1")),
            log(14, "completed", None),
        ];
        let a = attempts(&logs);
        let brief: Vec<_> = a
            .iter()
            .map(|x| {
                (
                    x.n,
                    x.owner.as_deref(),
                    x.outcome.as_deref(),
                    x.error.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            brief,
            vec![
                (1, Some("w1"), Some("retry"), Some("boom (next run …)")),
                (2, Some("w2"), Some("lease_expired"), None),
                (3, Some("w3"), Some("snoozed"), Some("until …")),
                (4, Some("w1"), Some("completed"), None),
            ]
        );
        assert_eq!(a[0].started_at, logs[1].at);
        assert_eq!(a[0].ended_at, Some(logs[2].at));
    }

    #[test]
    fn a_running_attempt_stays_open_and_a_pending_cancel_opens_nothing() {
        let running = attempts(&[log(0, "created", None), log(1, "started", Some("w"))]);
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].ended_at, None);
        let canceled = attempts(&[log(0, "created", None), log(1, "canceled", None)]);
        assert!(canceled.is_empty());
        let failed = attempts(&[
            log(0, "started", Some("w")),
            log(1, "failed", Some("fatal: bad input")),
            log(2, "requeued", Some("operator retry")),
            log(3, "started", Some("w")),
            log(4, "canceled", None),
        ]);
        assert_eq!(failed.len(), 2);
        assert_eq!(failed[0].error.as_deref(), Some("fatal: bad input"));
        assert_eq!(failed[1].outcome.as_deref(), Some("canceled"));
        assert!(attempts(&[]).is_empty());
    }

    #[test]
    fn drivers_come_from_the_unique_key() {
        assert_eq!(driver(Some("j:42:3")), Some(Driver::Job(42)));
        assert_eq!(driver(Some("b:7:200")), Some(Driver::Batch(7)));
        assert_eq!(driver(Some("f:7")), Some(Driver::Batch(7)));
        for other in ["k:j:1:2", "c:abc", "s:3:1000", "j:x:1", "j:5", "b:7"] {
            assert_eq!(driver(Some(other)), None, "{other}");
        }
        assert_eq!(driver(None), None);
    }

    #[test]
    fn long_args_are_cut_on_a_character_boundary() {
        let (short, cut) = pretty_args(&json!({"a": 1}));
        assert!(!cut);
        assert_eq!(short, "{\n  \"a\": 1\n}");
        let long = json!({ "s": "é".repeat(ARGS_SHOWN) });
        let (text, cut) = pretty_args(&long);
        assert!(cut);
        assert!(text.len() <= ARGS_SHOWN && text.len() > ARGS_SHOWN - 4);
    }
}
