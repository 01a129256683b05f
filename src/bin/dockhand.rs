//! The `dockhand` operator binary: parses the command line, sets up logging to stderr
//! (`RUST_LOG`, else [`dockhand::cli::Cli::default_log_filter`]), and runs
//! [`dockhand::cli::run`]. A failure prints `error: <message>` and exits with status 1.

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = dockhand::cli::Cli::parse();
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
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
