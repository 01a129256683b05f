//! The end-to-end harness: a seeded dashboard served on a loopback port ([`Dashboard`]) and a
//! headless Chromium driven through chromedriver ([`Browser`]). Tests skip with one line when
//! `chromedriver` is not installed, unless `DOCKHAND_E2E_REQUIRED=1` (set by `.ci/run`), which
//! makes a missing browser a failure.

use crate::webdriver::Client;
use chrono::{DateTime, Duration, TimeZone, Utc};
use dockhand::cli::UiArgs;
use dockhand::store::{ClaimRequest, Finish};
use dockhand::ui::{standalone_router, Access, UiConfig};
use dockhand::{
    ActionSpec, DynStore, HandlerError, OffsetClock, Packet, Pipeline, Queue, Recurrence, Runtime,
    ScheduleSpec, StepContext, StepOutput, SystemClock, TestClock,
};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::process::{Child, Command};
use std::sync::Arc;

/// The screenshots the README shows, kept in `docs/screenshots/`.
pub const DOCS_SHOTS: [&str; 4] = ["overview", "actions", "batch", "batch-theme-toggled"];

/// A name the browser resolves to 127.0.0.1 (`--host-resolver-rules`) that the dashboard
/// does not answer to: what a DNS-rebinding page's name looks like from the server.
pub const REBIND_HOST: &str = "rebind.test";

/// Where chromedriver lives on Debian.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether the browser is installed; prints the skip line (or panics under
/// `DOCKHAND_E2E_REQUIRED=1`) when it is not.
pub fn browser_available() -> bool {
    if Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    if std::env::var("DOCKHAND_E2E_REQUIRED").is_ok_and(|v| v == "1") {
        panic!("DOCKHAND_E2E_REQUIRED=1 but {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver)");
    }
    eprintln!("SKIPPED: browser end-to-end tests ({CHROMEDRIVER} not found; apt-get install chromium chromium-driver)");
    false
}

/// What the seed holds, for the test to find its way.
pub struct Seeded {
    /// A failed action (`webhook.call`, error `fatal: bad address`).
    pub failed: i64,
    /// Pending actions of hook `email.send`, newest last.
    pub pending: Vec<i64>,
    /// A batch parent whose 20 children ran (3 failed).
    pub batch: i64,
}

/// The `import` pipeline: 20 items, items 3, 11 and 17 fail for good.
fn import_pipeline() -> Pipeline {
    Pipeline::new("import")
        .step("split", |_ctx: StepContext| async move {
            Ok(StepOutput::Packets(
                (0..20).map(|i| Packet::new(json!({ "item": i }))).collect(),
            ))
        })
        .step("process", |ctx: StepContext| async move {
            let item = ctx.input()["item"].as_i64().unwrap_or(-1);
            if [3, 11, 17].contains(&item) {
                return Err(HandlerError::fatal(format!(
                    "item {item}: upstream said 404"
                )));
            }
            Ok(StepOutput::one(json!({ "item": item, "ok": true })))
        })
        .chunk_size(5)
        .max_attempts(1)
}

/// Runs a real fan-out through a runtime on the same database: 20 items in chunks of 5, the
/// items 3, 11 and 17 fail fatally. Returns the parent job once every child is final.
///
/// The runtime's clock starts at `start` and runs at wall-clock speed, so the batch's times
/// are minutes before the seed's frozen `t0` the dashboard renders with: on the system clock
/// they would be wherever today is, and the page would show them relative to `t0` (a screenshot
/// once said "updated … (in 250d)").
async fn run_batch(url: &str, start: DateTime<Utc>) -> i64 {
    let pipeline = import_pipeline();
    let clock = OffsetClock::new(Arc::new(SystemClock), start - Utc::now());
    let runtime = Runtime::builder(url)
        .clock(Arc::new(clock))
        .pipeline(pipeline)
        .concurrency(4)
        .poll_interval(std::time::Duration::from_millis(20))
        .build()
        .await
        .expect("runtime");
    let handle = runtime.start().await.expect("start runtime");
    let jobs = runtime.jobs();
    let parent = jobs.start("import", json!({})).await.expect("start batch");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let done = jobs
            .get(parent)
            .await
            .map(|j| j.status.is_final())
            .unwrap_or(false);
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "batch {parent} did not finish in 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    handle.shutdown().await;
    runtime.store().close().await;
    parent
}

/// The dashboard over a seeded temporary SQLite database, served on `127.0.0.1:<port>`.
pub struct Dashboard {
    /// The base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    /// The store, to check what the browser changed.
    pub store: DynStore,
    /// The seed.
    pub seeded: Seeded,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Dashboard {
    /// Seeds 300 actions (pending over three hooks and groups, some failed and complete), two
    /// schedules, and serves what `dockhand ui --bind 127.0.0.1:<port>` serves, with operator
    /// access (it answers to the loopback names with its port only).
    pub async fn start() -> Dashboard {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite:{}", dir.path().join("e2e.db").display());
        let store = dockhand::store::connect(&url).await.expect("open sqlite");
        store.migrate().await.expect("migrate");
        let t0 = Utc
            .with_ymd_and_hms(2026, 3, 27, 12, 0, 0)
            .single()
            .expect("t0");
        // The batch first (its runtime fails every action whose hook it does not know), ten
        // minutes before t0 on the seed's timeline.
        let batch = run_batch(&url, t0 - Duration::minutes(10)).await;
        let clock = TestClock::at(t0);
        let queue = Queue::with_clock(Arc::clone(&store), Arc::new(clock.clone()));
        let mut pending = Vec::new();
        for i in 0..300i64 {
            let (hook, group) = match i % 3 {
                0 => ("email.send", "mail"),
                1 => ("webhook.call", "hooks"),
                _ => ("report.build", "reports"),
            };
            let spec = ActionSpec::new(hook, json!({"n": i, "user_id": i % 7}))
                .group(group)
                .priority((i % 4) as i32 * 5)
                .max_attempts(1)
                .at(t0 + Duration::seconds(i - 150));
            let id = queue.enqueue(spec).await.expect("enqueue");
            if hook == "email.send" {
                pending.push(id);
            }
        }
        // Ten webhook calls run and fail, ten reports complete.
        let mut failed = 0;
        for (hook, n) in [("webhook.call", 10), ("report.build", 10)] {
            let hooks = [hook.to_string()];
            let claimed = store
                .claim(&ClaimRequest {
                    owner: "worker-1",
                    limit: n,
                    now: t0 - Duration::seconds(30),
                    lease_until: t0,
                    hooks: Some(&hooks),
                    routing: None,
                })
                .await
                .expect("claim");
            for c in claimed {
                let finish = if hook == "webhook.call" {
                    failed = c.id;
                    Finish::Fail {
                        error: "fatal: bad address".into(),
                    }
                } else {
                    Finish::Complete
                };
                let r = store
                    .finish(c.lease(), &finish, t0 - Duration::seconds(20))
                    .await
                    .expect("finish");
                assert_eq!(r, dockhand::store::FinishResult::Applied);
                if hook == "email.send" {
                    pending.retain(|p| *p != c.id);
                }
            }
        }
        for spec in [
            ScheduleSpec::new(
                "email.send",
                json!({"digest": true}),
                Recurrence::every(Duration::minutes(5)).expect("every"),
            )
            .name("digest"),
            ScheduleSpec::new(
                "report.build",
                json!({}),
                Recurrence::cron("0 3 * * *", "Europe/Paris").expect("cron"),
            )
            .name("nightly"),
        ] {
            queue.schedule(spec).await.expect("schedule");
        }
        // A job handle that knows the pipeline (never started): the batch page offers
        // "Re-run failed children".
        let jobs = Runtime::with_store(Arc::clone(&store))
            .migrate(false)
            .pipeline(import_pipeline())
            .build()
            .await
            .expect("runtime for the job handle")
            .jobs();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        // What `dockhand ui --bind <addr>` serves (its `Host` rule for this port, its outer
        // 404), with the seed's clock and a job handle that knows the pipeline.
        let args = UiArgs {
            bind: addr,
            read_only: false,
            base_path: "/".into(),
            auth: None,
            read_only_auth: None,
            allowed_hosts: Vec::new(),
        };
        let cfg = UiConfig {
            access: Access::Operator,
            clock: Arc::new(clock.clone()),
            jobs: Some(jobs),
            ..args.config(addr)
        };
        let app = standalone_router(Arc::clone(&store), cfg).expect("dashboard router");
        let server = tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        Dashboard {
            url: format!("http://{addr}"),
            port: addr.port(),
            store,
            seeded: Seeded {
                failed,
                pending,
                batch,
            },
            server,
            _dir: dir,
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A headless Chromium session through a chromedriver child process of its own.
pub struct Browser {
    /// The WebDriver client.
    pub client: Client,
    driver: Child,
    /// chromedriver's log (Chromium's console lines included), scanned for CSP violations.
    pub log: PathBuf,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a session with fixed window size, no
    /// background traffic, loopback only, and a fresh profile.
    pub async fn start() -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").port()
        };
        let profile = tempfile::tempdir().expect("profile dir");
        let log = profile.path().join("chromedriver.log");
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .arg(format!("--log-path={}", log.display()))
            .arg("--enable-chrome-logs")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let caps = json!({
            "goog:chromeOptions": {
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-default-apps", "--disable-extensions", "--disable-sync",
                    "--metrics-recording-only", "--no-first-run", "--no-default-browser-check",
                    "--password-store=basic",
                    format!("--user-data-dir={}", profile.path().join("chrome").display()),
                    "--no-proxy-server",
                    // Nothing resolves but loopback, and `rebind.test` (a name the dashboard
                    // does not answer to) resolves to it, as a DNS-rebinding page's would.
                    format!("--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
                    "--window-size=1280,900", "--force-device-scale-factor=1", "--hide-scrollbars",
                    "--force-color-profile=srgb", "--lang=en-US",
                    "--enable-logging=stderr", "--v=0"
                ]
            }
        });
        let mut last_err = String::new();
        // chromedriver takes a moment to listen; try for up to 10 s.
        for _ in 0..100 {
            match Client::connect(port, caps.clone()).await {
                Ok(client) => {
                    return Browser {
                        client,
                        driver,
                        log,
                        _profile: profile,
                    };
                }
                Err(e) => last_err = e.to_string(),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let mut driver = driver;
        let _ = driver.kill();
        let _ = driver.wait();
        panic!("chromedriver did not answer on port {port}: {last_err}");
    }

    /// Whether the browser log holds `needle`.
    pub fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains(needle)
    }

    /// Lines of the browser log that report a Content-Security-Policy violation.
    pub fn csp_violations(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.contains("Content Security Policy") || l.contains("Content-Security-Policy")
            })
            .map(str::to_owned)
            .collect()
    }

    /// Saves a PNG screenshot to `target/e2e-shots/<name>.png`, and, for the shots the README
    /// shows ([`DOCS_SHOTS`]), to `docs/screenshots/` with `DOCKHAND_UPDATE_SCREENSHOTS=1`.
    pub async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut dirs = vec![root.join("target/e2e-shots")];
        if DOCS_SHOTS.contains(&name)
            && std::env::var("DOCKHAND_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1")
        {
            dirs.push(root.join("docs/screenshots"));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).expect("screenshot dir");
            std::fs::write(dir.join(format!("{name}.png")), &png).expect("write screenshot");
        }
    }

    /// Ends the session and stops chromedriver.
    pub async fn close(self) {
        let _ = self.client.close().await;
        // `Drop` stops chromedriver.
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A failed assertion unwinds through here too: no chromedriver outlives its test.
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
