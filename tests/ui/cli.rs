//! `dockhand ui`'s start checks, through the real argument parser.

use clap::Parser;
use dockhand::cli::{Cli, Command, UiArgs};
use dockhand::ui::{Access, HostCheck};
use std::net::SocketAddr;

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("address")
}

fn ui_args(argv: &[&str]) -> UiArgs {
    let mut full = vec!["dockhand", "ui"];
    full.extend_from_slice(argv);
    match Cli::try_parse_from(full).map(|c| c.command) {
        Ok(Command::Ui(a)) => a,
        other => panic!("{argv:?}: {other:?}"),
    }
}

#[test]
fn a_public_address_needs_credentials() {
    let refused = ui_args(&["--bind", "0.0.0.0:8080"]);
    let e = refused
        .check()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("refusing") && e.contains("0.0.0.0:8080") && e.contains("--auth"),
        "{e}"
    );
    assert!(ui_args(&["--bind", "192.0.2.7:80", "--read-only"])
        .check()
        .is_err());
    assert!(ui_args(&["--bind", "0.0.0.0:8080", "--auth", "admin:pw"])
        .check()
        .is_ok());
    assert!(
        ui_args(&["--bind", "0.0.0.0:8080", "--read-only-auth", "v:pw"])
            .check()
            .is_ok()
    );
    assert!(ui_args(&[]).check().is_ok());
    assert!(ui_args(&["--bind", "[::1]:9000"]).check().is_ok());
}

#[test]
fn options_give_the_documented_access() {
    let open = ui_args(&[]).config(addr("127.0.0.1:8080"));
    assert_eq!(open.access, Access::Operator);
    assert_eq!(open.basic_auth, None);
    assert_eq!(open.base_path, "/");
    let capped = ui_args(&[
        "--read-only",
        "--auth",
        "admin:pw:x",
        "--base-path",
        "/queue",
    ])
    .config(addr("127.0.0.1:8080"));
    assert_eq!(capped.access, Access::ReadOnly);
    assert_eq!(
        capped.basic_auth,
        Some(("admin".to_string(), "pw:x".to_string()))
    );
    assert_eq!(capped.base_path, "/queue");
    // Debug output never shows a password.
    let shown = format!("{:?} {:?}", ui_args(&["--auth", "admin:hunter2"]), capped);
    assert!(
        !shown.contains("hunter2") && !shown.contains("pw:x"),
        "{shown}"
    );
}

#[tokio::test]
async fn an_unmigrated_database_is_refused_before_listening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite:{}", dir.path().join("fresh.db").display());
    // Port 9 (discard) on loopback: the check must fail before any bind is tried.
    let cli = Cli::try_parse_from([
        "dockhand",
        "--database-url",
        &url,
        "ui",
        "--bind",
        "127.0.0.1:9",
    ])
    .expect("parse");
    let e = dockhand::cli::run(cli)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("migration 0") && e.contains("needs 8") && e.contains("dockhand migrate"),
        "{e}"
    );
}

/// What `dockhand ui ARGV` fails with when the command line is read.
fn parse_error(argv: &[&str]) -> String {
    let mut full = vec!["dockhand", "ui"];
    full.extend_from_slice(argv);
    match Cli::try_parse_from(full) {
        Ok(c) => panic!("{argv:?} was accepted: {:?}", c.command),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_bad_base_path_is_refused_naming_the_flag_and_the_value() {
    for (bad, why) in [
        ("//evil.example", "empty segment"),
        ("queue", "must start with `/`"),
        ("/queue//x", "empty segment"),
        ("/queue/../x", "`..` segment"),
        ("/./queue", "`.` segment"),
        ("/que ue", "only letters, digits"),
        ("/queue?x=1", "only letters, digits"),
        ("/%2F%2Fevil", "only letters, digits"),
    ] {
        let e = parse_error(&["--base-path", bad]);
        assert!(
            e.contains("--base-path") && e.contains(bad) && e.contains(why),
            "{bad}: {e}"
        );
    }
    for ok in ["/", "/queue", "/queue/", "/ops/queue-1.v2_~"] {
        assert_eq!(ui_args(&["--base-path", ok]).base_path, ok);
    }
}

#[tokio::test]
async fn dockhand_ui_with_a_bad_base_path_does_not_start() {
    // The whole command, as the binary runs it: refused when the command line is read, before
    // any database or port is touched.
    let e = Cli::try_parse_from(["dockhand", "ui", "--base-path", "//evil.example"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("--base-path") && e.contains("//evil.example"),
        "{e}"
    );
    // A `UiArgs` built in code (not parsed) is refused by `run` before it connects.
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("never.db");
    let url = format!("sqlite:{}", db.display());
    let mut cli = Cli::try_parse_from([
        "dockhand",
        "--database-url",
        &url,
        "ui",
        "--bind",
        "127.0.0.1:9",
    ])
    .expect("parse");
    if let Command::Ui(a) = &mut cli.command {
        a.base_path = "/a/./b".into();
    }
    let e = dockhand::cli::run(cli)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("base_path") && e.contains("/a/./b"), "{e}");
    assert!(!db.exists(), "nothing was opened");
}

#[test]
fn allowed_hosts_are_the_loopback_names_and_the_bound_address_with_its_port() {
    let open = ui_args(&[]).config(addr("127.0.0.1:8080"));
    assert_eq!(open.host_check, HostCheck::WithoutCredentials);
    assert_eq!(
        open.allowed_hosts,
        ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"]
    );
    let other = ui_args(&["--bind", "127.0.0.2:0"]).config(addr("127.0.0.2:41234"));
    assert_eq!(
        other.allowed_hosts,
        [
            "localhost:41234",
            "127.0.0.1:41234",
            "[::1]:41234",
            "127.0.0.2:41234"
        ]
    );
    // --allowed-host adds names, repeatable, and turns the check on whatever the credentials.
    let proxied = ui_args(&[
        "--allowed-host",
        "queue.example.com",
        "--allowed-host",
        "ops.internal:8443",
        "--auth",
        "admin:pw",
    ])
    .config(addr("127.0.0.1:8080"));
    assert_eq!(proxied.host_check, HostCheck::Always);
    assert_eq!(
        &proxied.allowed_hosts[3..],
        ["queue.example.com", "ops.internal:8443"]
    );
    for bad in [
        "http://queue.example.com",
        "*",
        "queue.example.com/x",
        "::1",
    ] {
        let e = parse_error(&["--allowed-host", bad]);
        assert!(
            e.contains("--allowed-host") && e.contains("NAME or NAME:PORT"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn help_documents_the_new_flag_and_the_base_path_rule() {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let help = cmd
        .find_subcommand_mut("ui")
        .expect("ui subcommand")
        .render_long_help()
        .to_string();
    assert!(help.contains("--allowed-host <NAME[:PORT]>"), "{help}");
    assert!(
        help.contains("421") && help.contains("DNS rebinding"),
        "{help}"
    );
    assert!(help.contains("no empty, `.` or `..` segment"), "{help}");
}
