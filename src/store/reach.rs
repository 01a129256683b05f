//! Reaching a database server before a pool is opened: [`probe`] makes one connection attempt,
//! bounded by a connect timeout, and turns the failures a person meets first (connection
//! refused, a host name that does not resolve, no answer) into one [`Error::Connect`] naming
//! `HOST:PORT`, at once, instead of the pool's 30 s wait ending in "pool timed out". Also the
//! mapping of URL parse errors to a `database_url` error that never shows a credential.

use crate::error::{Error, Result};
use crate::store::{redact_text, redact_url};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use std::str::FromStr;
use std::time::Duration;

/// The connect timeout [`crate::store::connect`] uses (`dockhand --connect-timeout` default).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection attempt to the PostgreSQL or MySQL server `url` names, closed at once; a
/// no-op for SQLite and other schemes (they fail later with their own message).
pub async fn probe(url: &str, timeout: Duration) -> Result<()> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let options = PgConnectOptions::from_str(url).map_err(|e| url_error(url, e))?;
        let target = format!("{}:{}", options.get_host(), options.get_port());
        attempt(&options, &target, options.get_host(), timeout).await
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        let options = MySqlConnectOptions::from_str(url).map_err(|e| url_error(url, e))?;
        if options.get_database().map_or(true, str::is_empty) {
            return Ok(()); // `MySqlStore::connect` says the URL names no database
        }
        let target = format!("{}:{}", options.get_host(), options.get_port());
        attempt(&options, &target, options.get_host(), timeout).await
    } else {
        Ok(())
    }
}

async fn attempt<O>(options: &O, target: &str, host: &str, timeout: Duration) -> Result<()>
where
    O: ConnectOptions,
    O::Connection: Sized,
{
    match tokio::time::timeout(timeout, options.connect()).await {
        Err(_) => Err(Error::Connect {
            target: target.to_string(),
            reason: format!(
                "no answer from {target} within {}s (raise --connect-timeout if the server is \
                 slow)",
                timeout.as_secs_f64()
            ),
        }),
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(connect_error(e, target, host)),
    }
}

/// A failed connection attempt to `target` (`HOST:PORT`) as an [`Error::Connect`] when it is
/// one a person can act on (refused, unresolvable host, unreachable network), else the driver
/// error as [`Error::Database`] `connect`.
pub(crate) fn connect_error(e: sqlx::Error, target: &str, host: &str) -> Error {
    use std::io::ErrorKind;
    if let sqlx::Error::Io(io) = &e {
        let reason = match io.kind() {
            ErrorKind::ConnectionRefused => {
                return Error::Connect {
                    target: target.to_string(),
                    reason: format!("connection to {target} refused (is the server running?)"),
                }
            }
            _ if host.parse::<std::net::IpAddr>().is_err()
                && (io.to_string().contains("lookup") || io.to_string().contains("resolve")) =>
            {
                format!("host {host} did not resolve (connecting to {target})")
            }
            // sqlx hands rustls's handshake failures (an untrusted issuer, a name mismatch) up
            // as I/O errors.
            _ if looks_like_tls(&io.to_string()) => tls_failed(target, &io.to_string()),
            _ => format!("connecting to {target}: {}", redact_text(&io.to_string())),
        };
        return Error::Connect {
            target: target.to_string(),
            reason,
        };
    }
    if let sqlx::Error::Tls(tls) = &e {
        return Error::Connect {
            target: target.to_string(),
            reason: tls_failed(target, &tls.to_string()),
        };
    }
    Error::db("connect")(e)
}

fn looks_like_tls(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["certificate", "tls", "handshake", "ssl"]
        .iter()
        .any(|w| m.contains(w))
}

fn tls_failed(target: &str, message: &str) -> String {
    format!(
        "TLS to {target} failed: {} (the URL's sslmode/sslrootcert for PostgreSQL, \
         ssl-mode/ssl-ca for MySQL, choose the mode and the CA to trust)",
        redact_text(message)
    )
}

/// A URL the driver could not parse, as an `invalid database_url` error: the URL redacted, and
/// the driver's message without sqlx's `error with configuration:` prefix (the
/// `database_url` field already says it is about configuration) and redacted too.
pub(crate) fn url_error(url: &str, e: sqlx::Error) -> Error {
    let message = match &e {
        sqlx::Error::Configuration(inner) => inner.to_string(),
        other => other.to_string(),
    };
    Error::invalid(
        "database_url",
        format!("`{}`: {}", redact_url(url), redact_text(&message)),
    )
}
