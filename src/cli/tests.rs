//! Unit tests of the command line: its definition, argument parsing and the errors it names.

use super::*;
use clap::CommandFactory;

#[test]
fn the_command_line_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn recurring_and_one_off_options_conflict_as_documented() {
    let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
    assert!(parse(&[
        "dockhand",
        "enqueue",
        "h",
        "--every",
        "5s",
        "--cron",
        "* * * * *"
    ])
    .is_err());
    assert!(parse(&["dockhand", "enqueue", "h", "--fixed-delay"]).is_err());
    assert!(parse(&["dockhand", "enqueue", "h", "--timezone", "UTC"]).is_err());
    assert!(parse(&["dockhand", "enqueue", "h", "--unique", "--every", "5s"]).is_err());
    assert!(parse(&["dockhand", "enqueue", "h", "--every", "-5s"]).is_ok());
    assert!(parse(&[
        "dockhand",
        "list",
        "--order",
        "-id",
        "--status",
        "pending,failed"
    ])
    .is_ok());
    assert!(parse(&["dockhand", "jobs", "list", "--status", "failed,cancelled"]).is_ok());
    assert!(parse(&["dockhand", "jobs", "list", "--status", "canceled"]).is_err());
    assert!(parse(&["dockhand", "claims", "list", "--status", "processed"]).is_ok());
    assert!(parse(&["dockhand", "claims", "list", "--status", "done"]).is_err());
    assert!(parse(&["dockhand", "groups", "limit", "g", "--concurrency", "2"]).is_ok());
    assert!(parse(&["dockhand", "groups", "limit", "g", "--rate", "10/s"]).is_ok());
    assert!(parse(&["dockhand", "groups", "limit", "g", "--clear"]).is_ok());
    assert!(parse(&["dockhand", "groups", "limit", "g"]).is_err());
    assert!(parse(&["dockhand", "groups", "limit", "g", "--clear", "--rate", "1/s"]).is_err());
    assert!(parse(&["dockhand", "groups", "limits", "--json"]).is_ok());
    let e = parse(&["dockhand", "groups", "limit", "g", "--rate", "10/x"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--rate") && e.contains("invalid rate"), "{e}");
    assert!(parse(&["dockhand", "manual-fail", "3", "--reason", "bad feed"]).is_ok());
    assert!(parse(&["dockhand", "cancel-job", "3", "--reason", "x"]).is_err());
    assert!(parse(&[
        "dockhand",
        "recover-stuck",
        "--dry-run",
        "--limit",
        "10",
        "--older-than",
        "30s",
        "--json"
    ])
    .is_ok());
    assert!(parse(&["dockhand", "recover-stuck", "--older-than", "5"]).is_err());
    assert!(parse(&["dockhand", "recover-stuck", "--limit", "0"]).is_err());
    assert!(parse(&["dockhand", "liveness", "--limit", "5"]).is_ok());
    assert!(parse(&["dockhand", "check", "--json"]).is_ok());
    assert!(parse(&["dockhand", "check", "--limit", "5"]).is_err());
    assert!(parse(&["dockhand", "demo", "--fresh", "--timeout", "30s"]).is_ok());
    assert!(parse(&["dockhand", "demo", "--keep"]).is_err());
    assert!(parse(&["dockhand", "ui", "--bind", "0.0.0.0:9000", "--read-only"]).is_ok());
    assert!(parse(&["dockhand", "ui", "--bind", "localhost"]).is_err());
    assert!(parse(&["dockhand", "ui", "--auth", "nopassword"]).is_err());
    assert!(parse(&[
        "dockhand",
        "list",
        "--json",
        "--database-url",
        "sqlite::memory:"
    ])
    .is_ok());
}

#[test]
fn list_and_jobs_list_share_one_page_definition() {
    let page = |args: &[&str]| match Cli::try_parse_from(args.iter().copied()) {
        Ok(Cli {
            command: Command::List(a),
            ..
        }) => Ok(a.page),
        Ok(Cli {
            command: Command::Jobs(jobs::JobsCommand::List(a)),
            ..
        }) => Ok(a.page),
        Ok(other) => panic!("parsed as another command: {other:?}"),
        Err(e) => Err(e.to_string()),
    };
    for cmd in [&["dockhand", "list"][..], &["dockhand", "jobs", "list"][..]] {
        let with = |extra: &[&str]| page(&[cmd, extra].concat());
        let p = with(&[]).expect("defaults parse");
        assert_eq!((p.limit, p.offset), (50, 0));
        let p = with(&["--limit", "10", "--offset", "30"]).expect("a page parses");
        assert_eq!((p.limit, p.offset), (10, 30));
        assert!(with(&["--limit", "0"]).unwrap_err().contains("--limit"));
        assert!(with(&["--offset=-1"]).unwrap_err().contains("--offset"));
        // A full page says where the next one starts; a short one says nothing.
        assert_eq!(
            p.next_page_note(10).as_deref(),
            Some("(showing 10 from offset 30; next page: --offset 40)\n")
        );
        assert_eq!(p.next_page_note(9), None);
    }
}
