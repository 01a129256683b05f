//! The static files, compiled in: the vendored htmx (npm `htmx.org@2.0.11`,
//! `dist/htmx.min.js`, 0BSD, its LICENSE alongside) and the dashboard's own app.css, app.js
//! and favicon.svg.
//! htmx's path names its version and the app files' path names the crate's, so all of them are
//! served `immutable` for a year.

use super::router::AppState;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// `dist/htmx.min.js` of npm `htmx.org@2.0.11` (52,182 bytes).
pub(crate) const HTMX: &[u8] = include_bytes!("assets/htmx-2.0.11.min.js");
/// htmx's LICENSE (Zero-Clause BSD).
pub(crate) const HTMX_LICENSE: &[u8] = include_bytes!("assets/htmx-LICENSE.txt");
/// The dashboard's stylesheet (light and dark themes).
pub(crate) const APP_CSS: &[u8] = include_bytes!("assets/app.css");
/// The dashboard's icon.
pub(crate) const FAVICON: &[u8] = include_bytes!("assets/favicon.svg");
/// The dashboard's script (theme and timezone toggles, keyboard shortcuts).
pub(crate) const APP_JS: &[u8] = include_bytes!("assets/app.js");

/// Where htmx is served, under the base path.
pub(crate) const HTMX_PATH: &str = "/assets/htmx-2.0.11.min.js";
/// Where htmx's license is served.
pub(crate) const HTMX_LICENSE_PATH: &str = "/assets/htmx-LICENSE.txt";

/// Where app.css is served (the crate version in the path busts caches on upgrade).
pub(crate) fn app_css_path() -> String {
    format!("/assets/{}/app.css", env!("CARGO_PKG_VERSION"))
}

/// Where the icon is served.
pub(crate) fn favicon_path() -> String {
    format!("/assets/{}/favicon.svg", env!("CARGO_PKG_VERSION"))
}

/// Where app.js is served.
pub(crate) fn app_js_path() -> String {
    format!("/assets/{}/app.js", env!("CARGO_PKG_VERSION"))
}

const IMMUTABLE: &str = "public, max-age=31536000, immutable";

fn serve(bytes: &'static [u8], content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, IMMUTABLE),
        ],
        bytes,
    )
        .into_response()
}

/// The asset routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            HTMX_PATH,
            get(|| async { serve(HTMX, "text/javascript; charset=utf-8") }),
        )
        .route(
            HTMX_LICENSE_PATH,
            get(|| async { serve(HTMX_LICENSE, "text/plain; charset=utf-8") }),
        )
        .route(
            &app_css_path(),
            get(|| async { serve(APP_CSS, "text/css; charset=utf-8") }),
        )
        .route(
            &favicon_path(),
            get(|| async { serve(FAVICON, "image/svg+xml") }),
        )
        .route(
            &app_js_path(),
            get(|| async { serve(APP_JS, "text/javascript; charset=utf-8") }),
        )
}
