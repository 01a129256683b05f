//! DNS rebinding in a real browser (issue 18): Chromium reaches the dashboard through
//! `rebind.test`, a name that resolves to 127.0.0.1 (`--host-resolver-rules`) but that the
//! dashboard does not answer to, as a rebinding page's name would. The page is refused with
//! 421 and shows nothing of the dashboard; script on that origin cannot read a page or post a
//! change (the paused group stays paused); the same server under 127.0.0.1 works.

use crate::harness::{browser_available, Browser, Dashboard, REBIND_HOST};
use crate::webdriver::Locator;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_under_a_name_the_dashboard_does_not_answer_to_is_refused() {
    if !browser_available() {
        return;
    }
    let d = Dashboard::start().await;
    let now = chrono::Utc::now();
    assert!(d
        .store
        .set_group_paused("mail", true, "e2e", now)
        .await
        .expect("pause"));
    let b = Browser::start().await;
    let c = &b.client;
    let rebound = format!("http://{REBIND_HOST}:{}", d.port);

    c.goto(&format!("{rebound}/groups")).await.expect("goto");
    let text = c
        .find(Locator::Css("body"))
        .await
        .expect("body")
        .text()
        .await
        .expect("text");
    assert!(
        text.contains("421 Misdirected Request")
            && text.contains(&format!("Host `{REBIND_HOST}:{}`", d.port))
            && text.contains("DNS rebinding"),
        "{text}"
    );
    let html = c.source().await.expect("source");
    assert!(
        !html.contains("topbar") && !html.contains("mail"),
        "nothing of the dashboard: {html}"
    );
    b.shot("rebinding-refused").await;

    // Script on the rebinding origin: reads and writes are refused as well.
    let answers = c
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               Promise.all([
                 fetch('/groups').then(r => r.status),
                 fetch('/groups/resume', {
                   method: 'POST',
                   headers: {'Content-Type': 'application/x-www-form-urlencoded'},
                   body: 'group=mail',
                 }).then(r => r.status),
               ]).then(done, e => done(String(e)));"#,
            vec![],
        )
        .await
        .expect("script");
    assert_eq!(answers, json!([421, 421]));
    let pauses = d.store.paused_groups().await.expect("pauses");
    assert_eq!(pauses.len(), 1, "the group stays paused");

    // The same server under an allowed name.
    c.goto(&format!("http://127.0.0.1:{}/groups", d.port))
        .await
        .expect("goto");
    let h1 = c
        .find(Locator::Css("main h1"))
        .await
        .expect("h1")
        .text()
        .await
        .expect("text");
    assert_eq!(h1, "Groups");
    assert!(b.csp_violations().is_empty(), "{:?}", b.csp_violations());
    b.close().await;
}
