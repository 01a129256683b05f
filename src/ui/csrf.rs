//! CSRF protection: a signed double-submit cookie (docs/dashboard_plan.md §3). It needs no
//! server session and works across replicas that share the key.
//!
//! - The cookie `dh_csrf` holds 32 random bytes (two v4 UUIDs), base64url, `HttpOnly;
//!   SameSite=Strict; Path=<base path>`, set on the first request that lacks it.
//! - The token is base64url(HMAC-SHA256(key, cookie ‖ 0 ‖ user)); pages put it in every form
//!   (`_csrf`) and in `hx-headers` on `<body>` (`X-CSRF-Token`).
//! - A POST is accepted only when the token verifies (constant time, `verify_slice`) for the
//!   request's cookie and user.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The cookie's name.
pub(crate) const COOKIE: &str = "dh_csrf";
/// The form field's name.
pub(crate) const FIELD: &str = "_csrf";
/// The header's name.
pub(crate) const HEADER: &str = "x-csrf-token";

/// 32 random bytes: the HMAC key of a router without a configured one.
pub(crate) fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}

/// A new cookie value.
pub(crate) fn new_cookie() -> String {
    URL_SAFE_NO_PAD.encode(random_key())
}

/// Whether a cookie value has the shape [`new_cookie`] gives (so a forged cookie of any
/// length or alphabet is replaced rather than signed).
pub(crate) fn well_formed(cookie: &str) -> bool {
    URL_SAFE_NO_PAD
        .decode(cookie)
        .is_ok_and(|bytes| bytes.len() == 32)
}

fn mac(key: &[u8; 32], cookie: &str, user: &str) -> Hmac<Sha256> {
    // `new_from_slice` accepts any key length for HMAC; 32 bytes never fails.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(cookie.as_bytes());
    m.update(&[0]);
    m.update(user.as_bytes());
    m
}

/// The token for this cookie and user.
pub(crate) fn token(key: &[u8; 32], cookie: &str, user: &str) -> String {
    URL_SAFE_NO_PAD.encode(mac(key, cookie, user).finalize().into_bytes())
}

/// Whether `given` is the token for this cookie and user (constant time).
pub(crate) fn verify(key: &[u8; 32], cookie: &str, user: &str, given: &str) -> bool {
    let Ok(bytes) = URL_SAFE_NO_PAD.decode(given.trim()) else {
        return false;
    };
    mac(key, cookie, user).verify_slice(&bytes).is_ok()
}

/// The `Set-Cookie` value for a new cookie under `path`.
pub(crate) fn set_cookie(value: &str, path: &str) -> String {
    format!("{COOKIE}={value}; Path={path}; HttpOnly; SameSite=Strict")
}

/// A cookie's value from a `Cookie` header.
pub(crate) fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_bind_key_cookie_and_user() {
        let key = random_key();
        let cookie = new_cookie();
        assert!(well_formed(&cookie));
        let t = token(&key, &cookie, "alice");
        assert!(verify(&key, &cookie, "alice", &t));
        assert!(!verify(&key, &cookie, "bob", &t));
        assert!(!verify(&key, &new_cookie(), "alice", &t));
        assert!(!verify(&random_key(), &cookie, "alice", &t));
        assert!(!verify(&key, &cookie, "alice", ""));
        assert!(!verify(&key, &cookie, "alice", "not base64 !"));
        assert!(!verify(&key, &cookie, "alice", &t[..t.len() - 2]));
        // The separator keeps (cookie, user) pairs apart.
        assert_ne!(token(&key, "ab", "c"), token(&key, "a", "bc"));
    }

    #[test]
    fn cookies_are_checked_and_found() {
        assert!(!well_formed("short"));
        assert!(!well_formed(&"A".repeat(43 * 2)));
        assert!(!well_formed("a;b"));
        assert_eq!(
            cookie_value("dh_theme=dark; dh_csrf=abc ; x=1", COOKIE),
            Some("abc")
        );
        assert_eq!(cookie_value("xdh_csrf=abc", COOKIE), None);
        assert_eq!(
            set_cookie("v", "/ui"),
            "dh_csrf=v; Path=/ui; HttpOnly; SameSite=Strict"
        );
    }
}
