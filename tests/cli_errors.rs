//! The `dockhand` binary's errors, run as a person would (issue 17 item 6): no credential in
//! any output, a refused connection said at once with HOST:PORT, a worker stopping on a
//! database it can never write, read-only commands refusing to create a missing SQLite file,
//! `--args` from a file or stdin and its UTF-8 error, `--json` errors as one JSON object on
//! stderr, and the documented exit statuses.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "Pw9-s3cret";

fn dockhand(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dockhand"));
    cmd.args(args)
        .env_remove("DOCKHAND_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run dockhand")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn all_output(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(o))
}

/// A local port nothing listens on: bound, read, released.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn migrated_sqlite(dir: &tempfile::TempDir) -> String {
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let o = run(&mut dockhand(&["--database-url", &url, "migrate"]));
    assert!(o.status.success(), "migrate: {}", stderr(&o));
    url
}

#[test]
fn a_refused_connection_is_said_at_once_naming_host_and_port() {
    for scheme in ["postgres", "mysql"] {
        let port = free_port();
        let url = format!("{scheme}://u:{SECRET}@127.0.0.1:{port}/db");
        let started = Instant::now();
        let o = run(&mut dockhand(&["--database-url", &url, "stats"]));
        assert_eq!(o.status.code(), Some(1), "{scheme}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("connection to 127.0.0.1:{port} refused")),
            "{scheme}: {err}"
        );
        assert!(!err.contains(SECRET), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{scheme}: slow");
    }
}

#[test]
fn an_unresolvable_host_is_named() {
    let url = format!("postgres://u:{SECRET}@no-such-host.invalid/db");
    let o = run(&mut dockhand(&["--database-url", &url, "stats"]));
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("host no-such-host.invalid did not resolve"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn malformed_urls_never_echo_the_password_from_flag_or_environment() {
    let urls = [
        format!("postgres:/u:{SECRET}@h/db"),
        format!("postgres//u:{SECRET}@h/db"),
        format!("u:{SECRET}@h/db"),
        format!("postgre://u:{SECRET}@h/db"),
        format!("host=h user=u password={SECRET} dbname=d"),
        format!("postgres://u:{SECRET}@h:99999/db"),
        format!("mysql://u:{SECRET}@h"),
    ];
    for url in &urls {
        for json in [false, true] {
            let mut flag = dockhand(&["--database-url", url, "stats"]);
            let mut env = dockhand(&["stats"]);
            env.env("DOCKHAND_DATABASE_URL", url);
            for cmd in [&mut flag, &mut env] {
                if json {
                    cmd.arg("--json");
                }
                let o = run(cmd);
                assert_eq!(o.status.code(), Some(1), "{url}: {}", stderr(&o));
                let out = all_output(&o);
                assert!(!out.contains(SECRET), "`{url}` → {out}");
                assert!(
                    !out.contains("error with configuration: error with"),
                    "{out}"
                );
            }
        }
    }
}

#[test]
fn json_errors_are_one_object_on_stderr() {
    let port = free_port();
    let url = format!("postgres://u:{SECRET}@127.0.0.1:{port}/db");
    let o = run(&mut dockhand(&["--database-url", &url, "--json", "stats"]));
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(stderr(&o).trim()).expect("JSON error");
    assert_eq!(v["kind"], "connect");
    assert_eq!(v["exit"], 1);
    assert!(v["error"].as_str().unwrap_or_default().contains("refused"));

    let o = run(&mut dockhand(&["--json", "stats", "--no-such-flag"]));
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_str(stderr(&o).trim()).expect("JSON error");
    assert_eq!(v["kind"], "usage");
    assert_eq!(v["exit"], 2);
}

#[test]
fn read_only_commands_do_not_create_a_missing_sqlite_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("absent.db");
    let url = format!("sqlite:{}", path.display());
    for cmd in [
        &["stats"][..],
        &["list"],
        &["show", "1"],
        &["jobs", "list"],
        &["claims", "list"],
        &["schedules"],
        &["check"],
        &["liveness"],
    ] {
        let mut args = vec!["--database-url", url.as_str()];
        args.extend_from_slice(cmd);
        let o = run(&mut dockhand(&args));
        assert_eq!(o.status.code(), Some(1), "{cmd:?}");
        let err = stderr(&o);
        assert!(err.contains("does not exist"), "{cmd:?}: {err}");
        assert!(err.contains(&path.display().to_string()), "{cmd:?}: {err}");
        assert!(!path.exists(), "{cmd:?} created the file");
    }
}

#[test]
fn sqlite_open_errors_name_the_path() {
    let o = run(&mut dockhand(&[
        "--database-url",
        "sqlite:/no-such-dir-dockhand/q.db",
        "migrate",
    ]));
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("/no-such-dir-dockhand/q.db"), "{err}");
}

#[test]
fn a_worker_on_a_database_it_can_never_write_stops_with_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("{}?mode=ro", migrated_sqlite(&dir));
    let child = dockhand(&["--database-url", &url, "run"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(o) = rx.recv_timeout(Duration::from_secs(60)) else {
        // Do not leave the worker behind.
        let _ = Command::new("kill").arg(pid.to_string()).status();
        panic!("the worker did not stop on a database it can never write");
    };
    let o = o.expect("wait");
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("refuses writes") && last.contains("readonly"),
        "{err}"
    );
}

#[test]
fn args_come_from_a_file_or_stdin_and_bad_utf8_names_the_option() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = migrated_sqlite(&dir);
    let file = dir.path().join("args.json");
    std::fs::write(&file, r#"{"from":"file"}"#).expect("write");
    let at_file = format!("@{}", file.display());
    let o = run(&mut dockhand(&[
        "--database-url",
        &url,
        "enqueue",
        "h",
        "--args",
        &at_file,
    ]));
    assert!(o.status.success(), "{}", stderr(&o));

    let mut child = dockhand(&["--database-url", &url, "enqueue", "h", "--args", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let big = format!(r#"{{"from":"stdin","pad":"{}"}}"#, "x".repeat(300_000));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(big.as_bytes())
        .expect("write stdin");
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success(), "{}", stderr(&o));

    for (args, n) in [(&at_file, 1), (&r#"{"from":"stdin"}"#.to_string(), 0)] {
        let o = run(&mut dockhand(&[
            "--database-url",
            &url,
            "list",
            "--json",
            "--args",
            args,
        ]));
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let rows = v
            .as_array()
            .map(Vec::len)
            .or_else(|| v.get("actions").and_then(|a| a.as_array()).map(Vec::len));
        assert_eq!(rows, Some(n), "{v}");
    }

    let missing = format!("@{}", dir.path().join("nope.json").display());
    let o = run(&mut dockhand(&[
        "--database-url",
        &url,
        "enqueue",
        "h",
        "--args",
        &missing,
    ]));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("invalid args: cannot read file"),
        "{}",
        stderr(&o)
    );

    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let o = dockhand(&["--database-url", &url, "enqueue", "h", "--args"])
            .arg(std::ffi::OsStr::from_bytes(b"{\"a\":\"\xff\"}"))
            .output()
            .expect("run");
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(err.contains("--args is not valid UTF-8"), "{err}");
        assert!(err.lines().count() <= 3, "{err}");
    }
}

#[test]
fn help_documents_exit_statuses_and_the_cron_dst_rule() {
    let o = run(&mut dockhand(&["--help"]));
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "Exit status",
        "0  success",
        "1  runtime error",
        "2  usage error",
        "DST",
    ] {
        assert!(help.contains(needle), "missing {needle:?} in --help");
    }
    let o = run(&mut dockhand(&["no-such-command"]));
    assert_eq!(o.status.code(), Some(2));
}

/// `enqueue --pipeline` schedules jobs of a pipeline: it needs a recurrence and a name (usage
/// errors naming them, exit 2) and takes no HOOK; a valid one is stored as a schedule of the
/// scheduled-start hook in the pipeline's group.
#[test]
fn enqueue_pipeline_schedules_need_a_recurrence_and_a_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = migrated_sqlite(&dir);
    let no_name = run(&mut dockhand(&[
        "--database-url",
        &url,
        "enqueue",
        "--pipeline",
        "import",
        "--every",
        "1h",
    ]));
    assert_eq!(no_name.status.code(), Some(2), "{}", all_output(&no_name));
    assert!(stderr(&no_name).contains("--name"), "{}", stderr(&no_name));
    let no_recurrence = run(&mut dockhand(&[
        "--database-url",
        &url,
        "enqueue",
        "--pipeline",
        "import",
        "--name",
        "n",
    ]));
    assert_eq!(no_recurrence.status.code(), Some(2));
    let with_hook = run(&mut dockhand(&[
        "--database-url",
        &url,
        "enqueue",
        "mail",
        "--pipeline",
        "import",
        "--name",
        "n",
        "--every",
        "1h",
    ]));
    assert_eq!(with_hook.status.code(), Some(2));

    let ok = run(&mut dockhand(&[
        "--database-url",
        &url,
        "--json",
        "enqueue",
        "--pipeline",
        "import",
        "--name",
        "nightly",
        "--args",
        r#"{"feed": "news"}"#,
        "--cron",
        "0 2 * * *",
        "--no-overlap",
    ]));
    assert!(ok.status.success(), "{}", all_output(&ok));
    let schedules = run(&mut dockhand(&[
        "--database-url",
        &url,
        "--json",
        "schedules",
    ]));
    let listed: serde_json::Value = serde_json::from_slice(&schedules.stdout).expect("json");
    let s = &listed[0];
    assert_eq!(s["hook"], "dockhand.job.scheduled_start", "{listed}");
    assert_eq!(s["group"], "pipeline:import");
    assert_eq!(
        s["args"],
        serde_json::json!({"pipeline": "import", "input": {"feed": "news"},
                           "schedule": "nightly", "no_overlap": true})
    );
}
