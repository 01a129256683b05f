//! The `Host` check against DNS rebinding (issue 18).
//!
//! A dashboard that grants access by where a request comes from (loopback without
//! credentials, or a host's auth layer that trusts the network) is open to any web page the
//! operator visits: the page's own name is re-pointed at 127.0.0.1, and the browser then sends
//! the page's requests, same-origin to it, to the dashboard. Those requests carry the
//! attacker's name in `Host` (and in `Origin`, so comparing the two proves nothing). So the
//! dashboard answers only to the names it is known by: [`HostRule`] holds them, [`check`] is
//! the outermost layer after the security headers and refuses every other `Host` with
//! `421 Misdirected Request` before any handler, authentication or cookie runs.
//!
//! 421 rather than 403: the request reached a server that does not answer for that authority
//! (RFC 9110 §15.5.20); no credential or permission would make it succeed, and a 403 would
//! read as "you may not" on a resource that, under that name, is not served at all.
//!
//! Names are written `NAME` (that name at any port) or `NAME:PORT` (that port only; a `Host`
//! without a port is port 80). `NAME` is a DNS name (letters, digits, `-`, `_`, `.`), an IPv4
//! address or a bracketed IPv6 address; IP addresses compare as addresses, names without
//! regard to case.

use super::router::AppState;
use super::HostCheck;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, Ipv6Addr};

/// The loopback names the dashboard always answers to when it checks `Host`.
pub const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The host part of a `Host` value or of an allowed name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    /// An IPv4 or (bracketed) IPv6 address.
    Ip(IpAddr),
    /// A DNS name, lower-cased.
    Dns(String),
}

/// One name the dashboard answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllowedHost {
    name: Name,
    /// `None`: any port.
    port: Option<u16>,
}

/// Splits `NAME[:PORT]` into its parts; `None` when it is neither.
fn split(text: &str) -> Option<(Name, Option<u16>)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = inside.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (Name::Ip(IpAddr::V6(ip)), port)
    } else {
        let (host, port) = match text.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        let name = match host.parse::<IpAddr>() {
            Ok(ip @ IpAddr::V4(_)) => Name::Ip(ip),
            // A bare IPv6 address has colons, so it never gets here whole; anything else that
            // parses as one is not a host name either.
            Ok(IpAddr::V6(_)) => return None,
            Err(_) => {
                let ok = !host.is_empty()
                    && !host.starts_with(['.', '-'])
                    && !host.contains("..")
                    && host
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
                if !ok {
                    return None;
                }
                Name::Dns(host.to_ascii_lowercase())
            }
        };
        (name, port)
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok()?)
        }
        Some(_) => return None,
    };
    Some((host, port))
}

impl AllowedHost {
    /// Parses `NAME` or `NAME:PORT`; the error says what is accepted.
    pub(crate) fn parse(text: &str) -> Result<AllowedHost, String> {
        match split(text.trim()) {
            Some((name, port)) => Ok(AllowedHost { name, port }),
            None => Err(format!(
                "`{text}` is not NAME or NAME:PORT (a host name, an IPv4 address or a bracketed \
                 IPv6 address, optionally with a port: queue.example.com, 10.0.0.5:8080, \
                 [::1]:8080)"
            )),
        }
    }

    /// `NAME` or `NAME:PORT` for messages.
    fn shown(&self) -> String {
        let name = match &self.name {
            Name::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            Name::Ip(ip) => ip.to_string(),
            Name::Dns(n) => n.clone(),
        };
        match self.port {
            Some(p) => format!("{name}:{p}"),
            None => name,
        }
    }

    fn matches(&self, name: &Name, port: Option<u16>) -> bool {
        self.name == *name && self.port.map_or(true, |p| p == port.unwrap_or(80))
    }
}

/// Checks `text` as an allowed-host entry (`NAME` or `NAME:PORT`), for `dockhand ui
/// --allowed-host` and [`super::UiConfig::allowed_hosts`]; the error says what is accepted.
pub fn validate_allowed_host(text: &str) -> Result<(), String> {
    AllowedHost::parse(text).map(|_| ())
}

/// The `Host` rule of one router: the names it answers to, or none when it does not check.
#[derive(Debug, Clone)]
pub(crate) struct HostRule {
    allowed: Vec<AllowedHost>,
}

impl HostRule {
    /// The rule `check` and `allowed` configure for a router whose basic-auth credentials are
    /// `has_credentials`: `None` when `Host` is not checked.
    pub(crate) fn new(
        check: HostCheck,
        allowed: &[String],
        has_credentials: bool,
    ) -> crate::Result<Option<HostRule>> {
        let allowed = allowed
            .iter()
            .map(|a| AllowedHost::parse(a).map_err(|e| crate::Error::invalid("allowed_hosts", e)))
            .collect::<crate::Result<Vec<_>>>()?;
        let on = match check {
            HostCheck::WithoutCredentials => !has_credentials,
            HostCheck::Always => true,
            HostCheck::Never => false,
        };
        Ok(on.then_some(HostRule { allowed }))
    }

    /// Whether a `Host` value (or an HTTP/2 `:authority`) names this dashboard.
    pub(crate) fn allows(&self, host: &str) -> bool {
        match split(host) {
            Some((name, port)) => self.allowed.iter().any(|a| a.matches(&name, port)),
            None => false,
        }
    }

    /// The allowed names, for the refusal.
    fn shown(&self) -> String {
        let names: Vec<String> = self.allowed.iter().map(AllowedHost::shown).collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

/// Refuses, with 421 and one line, a request whose `Host` (every `Host` header, and the
/// authority of an absolute or HTTP/2 request target) is not an allowed name. Runs before
/// anything else, so a refused request changes nothing and gets no cookie.
pub(crate) async fn check(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(rule) = st.host_rule.as_deref() else {
        return next.run(req).await;
    };
    let mut names: Vec<String> = req
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|v| v.to_str().unwrap_or("(not text)").to_string())
        .collect();
    if let Some(authority) = req.uri().authority() {
        names.push(authority.as_str().to_string());
    }
    let refused = if names.is_empty() {
        Some("(none)".to_string())
    } else {
        names.into_iter().find(|n| !rule.allows(n))
    };
    match refused {
        None => next.run(req).await,
        Some(host) => misdirected(&host, rule),
    }
}

fn misdirected(host: &str, rule: &HostRule) -> Response {
    // The name is shown as the request sent it, cut short; a text/plain body with `nosniff`
    // is never rendered as markup.
    let host: String = host.chars().take(100).collect();
    let line = format!(
        "421 Misdirected Request: this dashboard does not answer to Host `{host}` (DNS \
         rebinding protection); it answers to {} (add a name with `dockhand ui \
         --allowed-host` or UiConfig::allowed_hosts)\n",
        rule.shown()
    );
    (
        StatusCode::MISDIRECTED_REQUEST,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        line,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(allowed: &[&str]) -> HostRule {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        HostRule::new(HostCheck::Always, &allowed, false)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("checked"))
    }

    #[test]
    fn loopback_names_with_the_port_pass_and_everything_else_is_refused() {
        let r = rule(&["localhost:8080", "127.0.0.1:8080", "[::1]:8080"]);
        for ok in [
            "localhost:8080",
            "LocalHost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[0:0:0:0:0:0:0:1]:8080",
        ] {
            assert!(r.allows(ok), "{ok}");
        }
        for bad in [
            "rebind.attacker.example:8080",
            "localhost:8081",
            "localhost",
            "localhost.:8080",
            "sub.localhost:8080",
            "127.0.0.2:8080",
            "[::2]:8080",
            "::1:8080",
            "localhost:8080:8080",
            "localhost:",
            "localhost:+80",
            "[::1]8080",
            "",
            "localhost@evil:8080",
            "(not text)",
        ] {
            assert!(!r.allows(bad), "{bad}");
        }
    }

    #[test]
    fn a_name_without_a_port_allows_any_port_and_port_80_is_the_default() {
        let r = rule(&["queue.example.com", "localhost:80"]);
        assert!(r.allows("queue.example.com"));
        assert!(r.allows("Queue.Example.com:8443"));
        assert!(r.allows("localhost"));
        assert!(r.allows("localhost:80"));
        assert!(!r.allows("localhost:8080"));
        assert!(!r.allows("evil.queue.example.com"));
    }

    #[test]
    fn entries_are_names_or_names_with_ports() {
        for ok in [
            "queue.example.com",
            "ops_box:8443",
            "10.0.0.5:8080",
            "[::1]",
            "[fe80::1]:80",
        ] {
            assert!(AllowedHost::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "*",
            "http://queue.example.com",
            "queue.example.com/x",
            "queue.example.com:",
            "queue.example.com:99999",
            "::1",
            "[::1",
            "a..b",
            ".example.com",
            "user@host",
            "a b",
        ] {
            let e = AllowedHost::parse(bad).err().unwrap_or_default();
            assert!(e.contains("NAME or NAME:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_mode_decides_whether_host_is_checked() {
        let names = vec!["localhost".to_string()];
        let on = |c, creds| {
            HostRule::new(c, &names, creds)
                .unwrap_or_else(|e| panic!("{e}"))
                .is_some()
        };
        assert!(on(HostCheck::WithoutCredentials, false));
        assert!(!on(HostCheck::WithoutCredentials, true));
        assert!(on(HostCheck::Always, true));
        assert!(!on(HostCheck::Never, false));
        let bad = vec!["http://x".to_string()];
        let e = HostRule::new(HostCheck::Never, &bad, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("allowed_hosts") && e.contains("http://x"), "{e}");
    }
}
