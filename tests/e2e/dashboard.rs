//! The dashboard in a real headless browser: every page loads with no Content-Security-Policy
//! violation; the actions list filters (through the `/` shortcut), pages forwards and back,
//! and selects rows with `j`; retry from an action's page and cancel of checked rows change
//! the database; a bulk dry run counts; the theme toggles; screenshots of each page land in
//! `target/e2e-shots/`.

use crate::harness::{browser_available, Browser, Dashboard};
use crate::webdriver::{Key, Locator};
use dockhand::store::Store;
use dockhand::ActionStatus;
use std::time::Duration;

async fn wait_text(b: &Browser, css: &str, needle: &str) -> String {
    for _ in 0..100 {
        if let Ok(el) = b.client.find(Locator::Css(css)).await {
            if let Ok(t) = el.text().await {
                if t.contains(needle) {
                    return t;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let html = b.client.source().await.unwrap_or_default();
    panic!("`{css}` never contained `{needle}`:\n{html}");
}

async fn status(store: &dyn Store, id: i64) -> ActionStatus {
    store.get(id).await.expect("get").expect("exists").status
}

async fn rows(b: &Browser) -> usize {
    b.client
        .find_all(Locator::Css("table.rows tbody tr"))
        .await
        .map(|r| r.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_browser() {
    if !browser_available() {
        return;
    }
    let d = Dashboard::start().await;
    let b = Browser::start().await;
    let c = &b.client;
    let url = |p: &str| format!("{}{p}", d.url);

    // Overview.
    c.goto(&url("/")).await.expect("overview");
    wait_text(&b, "main h1", "Overview").await;
    wait_text(&b, "main", "Last hour, per minute").await;
    b.shot("overview").await;

    // Actions: filter through the `/` shortcut, page forwards and back.
    c.goto(&url("/actions?status=pending"))
        .await
        .expect("actions");
    wait_text(&b, "main h1", "Actions").await;
    assert_eq!(rows(&b).await, 50, "a full first page");
    let body = c.find(Locator::Css("body")).await.expect("body");
    body.send_keys("/").await.expect("slash");
    let active = c.active_element().await.expect("focused");
    assert_eq!(
        active.attr("name").await.expect("name").as_deref(),
        Some("hook")
    );
    active
        .send_keys(&format!("email.send{}", Key::Enter))
        .await
        .expect("type hook");
    wait_text(&b, "nav.tabs", "pending").await;
    for _ in 0..100 {
        if c.current_url()
            .await
            .expect("url")
            .as_str()
            .contains("hook=email.send")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hooks: Vec<String> = {
        let mut out = Vec::new();
        for el in c
            .find_all(Locator::Css("table.rows tbody tr td:nth-child(3) code"))
            .await
            .expect("hooks")
        {
            out.push(el.text().await.expect("text"));
        }
        out
    };
    assert!(
        !hooks.is_empty() && hooks.iter().all(|h| h == "email.send"),
        "{hooks:?}"
    );
    c.find(Locator::Css("a[rel=next]"))
        .await
        .expect("next link")
        .click()
        .await
        .expect("next");
    wait_text(&b, "nav.pager", "Previous").await;
    assert!(c
        .current_url()
        .await
        .expect("url")
        .as_str()
        .contains("after="));
    c.find(Locator::Css("a[rel=prev]"))
        .await
        .expect("prev link")
        .click()
        .await
        .expect("prev");
    wait_text(&b, "nav.pager", "First").await;
    b.shot("actions").await;

    // `j` selects the first row.
    c.find(Locator::Css("body"))
        .await
        .expect("body")
        .send_keys("j")
        .await
        .expect("j");
    c.find(Locator::Css("table.rows tbody tr.selected"))
        .await
        .expect("a selected row");

    // Cancel two checked rows.
    // The two newest `email.send` actions: on the first page of the newest-first order.
    let n = d.seeded.pending.len();
    let (a, b_id) = (d.seeded.pending[n - 1], d.seeded.pending[n - 2]);
    c.goto(&url("/actions?status=pending&hook=email.send&sort=i"))
        .await
        .expect("list");
    wait_text(&b, "main h1", "Actions").await;
    for id in [a, b_id] {
        c.find(Locator::Css(&format!("input[name=id][value='{id}']")))
            .await
            .expect("checkbox")
            .click()
            .await
            .expect("check");
    }
    c.find(Locator::Css("button[name=op][value=cancel]"))
        .await
        .expect("cancel button")
        .click()
        .await
        .expect("cancel");
    wait_text(&b, "main", "Changed 2, skipped 0").await;
    assert_eq!(status(d.store.as_ref(), a).await, ActionStatus::Canceled);
    assert_eq!(status(d.store.as_ref(), b_id).await, ActionStatus::Canceled);

    // Retry the failed action from its page.
    c.goto(&url(&format!("/actions/{}", d.seeded.failed)))
        .await
        .expect("action");
    wait_text(&b, "main", "fatal: bad address").await;
    b.shot("action").await;
    c.find(Locator::Css("form[action$='/retry'] button"))
        .await
        .expect("retry")
        .click()
        .await
        .expect("retry click");
    wait_text(&b, "main", "Retried").await;
    assert_eq!(
        status(d.store.as_ref(), d.seeded.failed).await,
        ActionStatus::Pending
    );

    // A bulk dry run counts and changes nothing.
    c.goto(&url("/actions?status=pending&hook=report.build"))
        .await
        .expect("list");
    wait_text(&b, "main h1", "Actions").await;
    c.find(Locator::Css("form.bulkall button"))
        .await
        .expect("count first")
        .click()
        .await
        .expect("preview");
    wait_text(&b, "main h1", "all matching actions?").await;
    wait_text(&b, "main", "actions match the filter now").await;
    b.shot("bulk-preview").await;

    // The other pages.
    for (path, title, shot) in [
        ("/groups", "Groups", "groups"),
        ("/schedules", "Schedules", "schedules"),
        ("/jobs", "Jobs", "jobs"),
        ("/batches", "Batches", "batches"),
        ("/claims", "Item claims", "claims"),
    ] {
        c.goto(&url(path)).await.expect(path);
        wait_text(&b, "main h1", title).await;
        b.shot(shot).await;
    }
    c.goto(&url(&format!("/batches/{}", d.seeded.batch)))
        .await
        .expect("batch");
    wait_text(&b, "main", "Failed children").await;
    wait_text(&b, "main dl", "3").await;
    // The failed children were updated minutes before the page's clock: "ago", never "in".
    let children = c
        .find(Locator::Css("main table"))
        .await
        .expect("failed children")
        .text()
        .await
        .expect("text");
    assert!(
        children.contains(" ago)") && !children.contains("(in "),
        "relative times against the page's clock: {children}"
    );
    b.shot("batch").await;

    // Dark mode: the toggle sets the cookie and the class.
    c.find(Locator::Css("button[data-toggle=theme]"))
        .await
        .expect("theme button")
        .click()
        .await
        .expect("toggle");
    for _ in 0..100 {
        let class = c
            .find(Locator::Css("html"))
            .await
            .expect("html")
            .attr("class")
            .await
            .expect("class");
        if class.is_some_and(|c| c.contains("dark") || c.contains("light")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.refresh().await.expect("reload");
    wait_text(&b, "main h1", "Batch").await;
    b.shot("batch-theme-toggled").await;

    // Re-run the failed children: the button leads to the new job, which links the batch.
    c.find(Locator::Css("form[action$=\"/rerun\"] button"))
        .await
        .expect("re-run button")
        .click()
        .await
        .expect("re-run");
    wait_text(&b, "main", "Re-run started").await;
    let main = wait_text(&b, "main dl", "failed children of batch").await;
    assert!(
        main.contains(&d.seeded.batch.to_string()),
        "the re-run links its batch: {main}"
    );
    b.shot("batch-rerun").await;

    // The log does carry the page's console: a probe written now must show up in it, or the
    // CSP check above would pass on an empty log.
    c.execute("console.error('dockhand-e2e-probe')", vec![])
        .await
        .expect("probe");
    let mut probed = false;
    for _ in 0..100 {
        if b.log_contains("dockhand-e2e-probe") {
            probed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let violations = b.csp_violations();
    b.close().await;
    assert!(
        probed,
        "the browser console does not reach the chromedriver log"
    );
    assert!(
        violations.is_empty(),
        "CSP violations in the browser log:\n{}",
        violations.join("\n")
    );
}
