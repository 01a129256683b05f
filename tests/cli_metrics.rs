//! `dockhand run --metrics-bind` as a person runs it (a subprocess, so its global metrics
//! recorder is its own): a bad or taken address is one error naming the flag, and a worker
//! serves `/metrics` with the database gauges.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn dockhand(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dockhand"));
    cmd.args(args)
        .env_remove("DOCKHAND_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn migrated_sqlite(dir: &tempfile::TempDir) -> String {
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let o = dockhand(&["--database-url", &url, "migrate"])
        .output()
        .expect("migrate");
    assert!(o.status.success(), "migrate: {}", stderr(&o));
    url
}

/// Stops the worker (SIGTERM) when dropped, so a failed assertion leaves nothing behind.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

/// The value of the sample `series` (name and labels exactly as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn a_bad_metrics_address_names_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = migrated_sqlite(&dir);
    let o = dockhand(&["--database-url", &url, "run", "--metrics-bind", "localhost"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--metrics-bind"), "{}", stderr(&o));
    // An address already taken: the worker says so and never starts.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let o = dockhand(&["--database-url", &url, "run", "--metrics-bind", &addr])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("cannot listen on --metrics-bind {addr}")),
        "{err}"
    );
    assert!(!err.contains("dockhand worker on"), "started anyway: {err}");
    // --metrics-interval alone is a usage error.
    let o = dockhand(&["--database-url", &url, "run", "--metrics-interval", "5s"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn a_worker_serves_metrics_with_the_database_gauges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = migrated_sqlite(&dir);
    // Three actions of a hook the demo worker does not have: they stay pending.
    for _ in 0..3 {
        let o = dockhand(&[
            "--database-url",
            &url,
            "enqueue",
            "not.here",
            "--group",
            "g1",
        ])
        .output()
        .expect("enqueue");
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let mut child = dockhand(&[
        "--database-url",
        &url,
        "run",
        "--metrics-bind",
        "127.0.0.1:0",
        "--metrics-interval",
        "1s",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn run");
    let err = child.stderr.take().expect("stderr");
    let worker = Worker(child);
    let mut lines = BufReader::new(err).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("metrics on http://")
                .and_then(|r| r.strip_suffix("/metrics"))
                .map(str::to_string)
        })
        .expect("the worker prints its metrics address");
    std::thread::spawn(move || lines.for_each(drop));
    // The first refresh runs at start; wait for it (no fixed sleep), at most 60 s.
    let pending = "dockhand_actions{group=\"g1\",status=\"pending\"}";
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = get(&addr, "/metrics");
        if sample(&text, pending) == Some(3.0) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert_eq!(sample(&text, pending), Some(3.0), "{text}");
    let due = sample(&text, "dockhand_actions_due{group=\"g1\"}");
    assert_eq!(due, Some(3.0), "{text}");
    let processing = sample(&text, "dockhand_jobs_processing");
    assert_eq!(processing, Some(0.0), "{text}");
    assert!(get(&addr, "/").starts_with("HTTP/1.1 404"));
    drop(worker);
}
