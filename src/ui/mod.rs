//! The operator dashboard (issue 8; `ui` feature): server-rendered HTML pages over a
//! [`DynStore`], for mounting in a host's axum application or serving with `dockhand ui`.
//!
//! ```no_run
//! # async fn demo(runtime: dockhand::Runtime) -> Result<(), Box<dyn std::error::Error>> {
//! use dockhand::store::postgres::PgStore;
//! use dockhand::ui::{router, Access, UiConfig};
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
//!         ..UiConfig::default()
//!     }),
//! );
//! # let _ = app; Ok(()) }
//! ```
//!
//! Module map:
//! - this module: [`UiConfig`], [`Access`], [`UiUser`] and [`router`];
//! - `router`: the routes, the shared `AppState`, the request context every page gets
//!   (`Ctx`: access, user, CSRF token, timezone, theme, `HX-Request`) and the POST handlers;
//! - `layers`: the middleware (security headers, authentication, read-only, CSRF);
//! - `auth`: HTTP basic credentials, compared in constant time on their SHA-256;
//! - `csrf`: the signed double-submit cookie (`dh_csrf`) and its token;
//! - `assets`: the vendored htmx 2.0.11 (0BSD, LICENSE alongside), app.css and app.js, all
//!   compiled in with `include_bytes!`;
//! - `pages`: one module per page (`overview`, `action`, `schedules`), the shared `layout`
//!   (navigation, time formatting, buttons) and `chart` (the inline SVG throughput chart).
//!
//! Security (docs/dashboard_plan.md §3): every response carries a strict
//! Content-Security-Policy (no inline script or style anywhere), `nosniff` and
//! `Referrer-Policy: no-referrer`; HTML is `no-store`. Every non-GET request needs
//! [`Access::Operator`] and a valid CSRF token, and is refused when the browser says it is
//! cross-site. Every operator POST writes one `tracing` event with target
//! [`crate::telemetry::UI_AUDIT_TARGET`].

mod assets;
mod auth;
mod cache;
mod csrf;
mod layers;
mod pages;
mod params;
mod router;

pub use router::{router, try_router};

/// The schema migration the dashboard's queries need (0005: one index per list order; 0006:
/// group pauses; 0007: the children's sidecars a batch re-run claims again); `dockhand ui`
/// refuses to serve an older database rather than scan it or fail page by page.
pub const SCHEMA_VERSION: i64 = 7;

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
            .finish()
    }
}

impl UiConfig {
    /// The base path without a trailing slash (empty for `/`), checked: it must start with `/`
    /// and hold no characters that need escaping in a URL or a cookie.
    pub(crate) fn base(&self) -> crate::Result<String> {
        let b = self.base_path.trim_end_matches('/');
        if !self.base_path.starts_with('/') {
            return Err(crate::Error::invalid("base_path", "must start with `/`"));
        }
        if !b
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/-_.~".contains(c))
        {
            return Err(crate::Error::invalid(
                "base_path",
                "may hold only letters, digits and / - _ . ~",
            ));
        }
        Ok(b.to_string())
    }
}
