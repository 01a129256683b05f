//! `dockhand ui`: serve the operator dashboard ([`crate::ui::router`], `ui` feature) until
//! Ctrl-C or SIGTERM. The arguments exist with and without the feature, so the command line
//! is the same; without it the command fails saying how to rebuild.
//!
//! It does not migrate (index builds on big tables are the operator's call: `dockhand
//! migrate`). It refuses to listen on a non-loopback address without credentials, and warns
//! that basic auth over plain HTTP needs a TLS proxy in front. Without credentials it answers
//! only to the loopback names and its bound address with its port, and to `--allowed-host`
//! names (DNS rebinding; [`crate::ui::HostCheck`]). `--base-path` and `--allowed-host` are
//! checked when the command line is read.

use super::output::{CliError, Output};
use clap::Args;
use std::net::SocketAddr;

/// A `USER:PASSWORD` pair from the command line or the environment. `Debug` hides the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct UserPass {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for UserPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserPass({}:***)", self.user)
    }
}

/// Parses `USER:PASSWORD` (the password may hold colons; neither part may be empty).
pub fn parse_user_pass(text: &str) -> Result<UserPass, String> {
    match text.split_once(':') {
        Some((u, p)) if !u.is_empty() && !p.is_empty() => Ok(UserPass {
            user: u.to_string(),
            password: p.to_string(),
        }),
        _ => Err("expected USER:PASSWORD, both parts non-empty".into()),
    }
}

/// Checks `--base-path` ([`crate::ui::validate_base_path`] with the `ui` feature).
fn parse_base_path(text: &str) -> Result<String, String> {
    #[cfg(feature = "ui")]
    crate::ui::check_base_path(text)?;
    Ok(text.to_string())
}

/// Checks an `--allowed-host` (`NAME` or `NAME:PORT`; [`crate::ui::validate_allowed_host`]
/// with the `ui` feature).
fn parse_allowed_host(text: &str) -> Result<String, String> {
    #[cfg(feature = "ui")]
    crate::ui::validate_allowed_host(text)?;
    Ok(text.to_string())
}

/// Options of `dockhand ui`.
#[derive(Debug, Args)]
pub struct UiArgs {
    /// Address to listen on. Anything but a loopback address needs --auth or --read-only-auth.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,
    /// Nobody may act, whatever their credentials: no buttons are shown and every POST gets
    /// 403.
    #[arg(long)]
    pub read_only: bool,
    /// Serve the pages under this path, e.g. /queue (behind a proxy that keeps the prefix):
    /// `/` and segments of letters, digits, - _ . ~ (no empty, `.` or `..` segment).
    #[arg(long, value_name = "PATH", default_value = "/", value_parser = parse_base_path)]
    pub base_path: String,
    #[allow(rustdoc::broken_intra_doc_links)] // `[::1]` is --help text, not a link
    /// Also answer to this Host name, for a deliberate reverse-proxy setup: NAME (any port) or
    /// NAME:PORT. Repeatable. Without credentials the dashboard answers only to localhost,
    /// 127.0.0.1, [::1] and the bound address, with the bound port, and refuses any other
    /// Host with 421 (DNS rebinding: a web page whose name is pointed at this address would
    /// otherwise reach it); giving this flag checks Host with credentials too.
    #[arg(long = "allowed-host", value_name = "NAME[:PORT]", value_parser = parse_allowed_host)]
    pub allowed_hosts: Vec<String>,
    /// Operator credentials for HTTP basic auth (full access). Without any credentials,
    /// everyone who reaches the loopback address under an allowed Host name is an operator.
    #[arg(long, value_name = "USER:PASS", env = "DOCKHAND_UI_AUTH", hide_env_values = true,
          value_parser = parse_user_pass)]
    pub auth: Option<UserPass>,
    /// Read-only credentials for HTTP basic auth (look, never act).
    #[arg(long, value_name = "USER:PASS", env = "DOCKHAND_UI_READONLY_AUTH",
          hide_env_values = true, value_parser = parse_user_pass)]
    pub read_only_auth: Option<UserPass>,
}

impl UiArgs {
    /// Whether any credentials were given.
    pub fn has_auth(&self) -> bool {
        self.auth.is_some() || self.read_only_auth.is_some()
    }

    /// The start checks: an address other than loopback needs credentials.
    pub fn check(&self) -> Result<(), CliError> {
        if !self.bind.ip().is_loopback() && !self.has_auth() {
            return Err(CliError::Failed(format!(
                "refusing to serve the dashboard on {} without credentials: anyone who can reach \
                 it could cancel and retry actions. Give --auth USER:PASS (and put a TLS proxy \
                 in front), or bind to 127.0.0.1",
                self.bind
            )));
        }
        Ok(())
    }

    /// The `Host` names the dashboard served on `bound` answers to: the loopback names and
    /// the bound address, each with the bound port, then the `--allowed-host` names.
    pub fn allowed_hosts(&self, bound: SocketAddr) -> Vec<String> {
        let port = bound.port();
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|n| format!("{n}:{port}"))
            .collect();
        if !bound.ip().is_unspecified() {
            let own = bound.to_string();
            if !names.contains(&own) {
                names.push(own);
            }
        }
        names.extend(self.allowed_hosts.iter().cloned());
        names
    }

    /// The dashboard configuration these options give, served on `bound` (the address the
    /// listener got): operators are the `--auth` user, or everyone when no credentials are
    /// given (loopback only, see [`UiArgs::check`]); `--read-only` caps everyone at
    /// read-only. `Host` is checked without credentials, or always once `--allowed-host` is
    /// given, against [`UiArgs::allowed_hosts`].
    #[cfg(feature = "ui")]
    pub fn config(&self, bound: SocketAddr) -> crate::ui::UiConfig {
        let pair = |c: &Option<UserPass>| c.as_ref().map(|c| (c.user.clone(), c.password.clone()));
        crate::ui::UiConfig {
            base_path: self.base_path.clone(),
            access: if self.read_only {
                crate::ui::Access::ReadOnly
            } else {
                crate::ui::Access::Operator
            },
            basic_auth: pair(&self.auth),
            read_only_auth: pair(&self.read_only_auth),
            host_check: if self.allowed_hosts.is_empty() {
                crate::ui::HostCheck::WithoutCredentials
            } else {
                crate::ui::HostCheck::Always
            },
            allowed_hosts: self.allowed_hosts(bound),
            ..crate::ui::UiConfig::default()
        }
    }
}

/// `dockhand ui`.
pub(crate) async fn run(url: &str, a: &UiArgs, out: Output) -> Result<(), CliError> {
    #[cfg(not(feature = "ui"))]
    {
        let _ = (url, a, out);
        Err(CliError::Failed(
            "built without the `ui` feature; rebuild with --features ui".into(),
        ))
    }
    #[cfg(feature = "ui")]
    {
        serve(url, a, out).await
    }
}

#[cfg(feature = "ui")]
async fn serve(url: &str, a: &UiArgs, out: Output) -> Result<(), CliError> {
    use std::sync::Arc;
    a.check()?;
    let base = crate::ui::validate_base_path(&a.base_path)?;
    let store = crate::store::connect(url).await?;
    let version = store.schema_version().await?;
    if version < crate::ui::SCHEMA_VERSION {
        store.close().await;
        return Err(CliError::Failed(format!(
            "the database schema is at migration {version}; the dashboard needs {} (its list \
             indexes, group pauses, batch re-runs and stops): run `dockhand migrate` first (on \
             PostgreSQL with large tables you may pre-create the indexes CONCURRENTLY, see \
             migrations/postgres/0005)",
            crate::ui::SCHEMA_VERSION
        )));
    }
    let listener = tokio::net::TcpListener::bind(a.bind).await?;
    let addr = listener.local_addr()?;
    let cfg = crate::ui::UiConfig {
        metrics: Some(crate::prometheus::install()?),
        ..a.config(addr)
    };
    let gauges = crate::prometheus::spawn_gauges(
        Arc::clone(&store),
        Arc::clone(&cfg.clock),
        crate::prometheus::DEFAULT_GAUGE_INTERVAL,
    );
    let access = cfg.access;
    let checks_host = match cfg.host_check {
        crate::ui::HostCheck::Always => true,
        crate::ui::HostCheck::WithoutCredentials => !a.has_auth(),
        crate::ui::HostCheck::Never => false,
    };
    let hosts = cfg.allowed_hosts.join(", ");
    let app = crate::ui::standalone_router(Arc::clone(&store), cfg)?;
    if a.has_auth() {
        eprintln!(
            "warning: basic auth over plain HTTP sends the password in the clear; serve the \
             dashboard behind a TLS proxy"
        );
    }
    // The overview is `{base}` itself (`/queue/` is outside the nested routes).
    let home = if base.is_empty() { "/" } else { base.as_str() };
    eprintln!(
        "dockhand dashboard on http://{addr}{home} (database {}; {} access{}); stop with \
         Ctrl-C or SIGTERM",
        crate::store::redact_url(url),
        if a.has_auth() {
            "per credentials"
        } else {
            access.as_str()
        },
        if checks_host {
            format!("; answers to Host {hosts}")
        } else {
            String::new()
        }
    );
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        if let Err(e) = stop_signal().await {
            eprintln!("cannot wait for a stop signal ({e}); stopping");
        }
    })
    .await;
    gauges.abort();
    store.close().await;
    served?;
    out.emit(&serde_json::json!({"stopped": true}), || {
        "dashboard stopped".into()
    })
}

/// Ctrl-C, or SIGTERM on Unix.
#[cfg(feature = "ui")]
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_pass_needs_both_parts_and_hides_the_password() {
        let up = parse_user_pass("a:b:c").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((up.user.as_str(), up.password.as_str()), ("a", "b:c"));
        assert_eq!(format!("{up:?}"), "UserPass(a:***)");
        for bad in ["", "a", "a:", ":b"] {
            assert!(parse_user_pass(bad).is_err(), "{bad}");
        }
    }

    #[cfg(not(feature = "ui"))]
    #[tokio::test]
    async fn without_the_feature_the_command_says_how_to_rebuild() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(["dockhand", "ui", "--read-only"])
            .unwrap_or_else(|e| panic!("{e}"));
        let e = crate::cli::run(cli).await.err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("built without the `ui` feature; rebuild with --features ui")
        );
    }
}
