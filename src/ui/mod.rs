//! The operator dashboard (issue 8; `ui` feature): server-rendered HTML pages over a
//! [`DynStore`](crate::DynStore), for mounting in a host's axum application or serving with `dockhand ui`.
//!
//! ```no_run
//! # async fn demo(runtime: dockhand::Runtime) -> Result<(), Box<dyn std::error::Error>> {
//! use dockhand::store::postgres::PgStore;
//! use dockhand::ui::{router, Access, UiConfig, LOOPBACK_NAMES};
//!
//! // Give the dashboard its own small pool, so a slow page never holds the workers' connections.
//! let options: sqlx::postgres::PgConnectOptions = "postgres://app@db/queue".parse()?;
//! let ui_store: dockhand::DynStore = std::sync::Arc::new(PgStore::connect_with(options, 2).await?);
//! let app = axum::Router::new().nest(
//!     "/queue",
//!     router(ui_store, UiConfig {
//!         base_path: "/queue".into(),
//!         access: Access::Operator,     // or set an `Access` request extension in your auth layer
//!         jobs: Some(runtime.jobs()),   // step names in the job stepper
//!         // Without basic auth here the router answers only to these `Host` names (DNS
//!         // rebinding); list the names your users reach it by (see `UiConfig::host_check`).
//!         allowed_hosts: ["ops.example.com"].into_iter().chain(LOOPBACK_NAMES)
//!             .map(String::from).collect(),
//!         ..UiConfig::default()
//!     }),
//! );
//! # let _ = app; Ok(()) }
//! ```
//!
//! Module map:
//! - this module: [`UiConfig`], [`Access`], [`UiUser`], [`HostCheck`], [`validate_base_path`]
//!   and the routers ([`router`], [`standalone_router`]);
//! - `router`: the routes, the shared `AppState`, the request context every page gets
//!   (`Ctx`: access, user, CSRF token, timezone, theme, `HX-Request`), the POST handlers and
//!   `GET /metrics` (Prometheus text, when [`UiConfig::metrics`] is set);
//! - `layers`: the middleware (security headers, authentication, read-only, CSRF, the
//!   dashboard's error page on every error response);
//! - `host`: the `Host` check against DNS rebinding;
//! - `auth`: HTTP basic credentials, compared in constant time on their SHA-256;
//! - `csrf`: the signed double-submit cookie (`dh_csrf`) and its token;
//! - `assets`: the vendored htmx 2.0.11 (0BSD, LICENSE alongside), app.css and app.js, all
//!   compiled in with `include_bytes!`;
//! - `pages`: one module per page (`overview`, `action`, `schedules`), the shared `layout`
//!   (navigation, time formatting, buttons) and `chart` (the inline SVG throughput chart).
//!
//! Security (docs/dashboard_plan.md §3): without basic-auth credentials (by default; see
//! [`HostCheck`]) a request whose `Host` is not an allowed name gets 421 and one plain line
//! before anything else runs. Every response carries a strict Content-Security-Policy (no
//! inline script or style anywhere), `nosniff` and `Referrer-Policy: no-referrer`; HTML is
//! `no-store`; every other error (401, 403, extractor rejections, unknown paths) is the
//! dashboard's error page. Every non-GET request needs [`Access::Operator`] and a valid CSRF
//! token, and is refused when the browser says it is cross-site. Every operator POST writes
//! one `tracing` event with target [`crate::telemetry::UI_AUDIT_TARGET`].

mod assets;
mod auth;
mod cache;
mod csrf;
mod host;
mod layers;
mod pages;
mod params;
mod router;

pub use host::{validate_allowed_host, LOOPBACK_NAMES};
pub use router::{router, standalone_router, try_router};

/// The schema migration the dashboard's queries need (0005: one index per list order; 0006:
/// group pauses; 0007: the children's sidecars a batch re-run claims again; 0008: the stop
/// status and reason a cancelled or failed batch parent finishes with); `dockhand ui` refuses
/// to serve an older database rather than scan it or fail page by page.
pub const SCHEMA_VERSION: i64 = 8;

use crate::clock::{Clock, SystemClock};
use crate::jobs::api::Jobs;
use std::sync::Arc;
use std::time::Duration;

/// What a caller may do in the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Look only: no buttons or forms are rendered and every non-GET request gets 403.
    ReadOnly,
    /// Look and act: retry, cancel, run now, enable/disable.
    Operator,
}

impl Access {
    /// `read-only` or `operator`, as audit events show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::ReadOnly => "read-only",
            Access::Operator => "operator",
        }
    }
}

/// When the dashboard checks the `Host` header against [`UiConfig::allowed_hosts`], its
/// defence against DNS rebinding: a web page whose name an attacker re-points at the
/// dashboard's address reaches it with the browser's full trust but with the attacker's name in
/// `Host`. A request whose `Host` is not allowed gets `421 Misdirected Request` and one line
/// saying why, before any handler runs.
///
/// Rebinding can only abuse access that the browser does not have to prove with a credential
/// bound to the dashboard's own origin: access by network position (loopback without
/// credentials, an auth layer that trusts source addresses). HTTP basic auth configured here is
/// such a credential (the browser never sends it to the attacker's name), which is why the
/// default checks only without it. An [`Access`] extension set by the host's own auth layer is
/// **not** counted as a credential: the router cannot tell whether that layer checked one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostCheck {
    /// Check `Host` when neither [`UiConfig::basic_auth`] nor [`UiConfig::read_only_auth`] is
    /// set (the default, and what `dockhand ui` does without `--allowed-host`).
    #[default]
    WithoutCredentials,
    /// Check `Host` on every request, whatever the credentials.
    Always,
    /// Never check `Host`: only for a router behind an auth layer that authenticates every
    /// request with a credential the browser binds to the origin (a session cookie, an
    /// `Authorization` header, a login proxy), never by source address or network, or behind
    /// a proxy that checks `Host` itself.
    Never,
}

/// The name of the caller, for audit events and the `ui:<user>` actor. A host's own auth
/// layer may insert it as a request extension (with an [`Access`]); the router's basic auth
/// sets it from the credentials' user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiUser(pub String);

/// How the dashboard behaves. Every field has a default ([`UiConfig::default`]).
#[derive(Clone)]
pub struct UiConfig {
    /// The path the router is nested under (`/` when it is the whole app). Links and the CSRF
    /// cookie's `Path` use it; it must match the host's `Router::nest` path.
    pub base_path: String,
    /// The most any caller gets, and what callers get when no credentials are configured.
    /// Default [`Access::ReadOnly`]. An [`Access`] request extension set by the host's own
    /// auth layer wins over this and over the basic-auth credentials.
    pub access: Access,
    /// Operator credentials (user, password) for HTTP basic auth; they give `access`.
    pub basic_auth: Option<(String, String)>,
    /// Read-only credentials (user, password) for HTTP basic auth; they give
    /// [`Access::ReadOnly`].
    pub read_only_auth: Option<(String, String)>,
    /// The key of the CSRF token's HMAC. `None`: random per router; replicas behind one load
    /// balancer must share one.
    pub csrf_key: Option<[u8; 32]>,
    /// Counts stop at this many rows and show as "100,000+".
    pub count_cap: i64,
    /// How long counts and charts are cached.
    pub cache_ttl: Duration,
    /// Rows per list page (at most [`crate::search::MAX_PAGE`]).
    pub page_size: i64,
    /// Rows per transaction of a bulk action.
    pub bulk_chunk: i64,
    /// Pause between the chunks of a bulk action.
    pub bulk_pause: Duration,
    /// A page's database work stops after this long.
    pub query_timeout: Duration,
    /// The runtime's job handle (`runtime.jobs()`), for step names and resume; `None`: a handle
    /// without pipelines.
    pub jobs: Option<Jobs>,
    /// The clock every "now" comes from.
    pub clock: Arc<dyn Clock>,
    /// When `Host` is checked against `allowed_hosts` (DNS rebinding defence). Default
    /// [`HostCheck::WithoutCredentials`]: a router without `basic_auth`/`read_only_auth`
    /// answers only to the allowed names, even when the host's own auth layer sets an
    /// [`Access`] extension.
    ///
    /// **Mounting behind your own auth:** put the names your users reach the dashboard by in
    /// `allowed_hosts` (e.g. `"ops.example.com"`; this keeps the defence), or, if your layer
    /// authenticates every request with a credential bound to your origin (session cookie,
    /// `Authorization` header; never the source address), set [`HostCheck::Never`]. Until then
    /// requests under other names get 421 naming the allowed ones.
    pub host_check: HostCheck,
    /// The `Host` values the dashboard answers to when it checks: `NAME` (that name at any
    /// port) or `NAME:PORT` (that port only; a `Host` without a port is port 80), where `NAME`
    /// is a host name, an IPv4 address or a bracketed IPv6 address. Default: the loopback
    /// names [`LOOPBACK_NAMES`] at any port (the router does not know the port it is served
    /// on; `dockhand ui` lists them with its bound port). Checked by [`try_router`]
    /// ([`validate_allowed_host`]).
    pub allowed_hosts: Vec<String>,
    /// The Prometheus recorder `GET /metrics` renders ([`crate::prometheus::install`]),
    /// behind the same `Host` check and authentication as the pages; `None` (the default):
    /// `/metrics` is 404. `dockhand ui` sets it and refreshes the database gauges
    /// ([`crate::prometheus::spawn_gauges`]); a host application that mounts the router
    /// starts the gauges itself if it wants them.
    pub metrics: Option<crate::prometheus::MetricsHandle>,
}

impl Default for UiConfig {
    fn default() -> Self {
        Self {
            base_path: "/".into(),
            access: Access::ReadOnly,
            basic_auth: None,
            read_only_auth: None,
            csrf_key: None,
            count_cap: 100_000,
            cache_ttl: Duration::from_secs(5),
            page_size: 50,
            bulk_chunk: 500,
            bulk_pause: Duration::from_millis(50),
            query_timeout: Duration::from_secs(10),
            jobs: None,
            clock: Arc::new(SystemClock),
            host_check: HostCheck::WithoutCredentials,
            allowed_hosts: LOOPBACK_NAMES.iter().map(|n| n.to_string()).collect(),
            metrics: None,
        }
    }
}

impl std::fmt::Debug for UiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = |c: &Option<(String, String)>| c.as_ref().map(|(u, _)| format!("{u}:***"));
        f.debug_struct("UiConfig")
            .field("base_path", &self.base_path)
            .field("access", &self.access)
            .field("basic_auth", &user(&self.basic_auth))
            .field("read_only_auth", &user(&self.read_only_auth))
            .field("csrf_key", &self.csrf_key.map(|_| "***"))
            .field("count_cap", &self.count_cap)
            .field("cache_ttl", &self.cache_ttl)
            .field("page_size", &self.page_size)
            .field("bulk_chunk", &self.bulk_chunk)
            .field("bulk_pause", &self.bulk_pause)
            .field("query_timeout", &self.query_timeout)
            .field("jobs", &self.jobs.is_some())
            .field("clock", &self.clock)
            .field("host_check", &self.host_check)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl UiConfig {
    /// The base path without a trailing slash (empty for `/`), checked by
    /// [`validate_base_path`].
    pub(crate) fn base(&self) -> crate::Result<String> {
        validate_base_path(&self.base_path)
    }
}

/// Checks a base path (`dockhand ui --base-path`, [`UiConfig::base_path`]) and gives it
/// without its trailing slash (`""` for `/`). It must be `/`, or `/` followed by segments
/// joined by `/` (one trailing `/` is dropped), each segment non-empty, neither `.` nor
/// `..`, and made of letters, digits, `-`, `_`, `.` and `~` only: every link, form and script
/// URL starts with it, so `//evil.example` would point them all at another host, and a dot
/// segment would be resolved away by the browser.
///
/// ```
/// use dockhand::ui::validate_base_path;
/// assert_eq!(validate_base_path("/queue/").ok().as_deref(), Some("/queue"));
/// assert_eq!(validate_base_path("/").ok().as_deref(), Some(""));
/// assert!(validate_base_path("//evil.example").is_err());
/// ```
pub fn validate_base_path(path: &str) -> crate::Result<String> {
    check_base_path(path).map_err(|m| crate::Error::invalid("base_path", m))
}

/// [`validate_base_path`] with the reason as text (the CLI's argument parser names the flag
/// and the value itself).
pub(crate) fn check_base_path(path: &str) -> Result<String, String> {
    let shown = path.escape_debug();
    if path == "/" {
        return Ok(String::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!("`{shown}` must start with `/` (e.g. /queue)"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err(format!(
                "`{shown}` has an empty segment (`//`); links would leave the dashboard's host"
            ));
        }
        if segment == "." || segment == ".." {
            return Err(format!("`{shown}` has a `{segment}` segment"));
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
        {
            return Err(format!(
                "`{shown}` may hold only letters, digits and / - _ . ~"
            ));
        }
    }
    Ok(format!("/{rest}"))
}
