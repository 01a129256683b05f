//! Prometheus export of the [`metrics`] facade: a recorder installed once per process
//! ([`install`]), its text rendering ([`MetricsHandle::render`]), a minimal HTTP endpoint that
//! serves it ([`serve`], what `dockhand run --metrics-bind ADDR` runs), and the gauges read
//! from the database at an interval ([`GaugeRefresher`], [`spawn_gauges`]).
//!
//! Every metric name is a constant in [`crate::telemetry`], whose docs (and the README) list
//! them with their type, labels and meaning. Histograms use the buckets [`BUCKETS`] (1 ms to
//! 10 min), so handler durations, lags and store round trips of milliseconds and of seconds
//! both land in a bucket of their own.
//!
//! The recorder is global (the `metrics` facade has one per process): [`install`] installs it
//! the first time and hands out the same handle afterwards; it fails only when another
//! recorder was installed first.
//!
//! ```no_run
//! # async fn demo(store: dockhand::DynStore) -> Result<(), Box<dyn std::error::Error>> {
//! let handle = dockhand::prometheus::install()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9187").await?;
//! tokio::spawn(dockhand::prometheus::serve(listener, handle.clone()));
//! let _gauges = dockhand::prometheus::spawn_gauges(
//!     store,
//!     std::sync::Arc::new(dockhand::SystemClock),
//!     std::time::Duration::from_secs(15),
//! );
//! # Ok(()) }
//! ```

mod gauges;
mod http;

pub use gauges::{spawn_gauges, GaugeRefresher, DEFAULT_GAUGE_INTERVAL};
pub use http::{serve, CONTENT_TYPE};

use crate::error::{Error, Result};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::Mutex;
use std::time::Duration;

/// Histogram buckets, in seconds, of every dockhand histogram: 1 ms to 10 minutes.
pub const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// How often the installed recorder's histograms are compacted ([`PrometheusHandle`]'s
/// upkeep), on a thread of its own.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The installed Prometheus recorder: renders everything recorded in this process so far.
#[derive(Clone)]
pub struct MetricsHandle {
    inner: PrometheusHandle,
}

impl MetricsHandle {
    /// The Prometheus text exposition format (version 0.0.4) of every metric recorded.
    pub fn render(&self) -> String {
        self.inner.render()
    }
}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHandle").finish_non_exhaustive()
    }
}

static INSTALLED: Mutex<Option<MetricsHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder as this process's `metrics` recorder (with [`BUCKETS`])
/// and returns its handle; later calls return the same handle. Fails when another recorder
/// was installed first.
pub fn install() -> Result<MetricsHandle> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = installed.as_ref() {
        return Ok(h.clone());
    }
    let recorder = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .map_err(|e| Error::Config(format!("prometheus buckets: {e}")))?
        .build_recorder();
    let handle = MetricsHandle {
        inner: recorder.handle(),
    };
    metrics::set_global_recorder(recorder).map_err(|_| {
        Error::Config("another metrics recorder is installed in this process".into())
    })?;
    let upkeep = handle.inner.clone();
    std::thread::Builder::new()
        .name("dockhand-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        })
        .map_err(|e| Error::Config(format!("cannot start the metrics upkeep thread: {e}")))?;
    *installed = Some(handle.clone());
    Ok(handle)
}
