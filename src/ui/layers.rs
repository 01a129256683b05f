//! The middleware every request passes, outermost first:
//! 1. [`security_headers`]: CSP, `nosniff`, `Referrer-Policy`, `Vary: HX-Request`, and
//!    `Cache-Control: no-store` on HTML, on every response, refusals included;
//! 2. `host::check`: the `Host` check against DNS rebinding (421, one plain line);
//! 3. [`authenticate`]: the [`Access`] and [`UiUser`] of the caller (a host's own layer may
//!    have set them; then they win), or 401 when credentials are configured and missing;
//! 4. [`guard`]: the CSRF cookie (set when missing) and, on every non-GET request, the checks:
//!    operator access, not cross-site, `Origin` host equals `Host`, a valid CSRF token;
//! 5. [`error_pages`]: any error response not rendered by the dashboard (axum's extractor
//!    rejections, 405) becomes the dashboard's error page.
//!
//! The refusals of 3 and 4 are the dashboard's error page too.

use super::pages::layout;
use super::router::{AppState, Ctx};
use super::{csrf, Access, UiUser};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The Content-Security-Policy of every response (`frame-ancestors` and `form-action` do not
/// fall back to `default-src`, so they are spelled out).
pub(crate) const CSP: &str =
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Largest form body read to find the CSRF field.
const MAX_FORM_BYTES: usize = 1024 * 1024;

/// Largest error body of axum's (a rejection's text) shown on the error page.
const MAX_ERROR_BYTES: usize = 4096;

/// The CSRF cookie in force for this request (the one sent, or the one being set).
#[derive(Debug, Clone)]
pub(crate) struct CsrfCookie(pub(crate) String);

/// Adds the security headers to every response.
pub(crate) async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.append(header::VARY, HeaderValue::from_static("HX-Request"));
    let html = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    if html || !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// Decides who the caller is. An [`Access`] extension already present (a host's auth layer)
/// wins; otherwise the configured basic-auth credentials decide, or, with none configured,
/// everyone gets the configured access.
pub(crate) async fn authenticate(
    State(st): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.extensions().get::<Access>().is_none() {
        if st.creds.required() {
            let header = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            match st.creds.check(header) {
                Some((user, access)) => {
                    req.extensions_mut().insert(access);
                    req.extensions_mut().insert(UiUser(user));
                }
                None => {
                    let ctx = Ctx::of(req.headers(), req.extensions(), &st);
                    return unauthorized(&ctx);
                }
            }
        } else {
            req.extensions_mut().insert(st.cfg.access);
        }
    }
    if req.extensions().get::<UiUser>().is_none() {
        let name = if st.creds.required() {
            "host"
        } else {
            "anonymous"
        };
        req.extensions_mut().insert(UiUser(name.into()));
    }
    next.run(req).await
}

fn unauthorized(ctx: &Ctx) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            "Basic realm=\"dockhand\", charset=\"UTF-8\"",
        )],
        layout::error_page(ctx, StatusCode::UNAUTHORIZED, "authentication required"),
    )
        .into_response()
}

fn forbidden(ctx: &Ctx, why: &'static str) -> Response {
    (
        StatusCode::FORBIDDEN,
        layout::error_page(ctx, StatusCode::FORBIDDEN, &format!("forbidden: {why}")),
    )
        .into_response()
}

fn header_str(h: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Sets the CSRF cookie when missing, and checks every request that may write.
pub(crate) async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let sent = header_str(req.headers(), header::COOKIE)
        .and_then(|c| csrf::cookie_value(c, csrf::COOKIE))
        .filter(|c| csrf::well_formed(c))
        .map(str::to_string);
    let fresh = sent.is_none();
    let cookie = sent.unwrap_or_else(csrf::new_cookie);
    let mut req = if matches!(*req.method(), Method::GET | Method::HEAD) {
        req
    } else {
        let ctx = Ctx::of(req.headers(), req.extensions(), &st);
        match check_write(&st, req, &cookie, fresh).await {
            Ok(req) => req,
            Err(why) => return forbidden(&ctx, why),
        }
    };
    req.extensions_mut().insert(CsrfCookie(cookie.clone()));
    let mut resp = next.run(req).await;
    if fresh {
        if let Ok(v) = HeaderValue::from_str(&csrf::set_cookie(&cookie, &st.cookie_path)) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

/// The checks of a request that may write; gives the request back (its body re-assembled
/// when it was read for the form field) or why it is forbidden.
async fn check_write(
    st: &AppState,
    req: Request,
    cookie: &str,
    fresh: bool,
) -> Result<Request, &'static str> {
    let access = req.extensions().get::<Access>().copied();
    if access != Some(Access::Operator) {
        return Err("read-only access");
    }
    let h = req.headers();
    let cross_site = h.get_all("sec-fetch-site").iter().any(|v| {
        v.to_str()
            .map_or(true, |s| s.eq_ignore_ascii_case("cross-site"))
    });
    if cross_site {
        return Err("cross-site request");
    }
    // A plain form POST from a page served with `Referrer-Policy: no-referrer` carries
    // `Origin: null` (Fetch, "serializing a request origin"); the token still has to match.
    let host = header_str(h, header::HOST).unwrap_or("");
    for origin in h.get_all(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("?");
        if origin == "null" {
            continue;
        }
        let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        if !origin_host.eq_ignore_ascii_case(host) {
            return Err("Origin does not match Host");
        }
    }
    if fresh {
        return Err("missing CSRF cookie; reload the page");
    }
    let user = req
        .extensions()
        .get::<UiUser>()
        .map(|u| u.0.clone())
        .unwrap_or_default();
    if let Some(token) = header_str(h, csrf::HEADER) {
        return if csrf::verify(&st.csrf_key, cookie, &user, token) {
            Ok(req)
        } else {
            Err("bad CSRF token")
        };
    }
    let form = header_str(h, header::CONTENT_TYPE)
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if !form {
        return Err("missing CSRF token");
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM_BYTES)
        .await
        .map_err(|_| "form body too large")?;
    let token = form_field(&bytes, csrf::FIELD);
    if !token.is_some_and(|t| csrf::verify(&st.csrf_key, cookie, &user, t)) {
        return Err("bad or missing CSRF token");
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Turns an error response the dashboard did not render (not HTML: axum's extractor
/// rejections such as a non-integer id in a typed path, a 405) into its error page, with the
/// same status and headers and the rejection's text as the message.
pub(crate) async fn error_pages(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let ctx = Ctx::of(req.headers(), req.extensions(), &st);
    let resp = next.run(req).await;
    let status = resp.status();
    let html = header_str(resp.headers(), header::CONTENT_TYPE)
        .is_some_and(|v| v.starts_with("text/html"));
    if html || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_ERROR_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let (page, body) = layout::error_page(&ctx, status, &message).into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &page.headers {
        parts.headers.insert(name, value.clone());
    }
    Response::from_parts(parts, body)
}

/// The raw value of a form field. The CSRF token is base64url, which form encoding leaves as
/// it is, so no percent-decoding is needed (a mangled token simply fails to verify).
fn form_field<'a>(body: &'a [u8], name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::form_field;

    #[test]
    fn form_fields_are_found_by_exact_name() {
        let body = b"x_csrf=no&_csrf=tok-en_1&ids=1&ids=2";
        assert_eq!(form_field(body, "_csrf"), Some("tok-en_1"));
        assert_eq!(form_field(b"a=1", "_csrf"), None);
        assert_eq!(form_field(b"\xff=1", "_csrf"), None);
    }
}
