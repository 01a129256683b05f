//! Credential redaction for messages and logs: [`redact_url`] hides anything in a database URL
//! that looks like a password, whatever the URL's shape, and [`redact_text`] does it word by
//! word in free text that may quote one.

/// The URL with anything that looks like a credential replaced by `***`, for messages and
/// logs, whatever the URL's shape (a missing slash, no scheme, a typo, a libpq key/value DSN):
///
/// - the user-info part before the last `@`: for `scheme://user:PASSWORD@host` and for a known
///   scheme with missing slashes (`postgres:/user:PASSWORD@host`) the user is kept; in any
///   other shape everything before the `@` is replaced, since there is no telling where the
///   user name ends;
/// - the value of any `password=`, `passwd=`, `pwd=` or `pass=` key anywhere (query
///   parameters and `key=value` strings; the key is compared percent-decoded, any case).
pub fn redact_url(url: &str) -> String {
    redact_key_values(&redact_userinfo(url))
}

/// [`redact_url`] on each word of a free text (an error message that may quote a URL or a
/// `key=value` string): words are split at whitespace and backticks, so the rest of the
/// message stays readable.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() || c == '`' {
            out.push_str(&redact_url(&word));
            word.clear();
            out.push(c);
        } else {
            word.push(c);
        }
    }
    out.push_str(&redact_url(&word));
    out
}

/// Schemes whose `scheme:` prefix is kept even when the slashes after it are wrong.
const KNOWN_SCHEMES: [&str; 5] = ["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

fn redact_userinfo(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_string();
    };
    let (before, host) = (&url[..at], &url[at..]);
    // The prefix kept as it is: `scheme://` (a well-formed scheme), or a known scheme with any
    // number of slashes.
    let scheme_end = match before.find("://") {
        Some(i) if is_scheme(&before[..i]) => Some(i + 3),
        _ => before.find(':').and_then(|i| {
            let scheme = &before[..i];
            KNOWN_SCHEMES
                .iter()
                .any(|k| k.eq_ignore_ascii_case(scheme))
                .then(|| {
                    i + 1 + before[i + 1..].len() - before[i + 1..].trim_start_matches('/').len()
                })
        }),
    };
    let well_formed = before.find("://").is_some_and(|i| is_scheme(&before[..i]));
    match scheme_end {
        Some(end) => {
            let (prefix, creds) = before.split_at(end);
            // `scheme:` with no slash at all (`postgres:A:B@h`) may as well be user `postgres`
            // with password `A:B`: nothing of it is kept.
            let slashed = prefix.ends_with('/');
            match creds.split_once(':') {
                Some((user, _)) if slashed && !user.contains(['/', '?', '#', '=', ' ']) => {
                    format!("{prefix}{user}:***{host}")
                }
                // A bare user name, but only where the shape says so: in `postgres:NAME@h`
                // NAME may be the password of a user taken for the scheme.
                None if well_formed => url.to_string(),
                _ => format!("{prefix}***{host}"),
            }
        }
        None => format!("***{host}"),
    }
}

/// RFC 3986 scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Replaces the value of every credential-looking `key=value` (keys after `?`, `&`, `;`,
/// whitespace or at the start) up to the next `&`, `;`, `#` or whitespace, or the closing quote
/// of a quoted value.
fn redact_key_values(url: &str) -> String {
    const KEYS: [&str; 4] = ["password", "passwd", "pwd", "pass"];
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    loop {
        // The next `key=` whose key starts at a separator.
        let Some(eq) = rest.find('=') else {
            out.push_str(rest);
            return out;
        };
        let key_start = rest[..eq]
            .rfind(|c: char| matches!(c, '?' | '&' | ';' | '/' | ',') || c.is_whitespace())
            .map_or(0, |i| {
                i + rest[i..].chars().next().map_or(1, char::len_utf8)
            });
        let key = percent_decode(rest[key_start..eq].trim());
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if !KEYS.iter().any(|k| k.eq_ignore_ascii_case(&key)) {
            continue;
        }
        let value_end = match rest.chars().next() {
            Some(q @ ('\'' | '"')) => rest[1..].find(q).map_or(rest.len(), |i| i + 2),
            _ => rest
                .find(|c: char| matches!(c, '&' | ';' | '#') || c.is_whitespace())
                .unwrap_or(rest.len()),
        };
        out.push_str("***");
        rest = &rest[value_end..];
    }
}

/// `%XX` and `+` decoding of a query key (invalid sequences are kept as they are).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{redact_text, redact_url};

    #[test]
    fn passwords_never_shown() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("sqlite:x.db"), "sqlite:x.db");
        assert_eq!(
            redact_url("mysql://root:pw@127.0.0.1:3306/test"),
            "mysql://root:***@127.0.0.1:3306/test"
        );
        assert_eq!(redact_url("mariadb://u:p@ss@h/db"), "mariadb://u:***@h/db");
        assert_eq!(redact_url("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=disable&password=pw#f"),
            "postgres://u@h/db?sslmode=disable&password=***#f"
        );
        assert_eq!(
            redact_url("postgres://h/db?pass%77ord=pw"),
            "postgres://h/db?pass%77ord=***"
        );
    }

    #[test]
    fn passwords_hidden_in_urls_of_any_shape() {
        assert_eq!(redact_url("postgres:/u:pw@h/db"), "postgres:/u:***@h/db");
        assert_eq!(redact_url("postgres:u:pw@h/db"), "postgres:***@h/db");
        assert_eq!(redact_url("postgre://u:pw@h/db"), "postgre://u:***@h/db");
        assert_eq!(redact_url("u:pw@h/db"), "***@h/db");
        assert_eq!(redact_url("//u:pw@h/db"), "***@h/db");
        assert_eq!(redact_url("myslq:/u:pw@h"), "***@h");
        assert_eq!(
            redact_url("host=h user=u password=pw dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(
            redact_url("host=h password='p w' x=1"),
            "host=h password=*** x=1"
        );
        assert_eq!(
            redact_url("mysql://h/db?PWD=pw;a=b"),
            "mysql://h/db?PWD=***;a=b"
        );
        assert_eq!(redact_url("sqlite:x.db?mode=ro"), "sqlite:x.db?mode=ro");
        assert_eq!(
            redact_text("invalid database_url: bad `u:pw@h` and password=pw there"),
            "invalid database_url: bad `***@h` and password=*** there"
        );
    }
}
