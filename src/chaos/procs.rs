//! The chaos run's worker processes: spawning `dockhand chaos-worker` children, signalling them
//! (SIGKILL, SIGSTOP/SIGCONT, SIGUSR1, SIGTERM), restarting the ones that died, and reading
//! their stderr into a log file per worker while counting the lines the checker needs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the workers wrote that the checker counts.
#[derive(Debug, Default)]
pub struct Counters {
    /// "lease lost" warnings: late finishes fenced out.
    pub lease_lost: AtomicU64,
    /// Stale claim completions rejected.
    pub stale_claims: AtomicU64,
    /// Processes that stopped at a crash point (exit status 86).
    pub crash_exits: AtomicU64,
    /// Pool-exhaustion faults carried out.
    pub pool_exhausted: AtomicU64,
    /// `(worker, measured clock offset ms)` per process start.
    pub offsets: Mutex<Vec<(String, i64)>>,
}

/// How one worker slot is started.
#[derive(Debug, Clone)]
pub struct SlotSpec {
    /// Its name (lease owners are `<name>-<pid>`).
    pub name: String,
    /// Clock skew in ms.
    pub skew_ms: i64,
    /// `FAILPOINTS` for it, if any.
    pub failpoints: Option<String>,
}

struct Slot {
    spec: SlotSpec,
    child: Option<Child>,
    ready: Arc<AtomicBool>,
    starts: u64,
}

/// The worker processes of a run.
pub struct Workers {
    exe: PathBuf,
    url: String,
    args: Vec<String>,
    log_dir: PathBuf,
    slots: Vec<Slot>,
    /// Shared counters.
    pub counters: Arc<Counters>,
}

fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Workers {
    /// Workers of `exe chaos-worker <args>` on `url`, logging into `log_dir`; none started.
    pub fn new(exe: PathBuf, url: &str, args: Vec<String>, log_dir: &Path) -> Self {
        Self {
            exe,
            url: url.to_string(),
            args,
            log_dir: log_dir.to_path_buf(),
            slots: Vec::new(),
            counters: Arc::new(Counters::default()),
        }
    }

    /// Adds a slot and starts its process.
    pub fn add(&mut self, spec: SlotSpec) -> std::io::Result<usize> {
        self.slots.push(Slot {
            spec,
            child: None,
            ready: Arc::new(AtomicBool::new(false)),
            starts: 0,
        });
        let i = self.slots.len() - 1;
        self.start(i)?;
        Ok(i)
    }

    /// How many slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn start(&mut self, i: usize) -> std::io::Result<()> {
        let slot = &mut self.slots[i];
        slot.starts += 1;
        let mut cmd = Command::new(&self.exe);
        cmd.args(["--database-url", &self.url, "chaos-worker", "--name"])
            .arg(&slot.spec.name)
            .arg(format!("--clock-skew-ms={}", slot.spec.skew_ms))
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(fp) = &slot.spec.failpoints {
            cmd.env("FAILPOINTS", fp);
        }
        let mut child = cmd.spawn()?;
        let ready = Arc::new(AtomicBool::new(false));
        slot.ready = Arc::clone(&ready);
        let stderr = child.stderr.take();
        let name = slot.spec.name.clone();
        let log_path = self.log_dir.join(format!("{name}.log"));
        let counters = Arc::clone(&self.counters);
        let generation = slot.starts;
        std::thread::spawn(move || {
            let mut log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log_path)
                .ok();
            if let Some(l) = log.as_mut() {
                let _ = writeln!(l, "--- start {generation}");
            }
            let Some(stderr) = stderr else { return };
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(l) = log.as_mut() {
                    let _ = writeln!(l, "{line}");
                }
                if line.contains("chaos worker ready") {
                    ready.store(true, Ordering::SeqCst);
                } else if line.contains("lease lost") {
                    counters.lease_lost.fetch_add(1, Ordering::Relaxed);
                } else if line.contains("stale claim completion rejected") {
                    counters.stale_claims.fetch_add(1, Ordering::Relaxed);
                } else if line.contains("pool exhausted: held") {
                    counters.pool_exhausted.fetch_add(1, Ordering::Relaxed);
                } else if let Some(rest) = line.strip_prefix("clock offset ") {
                    if let Some(ms) = rest.split_whitespace().next().and_then(|v| v.parse().ok()) {
                        if let Ok(mut o) = counters.offsets.lock() {
                            o.push((name.clone(), ms));
                        }
                    }
                }
            }
        });
        slot.child = Some(child);
        Ok(())
    }

    /// Whether every slot's current process has said it is ready.
    pub fn all_ready(&self) -> bool {
        self.slots.iter().all(|s| s.ready.load(Ordering::SeqCst))
    }

    /// Slot `i`'s process id, when it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.slots.get(i)?.child.as_ref().map(Child::id)
    }

    /// Slot `i`'s current lease owner name.
    pub fn owner(&self, i: usize) -> Option<String> {
        let pid = self.pid(i)?;
        Some(format!("{}-{pid}", self.slots[i].spec.name))
    }

    /// Slot `i`'s spec.
    pub fn spec(&self, i: usize) -> Option<&SlotSpec> {
        self.slots.get(i).map(|s| &s.spec)
    }

    /// SIGKILLs slot `i` and starts it again; returns the killed process's owner name.
    pub fn kill_and_restart(&mut self, i: usize) -> std::io::Result<Option<String>> {
        let owner = self.owner(i);
        if let Some(mut child) = self.slots[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.start(i)?;
        Ok(owner)
    }

    /// Sends `sig` (`-STOP`, `-CONT`, `-USR1`, `-TERM`) to slot `i`.
    pub fn signal(&self, i: usize, sig: &str) -> bool {
        self.pid(i).is_some_and(|pid| signal(pid, sig))
    }

    /// Restarts every slot whose process has exited; returns the exits as (slot, code). Exits
    /// at a crash point are counted.
    pub fn restart_exited(&mut self) -> Vec<(usize, Option<i32>)> {
        let mut exited = Vec::new();
        for i in 0..self.slots.len() {
            let status = match self.slots[i].child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(st))) => st,
                _ => continue,
            };
            if status.code() == Some(crate::failpoint::CRASH_EXIT_CODE) {
                self.counters.crash_exits.fetch_add(1, Ordering::Relaxed);
            }
            exited.push((i, status.code()));
            self.slots[i].child = None;
            if let Err(e) = self.start(i) {
                eprintln!("chaos: cannot restart worker {i}: {e}");
            }
        }
        exited
    }

    /// Replaces every slot's spec (e.g. clean workers for the drain) and restarts them all
    /// gracefully: SIGCONT, SIGTERM, wait, start.
    pub fn replace_all(&mut self, specs: Vec<SlotSpec>) -> std::io::Result<()> {
        self.stop_all();
        self.slots.clear();
        for s in specs {
            self.add(s)?;
        }
        Ok(())
    }

    /// SIGCONT then SIGTERM every process and waits for it (SIGKILL after 20 s).
    pub fn stop_all(&mut self) {
        for i in 0..self.slots.len() {
            self.signal(i, "-CONT");
            self.signal(i, "-TERM");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if std::time::Instant::now() < deadline => {
                            std::thread::sleep(std::time::Duration::from_millis(50))
                        }
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
