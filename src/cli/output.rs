//! What commands produce: [`Output`] writes results to stdout (text, or JSON with `--json`), and
//! [`CliError`] is what the binary prints as `error: <message>` (a JSON object with `--json`,
//! see [`error_report`]) before exiting with status 1.

use crate::Error;
use serde::Serialize;
use std::io::Write;

/// What the binary reports when a command fails: `error: <message>`, exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A library call failed.
    #[error("{}", with_hint(.0))]
    Dockhand(#[from] Error),
    /// Writing output or reading the terminal failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A command could not complete (demo timeout, interrupted, ...).
    #[error("{0}")]
    Failed(String),
}

/// The exit status of a runtime error (see the exit-status table in `dockhand --help`).
pub const EXIT_RUNTIME: u8 = 1;
/// The exit status of a usage error (clap's: an unknown option, a value it cannot parse).
pub const EXIT_USAGE: u8 = 2;

impl CliError {
    /// A stable machine-readable name of what went wrong, for `--json` errors: `invalid_input`,
    /// `not_found`, `owned_by_job`, `connect`, `database`, `config`, `migrate`, `corrupt`, `unknown_hook`,
    /// `lease_lost`, `io`, `failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            CliError::Dockhand(e) => match e {
                Error::InvalidInput { .. } => "invalid_input",
                Error::UnknownHook { .. } => "unknown_hook",
                Error::NotFound { .. } => "not_found",
                Error::OwnedByJob { .. } => "owned_by_job",
                Error::Database { .. } => "database",
                Error::Migrate(_) => "migrate",
                Error::Config(_) => "config",
                Error::Corrupt { .. } => "corrupt",
                Error::Connect { .. } => "connect",
                Error::LeaseLost { .. } => "lease_lost",
                #[allow(unreachable_patterns)]
                _ => "error",
            },
            CliError::Io(_) => "io",
            CliError::Failed(_) => "failed",
        }
    }

    /// The process exit status for this error: always [`EXIT_RUNTIME`].
    pub fn exit_code(&self) -> u8 {
        EXIT_RUNTIME
    }
}

/// The error as the binary prints it on stderr: `error: MESSAGE`, or with `--json` one JSON
/// object `{"error": MESSAGE, "kind": KIND, "exit": STATUS}` on a line. The message is
/// redacted once more, so no credential can reach the terminal even from a driver's text.
pub fn error_report(message: &str, kind: &str, exit: u8, json: bool) -> String {
    let message = crate::store::redact_text(message);
    if json {
        serde_json::json!({"error": message, "kind": kind, "exit": exit}).to_string()
    } else {
        format!("error: {message}")
    }
}

/// Adds a hint when the schema is missing (a command run before `dockhand migrate`).
fn with_hint(e: &Error) -> String {
    let text = e.to_string();
    let missing_schema = matches!(e, Error::Database { .. })
        && (text.contains("no such table")
            || (text.contains("relation") && text.contains("does not exist")));
    if missing_schema {
        format!("{text} (has the schema been created? run `dockhand migrate`)")
    } else {
        text
    }
}

/// Where command results go: stdout, as text or JSON. A closed pipe (`| head`) ends the output
/// quietly instead of failing.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub(crate) json: bool,
}

impl Output {
    /// Whether `--json` was given.
    pub(crate) fn is_json(self) -> bool {
        self.json
    }

    /// Writes `text` (a newline is added when missing).
    pub(crate) fn text(self, text: &str) -> Result<(), CliError> {
        let mut stdout = std::io::stdout().lock();
        let r = stdout.write_all(text.as_bytes()).and_then(|()| {
            if text.ends_with('\n') {
                Ok(())
            } else {
                stdout.write_all(b"\n")
            }
        });
        match r.and_then(|()| stdout.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => Ok(other?),
        }
    }

    /// Writes `value` as pretty JSON.
    pub(crate) fn json<T: Serialize + ?Sized>(self, value: &T) -> Result<(), CliError> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::Failed(format!("cannot encode output as JSON: {e}")))?;
        self.text(&text)
    }

    /// JSON of `value` with `--json`, otherwise the text `human` builds.
    pub(crate) fn emit<T: Serialize + ?Sized>(
        self,
        value: &T,
        human: impl FnOnce() -> String,
    ) -> Result<(), CliError> {
        if self.json {
            self.json(value)
        } else {
            self.text(&human())
        }
    }
}
