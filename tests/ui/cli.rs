//! `dockhand ui`'s start checks, through the real argument parser.

use clap::Parser;
use dockhand::cli::{Cli, Command, UiArgs};
use dockhand::ui::Access;

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
    let open = ui_args(&[]).config();
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
    .config();
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
        e.contains("migration 0") && e.contains("needs 7") && e.contains("dockhand migrate"),
        "{e}"
    );
}
