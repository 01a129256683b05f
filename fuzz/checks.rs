//! The properties the fuzz targets check, shared with `tests/fuzz_regressions.rs`, which
//! replays every committed crash input in `fuzz/regressions/<target>/` under `cargo test`.
//! Each function panics when its property breaks.

use chrono::{DateTime, Utc};
use dockhand::action::{encode_args, parse_args};
use dockhand::jobs::packets::{encode, parse_ref, verify};
use dockhand::store::redact_url;
use dockhand::Recurrence;

/// `<expr>|<timezone>|<start seconds>`: parsing never panics or hangs; the next fire is
/// strictly later than the start.
pub fn cron(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, '|');
    let expr = parts.next().unwrap_or("");
    let tz = parts.next().unwrap_or("UTC");
    let start: i64 = parts
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1_700_000_000);
    let Some(after) = DateTime::<Utc>::from_timestamp(start.rem_euclid(8_000_000_000), 0) else {
        return;
    };
    if let Ok(r) = Recurrence::cron(expr, tz) {
        if let Ok(Some(next)) = r.first_after(after) {
            assert!(
                next > after,
                "next fire {next} not after {after} for `{expr}` in {tz}"
            );
        }
    }
}

/// Args JSON: decoding never panics; a decoded value either encodes for storage and decodes
/// back to itself, or is refused with an error naming `args` (NUL, depth, size limits).
pub fn args(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(value) = parse_args(text) {
        match encode_args(&value) {
            Ok(encoded) => {
                let back = parse_args(&encoded).expect("an encoded value parses");
                assert_eq!(back, value);
            }
            Err(e) => assert!(e.to_string().contains("args"), "error names args: {e}"),
        }
    }
}

/// `<ref>\n<body>`: hydration never panics; accepted only with a well-formed ref whose hash
/// the body matches.
pub fn packet(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (reference, body) = match text.split_once('\n') {
        Some((r, b)) => (r, Some(b.to_string())),
        None => (text, None),
    };
    if let Ok(value) = verify(reference, body) {
        assert!(parse_ref(reference).is_ok());
        let own = encode(&value).expect("a verified body re-encodes");
        assert!(verify(&own.reference, Some(own.body)).is_ok());
    }
}

/// Database URLs: redaction never panics and never shows the user-info password of a URL
/// (a valid scheme) with a single `@` in its authority.
pub fn url(data: &[u8]) {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    let shown = redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return;
    };
    // Only URLs: a scheme is a letter then letters, digits, `+`, `-`, `.` (the first fuzz
    // crash was a password-like string before a bogus scheme, which is not a URL's password).
    let mut chars = scheme.chars();
    let valid_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !valid_scheme {
        return;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.matches('@').count() != 1 {
        return;
    }
    if let Some((userinfo, _)) = authority.split_once('@') {
        if let Some((_, password)) = userinfo.split_once(':') {
            if password.len() >= 4 {
                assert!(
                    !shown.contains(&format!(":{password}@")),
                    "password shown in `{shown}`"
                );
            }
        }
    }
}
