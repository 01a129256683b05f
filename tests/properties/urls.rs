//! Database URLs (§5 row 6): random strings into the URL handling never panic; a password —
//! in the user-info part or in a `password=` query parameter — never shows in the redacted
//! form or in the Display/Debug of an error about the URL.
//!
//! Malformed shapes (a missing slash, no scheme, a typo, a `key=value` string, other
//! credential keys) are redacted too, in the URL and in free text quoting it.
//!
//! Only URLs that fail before any connection attempt are opened (unsupported schemes, invalid
//! ports, a MySQL URL without a database): no network, no waiting.

use crate::support::{check, tokio_rt};
use dockhand::store::mysql::MySqlStore;
use dockhand::store::{redact_text, redact_url};
use proptest::prelude::*;

/// Passwords start with `Pw9`, which no other generated part can contain (they are lowercase
/// or digits), so finding the password anywhere in the output means it leaked.
fn password() -> impl Strategy<Value = String> {
    "Pw9[A-Za-z0-9:@/?#%!$&'()*+,;=._~-]{0,16}"
}

fn lower() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{0,10}"
}

/// A URL (for `scheme`) carrying `password` in the user-info or in the query, with an optional
/// port (maybe invalid), path and other query parameters.
fn url_with_password(scheme: BoxedStrategy<String>) -> impl Strategy<Value = (String, String)> {
    (
        scheme,
        lower(),
        password(),
        "[a-z0-9.-]{1,10}",
        prop_oneof![
            Just(String::new()),
            (0u32..70000).prop_map(|p| format!(":{p}")),
            "[a-z]{1,5}".prop_map(|p| format!(":{p}")),
        ],
        prop::option::of(lower()),
        prop::collection::vec((lower(), lower()), 0..3),
        any::<bool>(),
    )
        .prop_map(|(scheme, user, pw, host, port, db, params, in_query)| {
            let mut query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let userinfo = if in_query {
                query.insert(query.len() / 2, format!("password={pw}"));
                if user.is_empty() {
                    String::new()
                } else {
                    format!("{user}@")
                }
            } else {
                format!("{user}:{pw}@")
            };
            let mut url = format!("{scheme}://{userinfo}{host}{port}");
            if let Some(db) = db {
                url.push('/');
                url.push_str(&db);
            }
            if !query.is_empty() {
                url.push('?');
                url.push_str(&query.join("&"));
            }
            (url, pw)
        })
}

fn any_scheme() -> BoxedStrategy<String> {
    prop_oneof![
        Just("postgres".to_string()),
        Just("postgresql".to_string()),
        Just("mysql".to_string()),
        Just("mariadb".to_string()),
        "[a-z][a-z0-9+.-]{0,8}",
    ]
    .boxed()
}

/// The password must not appear, not even percent-decoded.
fn leaks(text: &str, pw: &str) -> bool {
    text.contains(pw) || text.contains("Pw9")
}

#[test]
fn redaction_hides_every_password() {
    check(4000, url_with_password(any_scheme()), |(url, pw)| {
        let shown = redact_url(&url);
        prop_assert!(!leaks(&shown, &pw), "`{url}` redacted to `{shown}`");
        Ok(())
    });
}

#[test]
fn redaction_never_panics_and_keeps_password_free_urls() {
    check(4000, prop_oneof!["\\PC{0,60}", ".{0,60}"], |s| {
        let shown = redact_url(&s);
        let _ = redact_text(&s);
        if !s.contains('@') && !s.contains('=') {
            prop_assert_eq!(shown, s);
        }
        Ok(())
    });
}

/// A URL in a broken shape a person might type: a missing or extra slash, no scheme, a typo in
/// the scheme, a libpq `key=value` string, another credential key.
fn malformed_url_with_password() -> impl Strategy<Value = (String, String)> {
    let scheme = prop_oneof![
        Just("postgres".to_string()),
        Just("mysql".to_string()),
        Just("mariadb".to_string()),
        Just("sqlite".to_string()),
        Just("postgre".to_string()),
        Just("myslq".to_string()),
        "[a-z]{1,8}",
    ];
    let separator = prop_oneof![
        Just(":/"),
        Just(":"),
        Just("//"),
        Just(":///"),
        Just("/"),
        Just(""),
    ];
    let key = prop_oneof![
        Just("password"),
        Just("PASSWORD"),
        Just("pwd"),
        Just("passwd"),
        Just("pass%77ord"),
    ];
    let dsn_password = "Pw9[A-Za-z0-9:@/?!$()*+,._~-]{0,16}";
    prop_oneof![
        (scheme, separator, lower(), password(), "[a-z0-9.-]{1,10}").prop_map(
            |(scheme, sep, user, pw, host)| (format!("{scheme}{sep}{user}:{pw}@{host}/db"), pw)
        ),
        (lower(), password(), "[a-z0-9.-]{1,10}")
            .prop_map(|(user, pw, host)| (format!("{user}:{pw}@{host}/db"), pw)),
        (lower(), key.clone(), dsn_password, any::<bool>()).prop_map(|(user, key, pw, quoted)| {
            let value = if quoted {
                format!("'{pw}'")
            } else {
                pw.clone()
            };
            (format!("host=h user={user} {key}={value} dbname=d"), pw)
        }),
        ("[a-z]{1,8}", key, password()).prop_map(|(scheme, key, pw)| {
            let pw = pw.replace(['&', '#', ';'], "x");
            (format!("{scheme}:/h/db?sslmode=require&{key}={pw}"), pw)
        }),
    ]
}

#[test]
fn redaction_hides_passwords_in_malformed_urls() {
    check(4000, malformed_url_with_password(), |(url, pw)| {
        let shown = redact_url(&url);
        prop_assert!(!leaks(&shown, &pw), "`{url}` redacted to `{shown}`");
        let message = format!("invalid database_url: `{url}` is wrong");
        let shown = redact_text(&message);
        prop_assert!(!leaks(&shown, &pw), "`{message}` redacted to `{shown}`");
        Ok(())
    });
}

/// `store::connect` on malformed URLs (what `--database-url` and `DOCKHAND_DATABASE_URL` pass
/// on): an error, and no password in its Display or Debug.
#[test]
fn connect_errors_on_malformed_urls_never_show_the_password() {
    let rt = tokio_rt();
    let urls = malformed_url_with_password().prop_filter("fails before connecting", |(u, _)| {
        // Well-formed network URLs would try to connect; `sqlite:` ones would create a file.
        !u.starts_with("postgres://")
            && !u.starts_with("mysql://")
            && !u.starts_with("mariadb://")
            && !u.starts_with("sqlite:")
    });
    check(1500, urls, |(url, pw)| {
        match rt.block_on(dockhand::connect(&url)) {
            Err(e) => {
                let (display, debug) = (e.to_string(), format!("{e:?}"));
                prop_assert!(!leaks(&display, &pw), "`{url}` → {display}");
                prop_assert!(!leaks(&debug, &pw), "`{url}` → {debug}");
            }
            Ok(_) => prop_assert!(false, "`{url}` connected"),
        }
        Ok(())
    });
}

/// `store::connect` on URLs that fail before connecting: an unsupported scheme, an invalid
/// port, a MySQL URL without a database. A typed `database_url` error, no password in it.
#[test]
fn connect_errors_never_show_the_password() {
    let rt = tokio_rt();
    let unsupported = "[a-z]{1,8}".prop_filter("unsupported", |s| {
        !["postgres", "postgresql", "mysql", "mariadb", "sqlite"].contains(&s.as_str())
    });
    let urls = prop_oneof![
        url_with_password(unsupported.boxed()),
        // Invalid ports (letters, or a number too large for u16) on a known scheme.
        (
            any_scheme(),
            lower(),
            password(),
            "[a-z]{1,4}|[7-9][0-9]{4}",
            any::<bool>()
        )
            .prop_map(|(scheme, u, pw, port, in_query)| {
                let url = if in_query {
                    format!("{scheme}://{u}@h:{port}/db?password={pw}")
                } else {
                    format!("{scheme}://{u}:{pw}@h:{port}/db")
                };
                (url, pw)
            }),
        (lower(), password(), "[a-z0-9.-]{1,10}")
            .prop_map(|(u, pw, h)| (format!("mysql://{u}:{pw}@{h}"), pw)),
    ];
    check(1500, urls, |(url, pw)| {
        if let Err(e) = rt.block_on(dockhand::connect(&url)) {
            let (display, debug) = (e.to_string(), format!("{e:?}"));
            prop_assert!(!leaks(&display, &pw), "`{url}` → {display}");
            prop_assert!(!leaks(&debug, &pw), "`{url}` → {debug}");
        }
        Ok(())
    });
}

/// `MySqlStore::url_for_database` parses without connecting: any string, no panic, and an
/// error about a URL with a password does not contain it.
#[test]
fn mysql_url_parsing_never_panics_or_leaks() {
    let urls = prop_oneof![
        url_with_password(any_scheme()),
        ("\\PC{0,60}", Just("Pw9-absent".to_string())),
    ];
    check(3000, urls, |(url, pw)| {
        if let Err(e) = MySqlStore::url_for_database(&url, "db") {
            let (display, debug) = (e.to_string(), format!("{e:?}"));
            prop_assert!(!leaks(&display, &pw), "`{url}` → {display}");
            prop_assert!(!leaks(&debug, &pw), "`{url}` → {debug}");
        }
        Ok(())
    });
}
