//! CLI arguments and durations (§5 row 7): random argument vectors built from the real
//! subcommands and options mixed with junk give a clap error or a parsed command, never a
//! panic; durations parse exactly, and overflowing ones are a clear error.

use crate::support::check;
use clap::Parser;
use dockhand::cli::args::parse_duration;
use dockhand::cli::Cli;
use proptest::prelude::*;

const WORDS: &[&str] = &[
    "enqueue",
    "list",
    "show",
    "cancel",
    "retry",
    "unschedule",
    "schedules",
    "stats",
    "prune",
    "jobs",
    "claims",
    "manual-fail",
    "cancel-job",
    "run",
    "recover-stuck",
    "liveness",
    "check",
    "demo",
    "bench",
    "chaos",
    "chaos-worker",
    "migrate",
    "--json",
    "--database-url",
    "--connect-timeout",
    "--hook",
    "--group",
    "--args",
    "--at",
    "--in",
    "--every",
    "--cron",
    "--timezone",
    "--priority",
    "--max-attempts",
    "--timeout",
    "--unique",
    "--status",
    "--limit",
    "--older-than",
    "--dry-run",
    "--concurrency",
    "--backend",
    "--seed",
    "--profile",
    "--duration",
    "--n",
    "--workload",
    "--keep-finished",
    "--clock-skew-ms",
    "sqlite",
    "postgres",
    "ci",
    "soak",
    "1",
    "-1",
    "0",
    "30s",
    "5m",
    "-2h",
    "1d",
    "250ms",
    "99999999999999999999d",
    "{}",
    "{\"a\":1}",
    "Europe/Paris",
    "0 9 * * 1-5",
    "2030-01-01T09:00:00Z",
    "list",
    "--",
];

fn argv() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(WORDS).prop_map(String::from),
            1 => any::<String>(),
            1 => "-{1,2}[a-z-]{0,12}(=[a-z0-9]{0,6})?",
        ],
        0..8,
    )
}

#[test]
fn random_argv_is_an_error_or_a_command_never_a_panic() {
    check(8192, argv(), |args| {
        let full = std::iter::once("dockhand".to_string()).chain(args.iter().cloned());
        // try_parse_from returns clap's error (help and version requests included) instead of
        // exiting; any panic fails the property.
        let _ = Cli::try_parse_from(full);
        Ok(())
    });
}

fn unit() -> impl Strategy<Value = (&'static str, i64)> {
    prop::sample::select(vec![
        ("ms", 1i64),
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ])
}

#[test]
fn durations_parse_exactly_or_say_what_is_wrong() {
    let parts = prop::collection::vec((0u64..=u64::MAX, unit()), 1..4);
    check(8192, (parts, any::<bool>()), |(parts, negative)| {
        let text: String = parts.iter().map(|(n, (u, _))| format!("{n}{u}")).collect();
        let text = if negative { format!("-{text}") } else { text };
        let exact = parts.iter().try_fold(0i64, |acc, (n, (_, ms))| {
            i64::try_from(*n)
                .ok()
                .and_then(|n| n.checked_mul(*ms))
                .and_then(|v| acc.checked_add(v))
                .filter(|v| *v <= chrono::Duration::MAX.num_milliseconds())
        });
        match (parse_duration(&text), exact) {
            (Ok(d), Some(ms)) => {
                prop_assert_eq!(d.num_milliseconds(), if negative { -ms } else { ms })
            }
            (Err(e), None) => prop_assert!(e.contains(&text), "the error names the input: {e}"),
            (got, want) => prop_assert!(false, "`{text}`: got {got:?}, expected {want:?} ms"),
        }
        Ok(())
    });
    check(8192, any::<String>(), |junk| {
        // Never a panic; an error always names the input.
        if let Err(e) = parse_duration(&junk) {
            prop_assert!(e.contains(junk.trim()) || e.contains(&junk), "{e}");
        }
        Ok(())
    });
}
