//! Relative times ("3m ago", "in 2m") are computed against the instant the page was rendered
//! with (the dashboard's clock), on every page that shows them: a fixed clock gives a fixed
//! text. (A screenshot once showed a past update as "in 250d": its batch had been written by a
//! runtime on the wall clock while the page used the seed's frozen clock.)

use crate::seed::batch;
use crate::support::{get, Fixture};
use axum::http::StatusCode;
use chrono::Duration;
use dockhand::ui::Access;

/// The rendered `time` element for `hms` (UTC, on the fixture's day) and its relative text.
fn at(hms: &str, rel: &str) -> String {
    format!("2026-03-27 {hms} UTC</time> <span class=\"muted\">({rel})</span>")
}

#[tokio::test]
async fn relative_times_follow_the_pages_clock() {
    let f = Fixture::new().await;
    let b = batch(&f).await;
    // Everything was written at t0 (the failed action finished at t0 + 1 s); the page is
    // rendered 3 minutes later.
    f.clock.advance(Duration::minutes(3));
    let app = f.app(f.config(Access::ReadOnly));

    let a = get(&app, &format!("/actions/{}", f.seeded.failed), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    let text = a.text();
    assert!(text.contains(&at("12:00:00", "3m ago")), "{text}");
    assert!(text.contains(&at("12:00:01", "2m 59s ago")), "{text}");

    let a = get(&app, "/actions?status=pending", &[]).await;
    assert!(a.text().contains(&at("12:00:00", "3m ago")), "{}", a.text());

    // The schedule's next run is at t0 + 5 min: in the future by 2 minutes.
    let a = get(&app, "/schedules", &[]).await;
    assert!(a.text().contains(&at("12:05:00", "in 2m")), "{}", a.text());

    // The batch's failed child was updated at t0.
    let a = get(&app, &format!("/batches/{}", b.parent), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    let text = a.text();
    assert!(text.contains(&at("12:00:00", "3m ago")), "{text}");
    assert!(
        !text.contains("(in "),
        "a past update shown in the future: {text}"
    );

    let a = get(&app, &format!("/jobs/{}", b.parent), &[]).await;
    assert!(a.text().contains(&at("12:00:00", "3m ago")), "{}", a.text());

    // The overview's oldest due lag: the pending action has been due since t0.
    let a = get(&app, "/", &[]).await;
    assert!(
        a.text()
            .contains("Oldest due lag</div><div class=\"value\">3m</div>"),
        "{}",
        a.text()
    );

    // Another instant, another text: nothing is cached across clock readings but the counts.
    f.clock.advance(Duration::hours(2));
    let a = get(&app, &format!("/actions/{}", f.seeded.failed), &[]).await;
    assert!(
        a.text().contains(&at("12:00:00", "2h 3m ago")),
        "{}",
        a.text()
    );
}
