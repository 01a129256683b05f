//! The action list (`/actions`): tab counts against the database, filters that narrow the
//! rows, field-naming 400s, keyset pages walked both ways through the rendered links, and the
//! read-only view without bulk controls.

use crate::seed::{all_actions, many, Many};
use crate::support::{get, link, row_ids, Fixture};
use axum::http::StatusCode;
use axum::Router;
use dockhand::action::Action;
use dockhand::ui::{Access, UiConfig};

/// The number in `{label} <span class="count">N</span>` of the status tabs.
fn tab_count(html: &str, label: &str) -> i64 {
    let needle = format!(">{label} <span class=\"count\">");
    let at = html
        .find(&needle)
        .unwrap_or_else(|| panic!("no tab {label}: {html}"))
        + needle.len();
    let end = html[at..].find('<').expect("end of count");
    html[at..at + end]
        .replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("tab {label}: {}", &html[at..at + end]))
}

fn app(f: &Fixture, access: Access, page_size: i64) -> Router {
    f.app(UiConfig {
        page_size,
        ..f.config(access)
    })
}

/// The ids of the non-internal actions `keep` accepts, sorted.
fn want(all: &[Action], keep: impl Fn(&Action) -> bool) -> Vec<i64> {
    let mut ids: Vec<i64> = all
        .iter()
        .filter(|a| !a.hook.starts_with("dockhand."))
        .filter(|a| keep(a))
        .map(|a| a.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Which actions a filter should keep.
type Keep = Box<dyn Fn(&Action) -> bool>;

/// The row ids of one page, sorted.
async fn ids_of(app: &Router, path: &str) -> Vec<i64> {
    let a = get(app, path, &[]).await;
    assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text());
    let html = a.text();
    assert!(link(&html, "next").is_none(), "{path} fits one page");
    let mut ids = row_ids(&html, "/actions/");
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn tab_counts_match_the_database() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let all = all_actions(&f).await;
    let app = app(&f, Access::ReadOnly, 50);
    for (query, hook) in [("", None), ("?hook=sms.send", Some("sms.send"))] {
        let html = get(&app, &format!("/actions{query}"), &[]).await.text();
        let of = |status: Option<&str>| {
            want(&all, |a| {
                status.is_none_or(|s| a.status.as_str() == s) && hook.is_none_or(|h| a.hook == h)
            })
            .len() as i64
        };
        assert_eq!(tab_count(&html, "all"), of(None), "{query}");
        for s in ["pending", "running", "complete", "failed", "canceled"] {
            assert_eq!(tab_count(&html, s), of(Some(s)), "{query} {s}");
        }
    }
    // The seed's shape, so the comparison above is not between two zeros.
    let html = get(&app, "/actions?hook=sms.send", &[]).await.text();
    let counts: Vec<i64> = [
        "all", "pending", "running", "complete", "failed", "canceled",
    ]
    .iter()
    .map(|s| tab_count(&html, s))
    .collect();
    assert_eq!(counts, vec![40, 10, 10, 10, 10, 0]);
    // Tabs keep the filter and drop the sort.
    assert!(
        html.contains(r#"<a href="/actions?status=failed&amp;hook=sms.send">"#),
        "{html}"
    );
}

#[tokio::test]
async fn filters_narrow_the_rows() {
    let f = Fixture::new().await;
    let seeded: Many = many(&f).await;
    let all = all_actions(&f).await;
    let app = app(&f, Access::ReadOnly, 500);
    let n = |a: &Action| a.args["n"].as_i64().unwrap_or(-1);
    let cases: Vec<(&str, Keep)> = vec![
        ("hook=sms.send", Box::new(|a| a.hook == "sms.send")),
        (
            "group=mail",
            Box::new(|a| a.group.as_deref() == Some("mail")),
        ),
        ("group=-", Box::new(|a| a.group.is_none())),
        ("pmin=1&pmax=2", Box::new(|a| (1..=2).contains(&a.priority))),
        ("pmin=4", Box::new(|a| a.priority >= 4)),
        (
            "args=%7B%22tenant%22%3A%22acme%22%7D",
            Box::new(|a| a.args["tenant"] == "acme"),
        ),
        (
            "args=%7B%22n%22%3A7%7D&hook=sms.send",
            Box::new(move |a| n(a) == 7 && a.hook == "sms.send"),
        ),
        (
            "status=pending&hook=report.build&group=reports",
            Box::new(|a| {
                a.status.as_str() == "pending"
                    && a.hook == "report.build"
                    && a.group.as_deref() == Some("reports")
            }),
        ),
        (
            "status=failed&sort=i",
            Box::new(|a| a.status.as_str() == "failed"),
        ),
    ];
    for (query, keep) in cases {
        let expected = want(&all, keep);
        assert!(!expected.is_empty(), "{query} matches something");
        assert!(expected.len() < all.len() - 1, "{query} narrows");
        assert_eq!(
            ids_of(&app, &format!("/actions?{query}")).await,
            expected,
            "{query}"
        );
    }
    // Internal actions only with `internal=1`.
    let without = ids_of(&app, "/actions").await;
    assert!(!without.contains(&seeded.internal));
    let with = ids_of(&app, "/actions?internal=1").await;
    assert!(with.contains(&seeded.internal));
    assert_eq!(with.len(), without.len() + 1);
    // The filter form shows what the URL says.
    let html = get(&app, "/actions?hook=sms.send&group=-&pmin=1", &[])
        .await
        .text();
    assert!(html.contains(r#"name="hook" value="sms.send""#), "{html}");
    assert!(html.contains(r#"name="group" value="-""#), "{html}");
    assert!(html.contains(r#"name="pmin" value="1""#), "{html}");
}

#[tokio::test]
async fn a_bad_filter_is_a_400_naming_the_field() {
    let f = Fixture::new().await;
    let app = app(&f, Access::Operator, 50);
    for (query, field) in [
        ("args=3", "args_contains"),
        ("args=%7Bnope", "args_contains"),
        ("status=done", "status"),
        ("from=yesterday", "from"),
        ("to=soon", "to"),
        ("pmin=x", "pmin"),
        ("pmin=5&pmax=1", "priority"),
        ("sort=zz", "sort"),
        ("status=pending&sort=f", "sort"),
        ("sort=s", "sort"),
        ("status=running&sort=n", "sort"),
        ("after=q.1", "cursor"),
    ] {
        let a = get(&app, &format!("/actions?{query}"), &[]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}");
        assert!(
            a.text().contains(&format!("invalid {field}")),
            "{query}: {}",
            a.text()
        );
    }
}

/// Follows `rel` links from `start` until there is none; the ids of each page, in order.
async fn walk(app: &Router, start: &str, rel: &str, keep: &[&str]) -> Vec<Vec<i64>> {
    let mut pages = Vec::new();
    let mut path = Some(start.to_string());
    while let Some(p) = path {
        assert!(pages.len() < 100, "a walk of {rel} links ends");
        let a = get(app, &p, &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{p}: {}", a.text());
        let html = a.text();
        pages.push(row_ids(&html, "/actions/"));
        path = link(&html, rel);
        for k in keep {
            if let Some(next) = &path {
                assert!(next.contains(k), "{next} keeps {k}");
            }
        }
    }
    pages
}

#[tokio::test]
async fn next_and_previous_links_visit_every_row_once() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let all = all_actions(&f).await;
    let app = app(&f, Access::Operator, 7);
    // Newest first over everything; then the pending tab's three-key sort, with a filter.
    let cases: Vec<(&str, Vec<&str>, Vec<i64>)> = vec![
        ("/actions", vec![], {
            let mut w = want(&all, |_| true);
            w.reverse();
            w
        }),
        (
            "/actions?status=pending&group=reports",
            vec!["status=pending", "group=reports"],
            {
                let mut p: Vec<&Action> = all
                    .iter()
                    .filter(|a| {
                        a.status.as_str() == "pending" && a.group.as_deref() == Some("reports")
                    })
                    .collect();
                p.sort_by_key(|a| (a.priority, a.scheduled_at, a.id));
                p.iter().map(|a| a.id).collect()
            },
        ),
        (
            "/actions?status=failed&hook=sms.send",
            vec!["status=failed", "hook=sms.send"],
            {
                let mut p: Vec<&Action> = all
                    .iter()
                    .filter(|a| a.status.as_str() == "failed" && a.hook == "sms.send")
                    .collect();
                p.sort_by_key(|a| std::cmp::Reverse((a.finished_at, a.id)));
                p.iter().map(|a| a.id).collect()
            },
        ),
    ];
    for (start, keep, expected) in cases {
        assert!(expected.len() > 7, "{start} needs more than one page");
        let forward = walk(&app, start, "next", &keep).await;
        let flat: Vec<i64> = forward.concat();
        assert_eq!(flat, expected, "{start}: every row once, in order");
        assert!(forward.iter().all(|p| p.len() <= 7));
        // Back from the last page.
        let last = {
            let mut path = start.to_string();
            for _ in 1..forward.len() {
                let html = get(&app, &path, &[]).await.text();
                path = link(&html, "next").expect("next");
            }
            path
        };
        let mut back = walk(&app, &last, "prev", &keep).await;
        back.reverse();
        assert_eq!(
            back, forward,
            "{start}: ← Previous walks the same pages back"
        );
        // The first page has no previous link.
        let first = get(&app, start, &[]).await.text();
        assert!(link(&first, "prev").is_none(), "{start}");
    }
}

#[tokio::test]
async fn read_only_lists_have_no_checkboxes_or_bulk_forms() {
    let f = Fixture::new().await;
    let _ = many(&f).await;
    let ro = app(&f, Access::ReadOnly, 50);
    let op = app(&f, Access::Operator, 50);
    for path in [
        "/actions",
        "/actions?status=failed",
        "/actions?status=pending",
    ] {
        let html = get(&ro, path, &[]).await.text();
        assert!(!row_ids(&html, "/actions/").is_empty(), "{path}");
        for banned in [
            r#"type="checkbox" name="id""#,
            "/actions/bulk",
            "_csrf",
            r#"method="post""#,
            r#"name="op""#,
        ] {
            assert!(!html.contains(banned), "{path} has {banned}");
        }
        // The operator's view of the same list has them, one checkbox per row.
        let html = get(&op, path, &[]).await.text();
        assert_eq!(
            html.matches(r#"type="checkbox" name="id""#).count(),
            row_ids(&html, "/actions/").len(),
            "{path}"
        );
        assert!(html.contains(r#"action="/actions/bulk/preview""#));
        assert!(html.contains(r#"action="/actions/bulk""#));
    }
}
