//! Item claims (scope summary, filters, pages), groups (counts against the database), and
//! read-only callers against every POST of the list, bulk, job and batch pages.

use crate::seed::{all_actions, batch, claim, job, many, statuses};
use crate::support::{get, link, t0, Fixture, Session};
use axum::http::StatusCode;
use chrono::Duration;
use dockhand::claims::CompleteOutcome;
use dockhand::ui::{Access, UiConfig};
use dockhand::JobStatus;

/// The item ids of a claim table, in order.
fn items(html: &str) -> Vec<String> {
    let needle = r#"<code class="clip">"#;
    html.match_indices(needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('<').map(|end| rest[..end].to_string())
        })
        .collect()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn claims_summarise_scopes_and_filter_by_status_job_and_staleness() {
    let f = Fixture::new().await;
    let (j1, j2) = (job(&f, "ingest").await, job(&f, "ingest").await);
    // j1: a1..a4 in feed-a for 10 minutes (a4 then processed); j2: a5, a6 in feed-a and b1
    // in feed-b for 10 seconds.
    for n in 1..=4 {
        claim(&f, "feed-a", &format!("a{n}"), j1, Duration::minutes(10)).await;
    }
    let d = claim(&f, "feed-a", "a4x", j1, Duration::minutes(10)).await;
    let done = f
        .store
        .complete_claim(&d, None, t0())
        .await
        .expect("complete");
    assert_eq!(done, CompleteOutcome::Completed);
    for n in 5..=6 {
        claim(&f, "feed-a", &format!("a{n}"), j2, Duration::seconds(10)).await;
    }
    claim(&f, "feed-b", "b1", j2, Duration::seconds(10)).await;
    // A minute later j2's claims are stale.
    f.clock.advance(Duration::minutes(1));
    let app = f.app(UiConfig {
        page_size: 2,
        ..f.config(Access::ReadOnly)
    });
    let html = get(&app, "/claims", &[]).await.text();
    assert!(
        html.contains(concat!(
            r#"<tr><td><a href="/claims?scope=feed-a">feed-a</a></td><td class="num">6</td>"#,
            r#"<td class="num"><a class="warn" href="/claims?scope=feed-a&amp;stale=1">2</a></td>"#,
            r#"<td class="num">1</td><td class="num">0</td></tr>"#
        )),
        "{html}"
    );
    assert!(
        html.contains(concat!(
            r#"<tr><td><a href="/claims?scope=feed-b">feed-b</a></td><td class="num">1</td>"#,
            r#"<td class="num"><a class="warn" href="/claims?scope=feed-b&amp;stale=1">1</a></td>"#,
        )),
        "{html}"
    );
    // Walks the pages of a filter forwards, then back from the last one.
    let walk = |start: &str| {
        let (app, start) = (app.clone(), start.to_string());
        async move {
            let (mut forward, mut path, mut last) = (Vec::new(), Some(start), String::new());
            while let Some(p) = path {
                let a = get(&app, &p, &[]).await;
                assert_eq!(a.status, StatusCode::OK, "{p}: {}", a.text());
                let html = a.text();
                let page = items(&html);
                assert!(page.len() <= 2, "{p}");
                forward.extend(page);
                path = link(&html, "next");
                last = p;
            }
            let (mut back, mut path) = (Vec::new(), Some(last));
            while let Some(p) = path {
                let html = get(&app, &p, &[]).await.text();
                let mut page = items(&html);
                page.extend(back);
                back = page;
                path = link(&html, "prev");
            }
            assert_eq!(back, forward, "← Previous walks the same rows back");
            forward
        }
    };
    // Held (the default), newest first.
    assert_eq!(
        walk("/claims").await,
        names(&["b1", "a6", "a5", "a4", "a3", "a2", "a1"])
    );
    assert_eq!(
        walk("/claims?scope=feed-a&stale=1").await,
        names(&["a6", "a5"])
    );
    assert_eq!(walk("/claims?stale=1").await, names(&["b1", "a6", "a5"]));
    assert_eq!(
        walk(&format!("/claims?job={j1}")).await,
        names(&["a4", "a3", "a2", "a1"])
    );
    assert_eq!(
        walk(&format!("/claims?job={j1}&status=all")).await,
        names(&["a4x", "a4", "a3", "a2", "a1"])
    );
    assert_eq!(walk("/claims?status=processed").await, names(&["a4x"]));
    assert!(walk("/claims?status=deferred").await.is_empty());
    // Stale rows are marked.
    let html = get(&app, "/claims?scope=feed-b", &[]).await.text();
    assert!(
        html.contains(r#"<span class="badge s-failed">stale</span>"#),
        "{html}"
    );
    let html = get(&app, &format!("/claims?job={j1}"), &[]).await.text();
    assert!(
        !html.contains(r#"<span class="badge s-failed">stale</span>"#),
        "{html}"
    );
    // The next link keeps the filter.
    let html = get(&app, &format!("/claims?job={j1}"), &[]).await.text();
    let next = link(&html, "next").expect("next");
    assert!(next.contains(&format!("job={j1}")), "{next}");
    for (query, field) in [
        ("status=bogus", "invalid status"),
        ("job=x", "invalid job"),
        ("after=x", "invalid after"),
    ] {
        let a = get(&app, &format!("/claims?{query}"), &[]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}");
        assert!(a.text().contains(field), "{query}: {}", a.text());
    }
}

#[tokio::test]
async fn groups_count_pending_due_and_running_per_group() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let all = all_actions(&f).await;
    let app = f.app(f.config(Access::ReadOnly));
    let html = get(&app, "/groups", &[]).await.text();
    let mut totals = (0, 0);
    for (group, label, q) in [
        (Some("mail"), "mail", "mail"),
        (Some("sms"), "sms", "sms"),
        (Some("reports"), "reports", "reports"),
        (None, "(none)", "-"),
    ] {
        let of = |keep: &dyn Fn(&dockhand::action::Action) -> bool| {
            all.iter()
                .filter(|a| a.group.as_deref() == group && keep(a))
                .count()
        };
        let pending = of(&|a| a.status.as_str() == "pending");
        let due = of(&|a| a.status.as_str() == "pending" && a.scheduled_at <= t0());
        let running = of(&|a| a.status.as_str() == "running");
        let row = format!(
            r#"<tr><td><a href="/actions?status=pending&amp;group={q}">{label}</a></td><td class="num">{pending}</td><td class="num">{due}</td><td class="num">{running}</td>"#
        );
        assert!(html.contains(&row), "{row}: {html}");
        assert!(pending > 0, "{label}");
        totals.0 += pending - due;
        totals.1 += running;
    }
    // Between them the groups hold every running action and the 20 due later.
    assert_eq!(totals, (20, 10));
}

#[tokio::test]
async fn read_only_callers_cannot_post_to_the_new_pages() {
    let f = Fixture::new().await;
    let m = many(&f).await;
    let j = job(&f, "ingest").await;
    let b = batch(&f).await;
    let ro = f.app(f.config(Access::ReadOnly));
    let op = f.app(f.config(Access::Operator));
    for path in [
        format!("/jobs/{j}"),
        format!("/batches/{}", b.parent),
        "/jobs".into(),
        "/batches".into(),
        "/claims".into(),
        "/groups".into(),
    ] {
        let html = get(&ro, &path, &[]).await.text();
        assert!(!html.contains(r#"method="post""#), "{path}");
        assert!(!html.contains("_csrf"), "{path}");
    }
    // A good cookie and token from an operator page still get 403.
    let s = Session::open(&op, "/actions", &[]).await;
    let before = statuses(&f).await;
    let id = m.ids[0];
    for (path, fields) in [
        ("/actions/bulk".to_string(), format!("id={id}&op=delete")),
        (
            "/actions/bulk/preview".to_string(),
            "op=cancel&status=pending".to_string(),
        ),
        (
            "/actions/bulk/all".to_string(),
            format!("op=cancel&status=pending&max_id={}", i64::MAX),
        ),
        (format!("/jobs/{j}/fail"), String::new()),
        (format!("/jobs/{j}/cancel"), String::new()),
        (format!("/batches/{}/cancel", b.parent), String::new()),
    ] {
        let a = s.post_fields(&ro, &path, &fields, &[]).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}");
        assert!(a.text().contains("read-only"), "{path}");
    }
    assert!(crate::seed::changed(&before, &statuses(&f).await).is_empty());
    let job_status = |id: i64| {
        let store = f.store.clone();
        async move { store.get_job(id).await.expect("get").expect("job").status }
    };
    assert_eq!(job_status(j).await, JobStatus::Pending);
    assert_eq!(job_status(b.parent).await, JobStatus::Pending);
    let st = f
        .store
        .batch_state(b.parent)
        .await
        .expect("state")
        .expect("batch");
    assert_eq!((st.ready, st.outcome), (2, None));
}
