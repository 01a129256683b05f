//! Named crash points for the chaos run (RELIABILITY.md §2).
//!
//! With the `failpoints` feature, each [`crash`] call is a `fail` crate failpoint: a worker
//! started with `FAILPOINTS="runner.after_claim=2%return"` (see [`configure_from_env`]) exits
//! at once, without cleanup, when the point fires — a process dying exactly there. Without the
//! feature, [`crash`] compiles to nothing.
//!
//! The points: `runner.after_claim` (claim committed, handler not started),
//! `runner.before_finish` (handler done, result not written), `bridge.after_commit` (terminal
//! transaction committed, lifecycle hooks not delivered), `batch.before_chunk` (a chunk's rows
//! settled, the next chunk not enqueued).

/// Every crash point, for configuration checks and reports.
pub const POINTS: [&str; 4] = [
    "runner.after_claim",
    "runner.before_finish",
    "bridge.after_commit",
    "batch.before_chunk",
];

/// The exit status of a process that stopped at a crash point.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Whether this build has the crash points compiled in.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Exits the process at once with [`CRASH_EXIT_CODE`] when the failpoint `name` fires.
#[cfg(feature = "failpoints")]
pub fn crash(name: &'static str) {
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("dockhand: crash point {name} fired; exiting");
        std::process::exit(CRASH_EXIT_CODE);
    }
}

/// Exits the process at once when the failpoint `name` fires (a no-op in this build: the
/// `failpoints` feature is off).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn crash(_name: &'static str) {}

/// Configures failpoints from `FAILPOINTS` (`name=actions;name=actions`, the `fail` crate's
/// syntax). Errors name the bad entry; without the feature, a non-empty value is an error.
pub fn configure_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var("FAILPOINTS") else {
        return Ok(());
    };
    configure(&spec)
}

/// Configures failpoints from a `name=actions;…` list (see [`configure_from_env`]).
pub fn configure(spec: &str) -> Result<(), String> {
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, actions) = entry
            .split_once('=')
            .ok_or_else(|| format!("failpoint `{entry}`: expected name=actions"))?;
        if !POINTS.contains(&name) {
            return Err(format!(
                "failpoint `{name}`: unknown (known: {})",
                POINTS.join(", ")
            ));
        }
        set(name, actions)?;
    }
    Ok(())
}

#[cfg(feature = "failpoints")]
fn set(name: &str, actions: &str) -> Result<(), String> {
    fail::cfg(name, actions).map_err(|e| format!("failpoint `{name}`: {e}"))
}

#[cfg(not(feature = "failpoints"))]
fn set(name: &str, _actions: &str) -> Result<(), String> {
    Err(format!(
        "failpoint `{name}`: this build has no crash points (build with --features failpoints)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_entries_are_named() {
        assert!(configure("").is_ok());
        let e = configure("runner.after_claim").unwrap_err();
        assert!(
            e.contains("runner.after_claim") && e.contains("name=actions"),
            "{e}"
        );
        let e = configure("no.such.point=return").unwrap_err();
        assert!(e.contains("no.such.point") && e.contains("unknown"), "{e}");
    }
}
