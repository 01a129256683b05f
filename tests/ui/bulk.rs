//! Bulk changes from the action list: checked rows (`POST /actions/bulk`), and every action
//! matching a filter — a dry run that counts and fixes the highest id
//! (`/actions/bulk/preview`), then the change in chunks (`/actions/bulk/all`) — each checked
//! against the database, with its audit event.

use crate::seed::{all_actions, changed, many, statuses, Many};
use crate::support::{audit_capture, basic_auth, get, t0, Fixture, Session};
use axum::http::StatusCode;
use axum::Router;
use dockhand::action::Action;
use dockhand::ui::{Access, UiConfig};
use dockhand::ActionSpec;
use serde_json::json;
use std::time::Duration;

/// The user of the audit test (the audit capture is process-wide; see `audit_capture`).
const USER: &str = "audit-bulk-9c1e";

fn config(f: &Fixture, chunk: i64) -> UiConfig {
    UiConfig {
        bulk_chunk: chunk,
        bulk_pause: Duration::ZERO,
        ..f.config(Access::Operator)
    }
}

fn app(f: &Fixture, chunk: i64) -> Router {
    f.app(config(f, chunk))
}

/// `id=…&id=…`.
fn ids_field(ids: &[i64]) -> String {
    ids.iter()
        .map(|id| format!("id={id}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The first `k` seeded actions in `status` with `hook`, by id.
fn pick(all: &[Action], m: &Many, hook: &str, status: &str, k: usize) -> Vec<i64> {
    let picked: Vec<i64> = all
        .iter()
        .filter(|a| m.ids.contains(&a.id) && a.hook == hook && a.status.as_str() == status)
        .map(|a| a.id)
        .take(k)
        .collect();
    assert_eq!(picked.len(), k, "{k} {status} {hook}");
    picked
}

fn sorted(mut v: Vec<i64>) -> Vec<i64> {
    v.sort_unstable();
    v
}

#[tokio::test]
async fn checked_rows_change_exactly_those_rows() {
    let f = Fixture::new().await;
    let m = many(&f).await;
    let app = app(&f, 500);
    let s = Session::open(&app, "/actions", &[]).await;
    let all = all_actions(&f).await;
    let pending = pick(&all, &m, "email.send", "pending", 2);
    let running = pick(&all, &m, "sms.send", "running", 2);
    let complete = pick(&all, &m, "sms.send", "complete", 2);
    let failed = pick(&all, &m, "sms.send", "failed", 2);
    let future = pick(&all, &m, "report.build", "pending", 40)
        .into_iter()
        .filter(|id| all.iter().any(|a| a.id == *id && a.scheduled_at > t0()))
        .take(2)
        .collect::<Vec<_>>();

    // Cancel: pending and running change; complete and failed are skipped.
    let before = statuses(&f).await;
    let targets = [&pending[..], &running[..1], &complete[..1], &failed[..1]].concat();
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!(
                "{}&op=cancel&back=%2Factions%3Fstatus%3Dpending",
                ids_field(&targets)
            ),
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(
        a.header("location"),
        "/actions?status=pending&changed=3&skipped=2&msg=bulk"
    );
    let after = statuses(&f).await;
    assert_eq!(
        changed(&before, &after),
        sorted([&pending[..], &running[..1]].concat())
    );
    assert!(pending.iter().all(|id| after[id] == "canceled"));
    assert_eq!(after[&running[0]], "canceled");
    let page = get(&app, a.header("location"), &[]).await.text();
    assert!(page.contains("Changed 3, skipped 2."), "{page}");
    assert!(page.contains("Bulk change done."), "{page}");

    // Retry: canceled and failed go back to pending; a pending one is skipped.
    let before = after;
    let targets = [&pending[..], &failed[..1], &running[1..]].concat();
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!("{}&op=retry", ids_field(&targets)),
            &[],
        )
        .await;
    assert_eq!(
        a.header("location"),
        "/actions?changed=3&skipped=1&msg=bulk"
    );
    let after = statuses(&f).await;
    assert_eq!(
        changed(&before, &after),
        sorted([&pending[..], &failed[..1]].concat())
    );
    assert!(pending.iter().all(|id| after[id] == "pending"));
    assert_eq!(after[&running[1]], "running");

    // Run now: pending actions due later become due now; a due one is skipped.
    let targets = [&future[..], &pending[..1]].concat();
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!("{}&op=run_now", ids_field(&targets)),
            &[],
        )
        .await;
    assert_eq!(
        a.header("location"),
        "/actions?changed=2&skipped=1&msg=bulk"
    );
    for id in &future {
        let a = f.store.get(*id).await.expect("get").expect("exists");
        assert_eq!((a.status.as_str(), a.scheduled_at), ("pending", t0()));
    }

    // Delete: finished ones go; a running one is skipped.
    let targets = [&complete[..], &failed[1..], &running[1..]].concat();
    let before = statuses(&f).await;
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!("{}&op=delete", ids_field(&targets)),
            &[],
        )
        .await;
    assert_eq!(
        a.header("location"),
        "/actions?changed=3&skipped=1&msg=bulk"
    );
    let after = statuses(&f).await;
    assert_eq!(
        changed(&before, &after),
        sorted([&complete[..], &failed[1..]].concat())
    );
    for id in [&complete[..], &failed[1..]].concat() {
        assert!(f.store.get(id).await.expect("get").is_none(), "{id} gone");
    }
    assert_eq!(after[&running[1]], "running");
}

#[tokio::test]
async fn an_htmx_bulk_post_gets_the_list_it_came_from() {
    let f = Fixture::new().await;
    let m = many(&f).await;
    let app = app(&f, 500);
    let s = Session::open(&app, "/actions", &[]).await;
    let all = all_actions(&f).await;
    let id = pick(&all, &m, "report.build", "pending", 1)[0];
    let a = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!("id={id}&op=cancel&back=%2Factions%3Fhook%3Dreport.build"),
            &[("hx-request", "true")],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let html = a.text();
    assert!(html.starts_with("<h1>Actions</h1>"), "{html}");
    assert!(!html.contains("<html"));
    assert!(html.contains("Changed 1, skipped 0."), "{html}");
    assert_eq!(f.status(id).await, "canceled");
    // The fragment is the filtered list the rows were checked on.
    assert!(
        html.contains(r#"name="hook" value="report.build""#),
        "{html}"
    );
    assert!(!html.contains("<code>sms.send</code>"), "{html}");
    assert!(html.contains("<code>report.build</code>"), "{html}");
}

#[tokio::test]
async fn bad_bulk_posts_are_400s_and_change_nothing() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let app = app(&f, 500);
    let s = Session::open(&app, "/actions", &[]).await;
    let before = statuses(&f).await;
    let too_many: Vec<i64> = before.keys().copied().cycle().take(501).collect();
    for (fields, field) in [
        (format!("{}&op=cancel", ids_field(&too_many)), "id"),
        ("op=cancel".to_string(), "id"),
        (
            format!("id={}&op=explode", before.keys().next().expect("id")),
            "op",
        ),
        (format!("id={}", before.keys().next().expect("id")), "op"),
        ("id=abc&op=cancel".to_string(), "id"),
    ] {
        let a = s.post_fields(&app, "/actions/bulk", &fields, &[]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{field}: {}", a.text());
        assert!(
            a.text().contains(&format!("invalid {field}")),
            "{}",
            a.text()
        );
    }
    let a = s
        .post_fields(&app, "/actions/bulk/all", "op=cancel&status=pending", &[])
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().contains("invalid max_id"), "{}", a.text());
    assert!(changed(&before, &statuses(&f).await).is_empty());
}

/// The `max_id` of a preview's confirm form.
fn max_id(html: &str) -> i64 {
    let needle = r#"name="max_id" value=""#;
    let at = html.find(needle).unwrap_or_else(|| panic!("{html}")) + needle.len();
    let end = html[at..].find('"').expect("end");
    html[at..at + end].parse().expect("max_id")
}

#[tokio::test(flavor = "current_thread")]
async fn preview_counts_then_all_changes_exactly_the_matching_rows() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    // Chunks of 3: 40 rows take 14 of them.
    let (creds, auth) = basic_auth(USER);
    let app = f.app(UiConfig {
        basic_auth: Some(creds),
        ..config(&f, 3)
    });
    let hdr = [("authorization", auth.as_str())];
    let s = Session::open(&app, "/actions", &hdr).await;
    let all = all_actions(&f).await;
    let matching = sorted(
        all.iter()
            .filter(|a| a.hook == "report.build" && a.status.as_str() == "pending")
            .map(|a| a.id)
            .collect(),
    );
    assert_eq!(matching.len(), 40);
    let before_preview = statuses(&f).await;
    let out = audit_capture();
    let filter = "status=pending&hook=report.build";
    let a = s
        .post_fields(
            &app,
            "/actions/bulk/preview",
            &format!("{filter}&op=cancel"),
            &hdr,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let html = a.text();
    assert!(
        html.contains("<strong>40</strong> actions match the filter now."),
        "{html}"
    );
    let max = max_id(&html);
    assert!(max >= *matching.last().expect("rows"), "{max}");
    assert!(
        html.contains(r#"name="hook" value="report.build""#),
        "{html}"
    );
    assert!(html.contains(r#"name="op" value="cancel""#), "{html}");
    assert!(
        changed(&before_preview, &statuses(&f).await).is_empty(),
        "a dry run"
    );

    // Enqueued after the dry run: matches the filter but is left alone.
    let late = f
        .store
        .enqueue(
            &ActionSpec::new("report.build", json!({}))
                .prepare(t0())
                .expect("prepare"),
            t0(),
        )
        .await
        .expect("enqueue")
        .id;
    assert!(late > max);
    let statuses_before = statuses(&f).await;
    let a = s
        .post_fields(
            &app,
            "/actions/bulk/all",
            &format!("{filter}&op=cancel&max_id={max}"),
            &hdr,
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(
        a.header("location"),
        format!("/actions?{filter}&changed=40&skipped=0&msg=bulk")
    );
    let after = statuses(&f).await;
    assert_eq!(changed(&statuses_before, &after)[..], matching[..40]);
    assert_eq!(after[&late], "pending");

    let lines = out.lines_of(USER);
    assert_eq!(lines.len(), 2, "one audit event per POST: {lines:#?}");
    for l in &lines {
        assert!(l.contains("op=\"cancel\""), "{l}");
    }
    assert!(
        lines[0].contains("dry_run=true") && lines[0].contains("count=40"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("changed=0"), "{}", lines[0]);
    assert!(
        lines[1].contains("dry_run=false")
            && lines[1].contains("count=40")
            && lines[1].contains("changed=40")
            && lines[1].contains("skipped=0"),
        "{}",
        lines[1]
    );
}

#[tokio::test]
async fn all_skips_rows_the_change_does_not_apply_to() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let app = app(&f, 4);
    let s = Session::open(&app, "/actions", &[]).await;
    let all = all_actions(&f).await;
    let future: Vec<i64> = sorted(
        all.iter()
            .filter(|a| a.hook == "report.build" && a.scheduled_at > t0())
            .map(|a| a.id)
            .collect(),
    );
    assert_eq!(future.len(), 20);
    let filter = "status=pending&hook=report.build";
    let a = s
        .post_fields(
            &app,
            "/actions/bulk/preview",
            &format!("{filter}&op=run_now"),
            &[],
        )
        .await;
    let max = max_id(&a.text());
    let a = s
        .post_fields(
            &app,
            "/actions/bulk/all",
            &format!("{filter}&op=run_now&max_id={max}"),
            &[],
        )
        .await;
    assert_eq!(
        a.header("location"),
        format!("/actions?{filter}&changed=20&skipped=20&msg=bulk")
    );
    for a in all_actions(&f).await {
        if future.contains(&a.id) {
            assert_eq!(a.scheduled_at, t0(), "{}", a.id);
        }
    }
}

#[tokio::test]
async fn preview_with_a_time_range_fixes_a_max_id_covering_every_match() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let app = app(&f, 500);
    let s = Session::open(&app, "/actions", &[]).await;
    let all = all_actions(&f).await;
    // The failed tab's range is on the finish time (every seeded failure ends at t0 + 1 s),
    // and the failed ones were created before their finish time.
    let failed: Vec<i64> = sorted(
        all.iter()
            .filter(|a| a.status.as_str() == "failed")
            .map(|a| a.id)
            .collect(),
    );
    assert_eq!(failed.len(), 11);
    assert!(all
        .iter()
        .all(|a| a.created_at < t0() + chrono::Duration::seconds(1)));
    let filter = "status=failed&from=2026-03-27T12%3A00%3A01Z&to=2026-03-27T12%3A00%3A02Z";
    let a = s
        .post_fields(
            &app,
            "/actions/bulk/preview",
            &format!("{filter}&op=retry"),
            &[],
        )
        .await;
    let html = a.text();
    let main = &html[html.find("<main").unwrap_or(0)..];
    assert!(main.contains("<strong>11</strong> actions match"), "{main}");
    let max = max_id(&html);
    let before = statuses(&f).await;
    let a = s
        .post_fields(
            &app,
            "/actions/bulk/all",
            &format!("{filter}&op=retry&max_id={max}"),
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert!(
        a.header("location").contains("changed=11&skipped=0"),
        "{}",
        a.header("location")
    );
    assert_eq!(changed(&before, &statuses(&f).await), failed);
}
