//! Operational commands: `migrate`, `stats`, `prune` and `run` (a worker for the demo hooks).

use super::args::{format_approx, format_exact, non_negative};
use super::table::{truncate, Table};
use super::{demo, CliError, Output, PruneArgs, RunArgs};
use crate::maintenance::{Maintenance, MaintenanceConfig, MaintenanceReport};
use crate::state::ActionStatus;
use crate::store::redact_url;
use crate::{Queue, Runtime};
use serde_json::json;
use std::sync::Arc;

/// `dockhand migrate`.
pub(crate) async fn migrate(url: &str, q: &Queue, out: Output) -> Result<(), CliError> {
    let backend = q.store().backend();
    q.store().migrate().await?;
    let url = redact_url(url);
    out.emit(
        &json!({"database": url, "backend": backend, "migrated": true}),
        || format!("migrations applied: the {backend} schema at {url} is up to date"),
    )
}

/// `dockhand stats`.
pub(crate) async fn stats(q: &Queue, out: Output) -> Result<(), CliError> {
    let s = q.stats().await?;
    out.emit(&s, || {
        let count = |m: &std::collections::BTreeMap<String, i64>, st: ActionStatus| {
            m.get(st.as_str()).copied().unwrap_or(0)
        };
        let mut by_status = Table::new(&["STATUS", "COUNT"]).right_align(&[1]);
        for st in ActionStatus::ALL {
            by_status.row(vec![st.to_string(), count(&s.by_status, st).to_string()]);
        }
        let total: i64 = s.by_status.values().sum();
        by_status.row(vec!["total".into(), total.to_string()]);
        let mut text = by_status.render();

        let mut headers = vec!["GROUP"];
        headers.extend(ActionStatus::ALL.iter().map(|s| s.as_str()));
        headers.push("total");
        let headers: Vec<String> = headers.iter().map(|h| h.to_uppercase()).collect();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        let mut by_group = Table::new(&headers).right_align(&[1, 2, 3, 4, 5, 6]);
        for (group, counts) in &s.by_group {
            let mut row = vec![if group.is_empty() {
                "(none)".to_string()
            } else {
                truncate(group, 40)
            }];
            row.extend(
                ActionStatus::ALL
                    .iter()
                    .map(|st| count(counts, *st).to_string()),
            );
            row.push(counts.values().sum::<i64>().to_string());
            by_group.row(row);
        }
        if !by_group.is_empty() {
            text.push('\n');
            text.push_str(&by_group.render());
        }
        text.push('\n');
        match s.oldest_due_lag_ms {
            Some(lag) if s.past_due > 0 => text.push_str(&format!(
                "past due: {} pending action(s) are due now; the oldest has waited {}\n",
                s.past_due,
                format_approx(lag.max(0))
            )),
            _ => text.push_str("past due: none\n"),
        }
        text
    })
}

/// `dockhand prune`.
pub(crate) async fn prune(q: &Queue, a: &PruneArgs, out: Output) -> Result<(), CliError> {
    let defaults = MaintenanceConfig::default();
    let keep_finished = match a.keep_finished {
        Some(d) => non_negative("keep_finished", d)?,
        None => defaults.keep_finished,
    };
    let keep_failed = match a.keep_failed {
        Some(d) => non_negative("keep_failed", d)?,
        None => defaults.keep_failed,
    };
    let config = MaintenanceConfig {
        keep_finished,
        keep_failed,
        ..defaults
    };
    let owner = format!("dockhand-cli:{}", std::process::id());
    let m = Maintenance::new(Arc::clone(q.store()), Arc::clone(q.clock()), config, owner);
    let mut report = MaintenanceReport::default();
    m.prune(&mut report).await?;
    let more = m.prune_may_have_more(&report);
    let (kf, kx) = (
        format_exact(keep_finished.as_millis().min(i64::MAX as u128) as i64),
        format_exact(keep_failed.as_millis().min(i64::MAX as u128) as i64),
    );
    out.emit(
        &json!({
            "pruned": report.pruned,
            "jobs_pruned": report.jobs_pruned,
            "job_events_pruned": report.job_events_pruned,
            "worklist_rows_pruned": report.worklist_rows_pruned,
            "packets_pruned": report.packets_pruned,
            "more_may_remain": more,
            "keep_finished_ms": keep_finished.as_millis() as u64,
            "keep_failed_ms": keep_failed.as_millis() as u64,
        }),
        || {
            let mut text = format!(
                "deleted {} action(s) with their logs and {} job(s) with {} event(s) and {} \
                 worklist row(s): complete/completed or canceled/cancelled more than {kf} ago, \
                 failed more than {kx} ago\ndeleted {} packet(s) no stored job referenced",
                report.pruned,
                report.jobs_pruned,
                report.job_events_pruned,
                report.worklist_rows_pruned,
                report.packets_pruned
            );
            if more {
                text.push_str("\nmore may remain; run `dockhand prune` again");
            }
            text
        },
    )
}

/// Waits for Ctrl-C (SIGINT) or, on Unix, SIGTERM (what process managers send).
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

/// `dockhand run`: a worker for the demo hooks until Ctrl-C, then a graceful shutdown.
pub(crate) async fn run_worker(url: &str, a: &RunArgs, out: Output) -> Result<(), CliError> {
    let runtime = demo::register_demo_hooks(Runtime::builder(url))
        .concurrency(a.concurrency as usize)
        .prefetch(a.prefetch as usize)
        .only_registered_hooks(true)
        .build()
        .await?;
    // Listen before starting: a bad --metrics-bind stops here, before any action is claimed.
    let exporter = match a.metrics_bind {
        Some(addr) => Some(metrics_endpoint(addr).await?),
        None => None,
    };
    let handle = runtime.start().await?;
    let exporter = exporter.map(|(listener, metrics)| {
        let clock: Arc<dyn crate::Clock> = match runtime.database_clock() {
            Some(c) => c.clone(),
            None => Arc::new(crate::SystemClock),
        };
        [
            tokio::spawn(crate::prometheus::serve(listener, metrics)),
            crate::prometheus::spawn_gauges(runtime.store().clone(), clock, a.metrics_interval),
        ]
    });
    eprintln!(
        "dockhand worker on {} (hooks: {}; concurrency {}); stop with Ctrl-C or SIGTERM",
        redact_url(url),
        runtime.hooks().join(", "),
        a.concurrency
    );
    let stop = tokio::select! {
        signal = stop_signal() => Ok(signal),
        refused = refused_writes(runtime.store()) => Err(refused),
    };
    eprintln!("stopping: waiting for in-flight actions to finish…");
    handle.shutdown().await;
    for task in exporter.into_iter().flatten() {
        task.abort();
    }
    runtime.store().close().await;
    match stop {
        Ok(signal) => {
            signal.map_err(|e| CliError::Failed(format!("cannot wait for a stop signal: {e}")))?
        }
        Err(e) => {
            return Err(CliError::Failed(format!(
                "stopping: the database refuses writes for good ({e}); fix its permissions or \
                 --database-url and start the worker again"
            )))
        }
    }
    out.emit(&json!({"stopped": true}), || "worker stopped".into())
}

/// `--metrics-bind`: the installed recorder and a listener on `addr` (its bound address
/// printed, for port 0), or an error naming the flag.
async fn metrics_endpoint(
    addr: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, crate::prometheus::MetricsHandle), CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::Failed(format!("cannot listen on --metrics-bind {addr}: {e}")))?;
    let bound = listener.local_addr().map_err(|e| {
        CliError::Failed(format!(
            "cannot read the --metrics-bind address {addr}: {e}"
        ))
    })?;
    let metrics = crate::prometheus::install()?;
    eprintln!("metrics on http://{bound}/metrics");
    Ok((listener, metrics))
}

/// How often `run` checks that the database still takes writes.
const WRITE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves with the first permanent write error ([`crate::Error::is_permanent`]: a read-only
/// SQLite file, a read-only server, a permission denied) of an idempotent write transaction
/// the maintenance loop also runs (re-arming fixed-delay schedules), tried at once and every
/// [`WRITE_CHECK_EVERY`]; transient errors are retried, so it never resolves on a healthy or
/// briefly unreachable database. The worker itself only logs its failed writes and retries,
/// which would loop forever on a database it can never write.
async fn refused_writes(store: &crate::store::DynStore) -> crate::Error {
    loop {
        match store.rearm_fixed_delay(chrono::Utc::now()).await {
            Err(e) if e.is_permanent() => return e,
            Err(e) => tracing::warn!(error = %e, "write check failed; retrying"),
            Ok(_) => {}
        }
        tokio::time::sleep(WRITE_CHECK_EVERY).await;
    }
}
