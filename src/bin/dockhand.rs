//! The `dockhand` operator binary: parses the command line, sets up logging to stderr
//! (`RUST_LOG`, else [`dockhand::cli::Cli::default_log_filter`]), and runs
//! [`dockhand::cli::run`].
//!
//! Exit statuses (stable, listed in `dockhand --help` and the README): 0 success, 1 a runtime
//! error (printed as `error: <message>`), 2 a usage error (clap's). With `--json` both kinds of
//! error are one JSON object on stderr: `{"error": MESSAGE, "kind": KIND, "exit": STATUS}`.

use clap::error::ErrorKind;
use clap::Parser;
use dockhand::cli::{error_report, EXIT_USAGE};
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match dockhand::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let json = cli.json;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(cli.default_log_filter()));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match dockhand::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            eprintln!("{}", error_report(&e.to_string(), e.kind(), code, json));
            ExitCode::from(code)
        }
    }
}

/// `--help` and `--version` print as clap does (status 0); a usage error is clap's message and
/// status 2, or with `--json` anywhere on the command line a JSON object with kind `usage`.
fn usage_error(e: clap::Error) -> ExitCode {
    let json = std::env::args_os().any(|a| a == "--json");
    if json && !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let text = e.render().to_string();
        let message = text
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string();
        eprintln!("{}", error_report(&message, "usage", EXIT_USAGE, true));
        return ExitCode::from(EXIT_USAGE);
    }
    e.exit()
}
