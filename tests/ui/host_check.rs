//! The `Host` check against DNS rebinding (issue 18): without credentials only the allowed
//! names pass; a spoofed `Host` is refused with 421 on GET and POST before anything runs, and
//! the database is checked afterwards; `--allowed-host` names pass; credentials and the
//! `HostCheck` modes decide when the check applies (the mounted router's safe default).

use crate::support::{get, post_form, t0, Answer, Fixture, Session};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use clap::Parser;
use dockhand::cli::{Cli, Command};
use dockhand::ui::{standalone_router, try_router, Access, HostCheck, UiConfig, UiUser};
use std::sync::Arc;

const SPOOFED: &str = "rebind.attacker.example:8080";

/// The refusal: 421, one line naming the host and why, the security headers, no cookie.
fn assert_misdirected(a: &Answer, host: &str) {
    assert_eq!(a.status, StatusCode::MISDIRECTED_REQUEST, "{}", a.text());
    let text = a.text();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains(&format!("Host `{host}`")) && text.contains("DNS rebinding"),
        "{text}"
    );
    assert!(a.header("content-type").starts_with("text/plain"));
    assert!(a
        .header("content-security-policy")
        .contains("default-src 'self'"));
    assert_eq!(a.header("x-content-type-options"), "nosniff");
    assert!(a.csrf_cookie().is_none(), "no cookie for a refused request");
}

#[tokio::test]
async fn a_spoofed_host_is_refused_on_get_and_post_and_nothing_changes() {
    let f = Fixture::new().await;
    assert!(f
        .store
        .set_group_paused("mail", true, "test", t0())
        .await
        .expect("pause"));
    let app = f.app(f.config(Access::Operator));
    // A real session: the attacker's page would have had to get one the same way (it cannot,
    // the GET is refused), but even a valid cookie and token do not help.
    let s = Session::open(&app, "/groups", &[]).await;

    for path in ["/", "/groups", &format!("/actions/{}", f.seeded.pending)] {
        let a = get(&app, path, &[("host", SPOOFED)]).await;
        assert_misdirected(&a, SPOOFED);
        assert!(!a.text().contains("email.send"), "no data leaks");
    }
    // The rebinding page's own POSTs: Host and Origin both say the attacker's name.
    let origin = format!("http://{SPOOFED}");
    let headers = [("host", SPOOFED), ("origin", origin.as_str())];
    let cookie = s.cookie_header();
    let resume = post_form(
        &app,
        "/groups/resume",
        &format!("_csrf={}&group=mail", s.token),
        &[
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", "same-origin"),
            headers[0],
            headers[1],
        ],
    )
    .await;
    assert_misdirected(&resume, SPOOFED);
    let cancel = s
        .post(
            &app,
            &format!("/actions/{}/cancel", f.seeded.pending),
            &headers,
        )
        .await;
    assert_misdirected(&cancel, SPOOFED);
    let bulk = s
        .post_fields(
            &app,
            "/actions/bulk",
            &format!("id={}&op=delete", f.seeded.failed),
            &headers,
        )
        .await;
    assert_misdirected(&bulk, SPOOFED);

    let pauses = f.store.paused_groups().await.expect("pauses");
    assert_eq!(pauses.len(), 1, "the group stays paused");
    assert_eq!(pauses[0].group, "mail");
    assert_eq!(f.status(f.seeded.pending).await, "pending");
    assert_eq!(f.status(f.seeded.failed).await, "failed");

    // The same POST under an allowed name goes through: only the name was wrong.
    let resume = post_form(
        &app,
        "/groups/resume",
        &format!("_csrf={}&group=mail", s.token),
        &[
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", "same-origin"),
            ("host", "localhost"),
        ],
    )
    .await;
    assert_eq!(resume.status, StatusCode::SEE_OTHER, "{}", resume.text());
    assert!(f.store.paused_groups().await.expect("pauses").is_empty());
}

#[tokio::test]
async fn odd_hosts_are_refused_too() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::Operator));
    for host in [
        "localhost.evil.example",
        "localhost.",
        "127.0.0.1.nip.io:8080",
        "127.0.0.2",
        "0.0.0.0:8080",
        "evil.example@localhost",
    ] {
        assert_misdirected(&get(&app, "/", &[("host", host)]).await, host);
    }
    // No Host at all.
    let req = Request::builder()
        .uri("/")
        .body(Body::empty())
        .expect("request");
    let a = crate::support::send(&app, req).await;
    assert_misdirected(&a, "(none)");
    // An absolute request target names the authority the server must use (RFC 9112 §3.2.2);
    // a good Host header beside it does not help.
    let req = Request::builder()
        .uri(format!("http://{SPOOFED}/"))
        .header("host", "localhost")
        .body(Body::empty())
        .expect("request");
    assert_misdirected(&crate::support::send(&app, req).await, SPOOFED);
    // Two Host headers: each must be allowed.
    let req = Request::builder()
        .uri("/")
        .header("host", "localhost")
        .header("host", SPOOFED)
        .body(Body::empty())
        .expect("request");
    assert_misdirected(&crate::support::send(&app, req).await, SPOOFED);
}

#[tokio::test]
async fn the_loopback_names_pass() {
    let f = Fixture::new().await;
    // The mounted router does not know its port: the loopback names pass at any port.
    let app = f.app(f.config(Access::Operator));
    for host in [
        "localhost",
        "localhost:8080",
        "LOCALHOST:8080",
        "127.0.0.1",
        "127.0.0.1:8080",
        "[::1]",
        "[::1]:8080",
    ] {
        let a = get(&app, "/groups", &[("host", host)]).await;
        assert_eq!(a.status, StatusCode::OK, "{host}: {}", a.text());
    }
}

/// The router `dockhand ui ARGV` serves on `bound`, over the fixture's store and clock.
fn cli_app(f: &Fixture, argv: &[&str], bound: &str) -> axum::Router {
    let mut full = vec!["dockhand", "ui"];
    full.extend_from_slice(argv);
    let args = match Cli::try_parse_from(full).map(|c| c.command) {
        Ok(Command::Ui(a)) => a,
        other => panic!("{argv:?}: {other:?}"),
    };
    let cfg = args.config(bound.parse().expect("address"));
    let cfg = UiConfig {
        clock: Arc::new(f.clock.clone()),
        csrf_key: Some([7; 32]),
        ..cfg
    };
    standalone_router(Arc::clone(&f.store), cfg).expect("router")
}

#[tokio::test]
async fn dockhand_ui_answers_to_its_port_and_its_allowed_hosts() {
    let f = Fixture::new().await;
    let app = cli_app(
        &f,
        &[
            "--allowed-host",
            "queue.example.com",
            "--allowed-host",
            "ops.internal:8443",
        ],
        "127.0.0.1:8080",
    );
    for host in [
        "localhost:8080",
        "127.0.0.1:8080",
        "[::1]:8080",
        "queue.example.com",
        "queue.example.com:443",
        "Queue.Example.COM",
        "ops.internal:8443",
    ] {
        let a = get(&app, "/groups", &[("host", host)]).await;
        assert_eq!(a.status, StatusCode::OK, "{host}: {}", a.text());
    }
    for host in [
        "localhost:8081",
        "localhost",
        "127.0.0.1:80",
        "ops.internal",
        "ops.internal:8080",
        "evil.queue.example.com",
        SPOOFED,
    ] {
        let a = get(&app, "/groups", &[("host", host)]).await;
        assert_misdirected(&a, host);
        assert!(
            a.text().contains(
                "localhost:8080, 127.0.0.1:8080, [::1]:8080, queue.example.com, ops.internal:8443"
            ),
            "{}",
            a.text()
        );
    }
    // A change through the proxy's name works end to end.
    let s = Session::open(&app, "/groups", &[("host", "queue.example.com")]).await;
    let a = s
        .post(
            &app,
            &format!("/actions/{}/cancel", f.seeded.pending),
            &[
                ("host", "queue.example.com"),
                ("origin", "https://queue.example.com"),
            ],
        )
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.text());
    assert_eq!(f.status(f.seeded.pending).await, "canceled");
}

#[tokio::test]
async fn credentials_and_the_mode_decide_when_host_is_checked() {
    let f = Fixture::new().await;
    // Basic auth: the browser never sends the password to the attacker's name, so by default
    // Host is not checked (`dockhand ui --auth` on 0.0.0.0 answers under any name).
    let mut cfg = f.config(Access::Operator);
    cfg.basic_auth = Some(("admin".into(), "s3cret".into()));
    let app = f.app(cfg.clone());
    assert_eq!(
        get(&app, "/", &[("host", SPOOFED)]).await.status,
        StatusCode::UNAUTHORIZED
    );
    // `Always` checks it anyway, before authentication.
    cfg.host_check = HostCheck::Always;
    assert_misdirected(&get(&f.app(cfg), "/", &[("host", SPOOFED)]).await, SPOOFED);
}

#[tokio::test]
async fn a_mounted_router_behind_a_host_auth_layer_checks_host_until_told_otherwise() {
    let f = Fixture::new().await;
    // The host's layer grants operator access (as one trusting the network would); the router
    // cannot tell, so it keeps checking Host by default.
    let mounted = |cfg: UiConfig| {
        axum::Router::new()
            .merge(f.app(cfg))
            .layer(axum::Extension(Access::Operator))
            .layer(axum::Extension(UiUser("alice".into())))
    };
    let app = mounted(f.config(Access::ReadOnly));
    assert_misdirected(
        &get(&app, "/", &[("host", "ops.example.com")]).await,
        "ops.example.com",
    );
    assert_eq!(get(&app, "/", &[]).await.status, StatusCode::OK);
    // Listing the public name keeps the defence and lets it through.
    let mut cfg = f.config(Access::ReadOnly);
    cfg.allowed_hosts.push("ops.example.com".into());
    let app = mounted(cfg);
    assert_eq!(
        get(&app, "/", &[("host", "ops.example.com")]).await.status,
        StatusCode::OK
    );
    assert_misdirected(&get(&app, "/", &[("host", SPOOFED)]).await, SPOOFED);
    // `Never`, for a layer that authenticates every request with an origin-bound credential.
    let cfg = UiConfig {
        host_check: HostCheck::Never,
        ..f.config(Access::ReadOnly)
    };
    assert_eq!(
        get(&mounted(cfg), "/", &[("host", SPOOFED)]).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_bad_allowed_host_is_a_configuration_error() {
    let f = Fixture::new().await;
    let cfg = UiConfig {
        allowed_hosts: vec!["https://ops.example.com/".into()],
        ..f.config(Access::Operator)
    };
    let e = try_router(Arc::clone(&f.store), cfg.clone())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("allowed_hosts") && e.contains("https://ops.example.com/"),
        "{e}"
    );
    // `router` answers every request with the reason, with the security headers.
    let a = get(&f.app(cfg), "/", &[]).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(a.text().contains("allowed_hosts"), "{}", a.text());
    assert!(!a.header("content-security-policy").is_empty());
}
