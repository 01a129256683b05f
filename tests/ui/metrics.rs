//! `GET /metrics` on the dashboard router: the Prometheus text of the configured recorder,
//! behind the same `Host` check and authentication as the pages; 404 when the router has no
//! recorder. The recorder is global to this test binary, so the assertions are on series this
//! test alone writes (a group named for it).

use crate::support::{get, Fixture};
use axum::http::StatusCode;
use base64::Engine;
use dockhand::prometheus::{self, GaugeRefresher};
use dockhand::ui::Access;
use dockhand::Clock;

fn basic(user: &str, pass: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    format!("Basic {token}")
}

#[tokio::test]
async fn metrics_are_served_behind_the_dashboards_checks() {
    let f = Fixture::new().await;
    // Without a recorder: the dashboard's 404.
    let app = f.app(f.config(Access::ReadOnly));
    assert_eq!(
        get(&app, "/metrics", &[]).await.status,
        StatusCode::NOT_FOUND
    );

    let handle = prometheus::install().expect("recorder");
    GaugeRefresher::new()
        .refresh(f.store.as_ref(), f.clock.now())
        .await
        .expect("gauges");
    let mut cfg = f.config(Access::ReadOnly);
    cfg.metrics = Some(handle);
    let app = f.app(cfg);
    let a = get(&app, "/metrics", &[]).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.header("content-type"), prometheus::CONTENT_TYPE);
    assert_eq!(a.header("cache-control"), "no-store");
    // The fixture's one pending action of group `mail`, due now.
    let text = a.text();
    assert!(
        text.lines().any(|l| l
            .strip_prefix("dockhand_actions{group=\"mail\",status=\"pending\"} ")
            .and_then(|v| v.parse::<f64>().ok())
            == Some(1.0)),
        "{text}"
    );
    // Another Host name: refused before anything else (DNS rebinding).
    let a = get(&app, "/metrics", &[("host", "evil.example")]).await;
    assert_eq!(a.status, StatusCode::MISDIRECTED_REQUEST);

    // With credentials configured, /metrics needs them like every page.
    let mut cfg = f.config(Access::Operator);
    cfg.metrics = Some(prometheus::install().expect("same recorder"));
    cfg.read_only_auth = Some(("viewer".into(), "look".into()));
    let app = f.app(cfg);
    assert_eq!(
        get(&app, "/metrics", &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    let viewer = basic("viewer", "look");
    let a = get(&app, "/metrics", &[("authorization", viewer.as_str())]).await;
    assert_eq!(a.status, StatusCode::OK);
}
