//! `dockhand groups limit` / `groups limits` run as a person would: set, list (text and
//! JSON), bad values refused naming the field (0 when the command runs: status 1; a rate that
//! does not parse: usage, status 2), clear.

use std::process::{Command, Output, Stdio};

fn dockhand(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dockhand"))
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env_remove("DOCKHAND_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run dockhand")
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn group_limits_are_set_listed_refused_and_cleared_from_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    assert!(dockhand(&url, &["migrate"]).status.success());

    let o = dockhand(
        &url,
        &[
            "groups",
            "limit",
            "mail",
            "--concurrency",
            "2",
            "--rate",
            "10/s",
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        out(&o),
        "group mail limited to concurrency 2, rate 10/1s\n",
        "{}",
        err(&o)
    );

    let o = dockhand(&url, &["groups", "limits"]);
    assert!(o.status.success(), "{}", err(&o));
    let text = out(&o);
    assert!(text.contains("GROUP") && text.contains("mail"), "{text}");
    assert!(text.contains("10/1s") && text.contains("cli"), "{text}");

    let o = dockhand(&url, &["groups", "limits", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(json[0]["group"], "mail");
    assert_eq!(json[0]["limit"]["concurrency"], 2);
    assert_eq!(json[0]["limit"]["rate"]["count"], 10);
    assert_eq!(json[0]["limit"]["rate"]["period"], "1s");
    assert_eq!(json[0]["running"], 0);

    let o = dockhand(&url, &["groups", "limit", "mail", "--concurrency", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("invalid concurrency: must be at least 1"),
        "{}",
        err(&o)
    );

    let o = dockhand(&url, &["groups", "limit", "mail", "--rate", "10/fortnight"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("--rate")
            && err(&o).contains("invalid rate")
            && err(&o).contains("unknown unit"),
        "{}",
        err(&o)
    );

    let o = dockhand(&url, &["groups", "limit", "mail", "--clear"]);
    assert_eq!(out(&o), "group mail: limits cleared\n", "{}", err(&o));
    let o = dockhand(&url, &["groups", "limit", "mail", "--clear"]);
    assert_eq!(out(&o), "group mail had no limits\n", "{}", err(&o));
    let o = dockhand(&url, &["groups", "limits"]);
    assert_eq!(out(&o), "no group has limits\n");
}
