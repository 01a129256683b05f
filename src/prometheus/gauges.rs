//! The gauges read from the database: one [`crate::Store::metrics_gauges`] query per refresh
//! (per group: pending, due, running and failed actions and the oldest due lag; processing
//! jobs, open batches, held item claims), set on the `metrics` facade.
//!
//! They describe the whole database, not this process: every process that refreshes them
//! exports the same values, so a dashboard aggregates them with `max`, not `sum`. A group
//! that no longer has any such action is set to 0 by the next refresh rather than left at its
//! last value.

use crate::clock::Clock;
use crate::error::Result;
use crate::store::{DynStore, MetricsGauges, Store};
use crate::telemetry;
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// The refresh interval `dockhand run` and `dockhand ui` use unless told otherwise.
pub const DEFAULT_GAUGE_INTERVAL: Duration = Duration::from_secs(15);

/// Sets the database gauges from one query per [`GaugeRefresher::refresh`], and zeroes the
/// groups it reported before that are gone.
#[derive(Debug, Default)]
pub struct GaugeRefresher {
    /// The `group` label values set by the last refresh.
    reported: BTreeSet<String>,
}

impl GaugeRefresher {
    /// A refresher that has reported nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the gauges at `now` (one query) and sets them; returns what it read.
    pub async fn refresh(
        &mut self,
        store: &dyn Store,
        now: DateTime<Utc>,
    ) -> Result<MetricsGauges> {
        let g = store.metrics_gauges(now).await?;
        self.set(&g, now);
        Ok(g)
    }

    /// Sets the gauges from a snapshot read at `now`.
    pub fn set(&mut self, g: &MetricsGauges, now: DateTime<Utc>) {
        let mut seen = BTreeSet::new();
        for row in &g.groups {
            let group = row.group.clone().unwrap_or_default();
            let lag = row
                .oldest_due
                .map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1000.0);
            set_group(&group, row.pending, row.due, row.running, row.failed, lag);
            seen.insert(group);
        }
        for gone in self.reported.difference(&seen) {
            set_group(gone, 0, 0, 0, 0, 0.0);
        }
        self.reported = seen;
        metrics::gauge!(telemetry::JOBS_PROCESSING).set(g.jobs_processing as f64);
        metrics::gauge!(telemetry::BATCHES_OPEN).set(g.batches_open as f64);
        metrics::gauge!(telemetry::CLAIMS_HELD).set(g.claims_held as f64);
    }
}

fn set_group(group: &str, pending: i64, due: i64, running: i64, failed: i64, lag: f64) {
    for (status, n) in [
        ("pending", pending),
        ("running", running),
        ("failed", failed),
    ] {
        metrics::gauge!(telemetry::ACTIONS, "group" => group.to_string(), "status" => status)
            .set(n as f64);
    }
    metrics::gauge!(telemetry::ACTIONS_DUE, "group" => group.to_string()).set(due as f64);
    metrics::gauge!(telemetry::OLDEST_DUE_LAG, "group" => group.to_string()).set(lag);
}

/// Refreshes the gauges now and then every `every` on a task of its own (a failed read is
/// logged and tried again at the next tick), until the handle is aborted.
pub fn spawn_gauges(
    store: DynStore,
    clock: Arc<dyn Clock>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut refresher = GaugeRefresher::new();
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = refresher.refresh(store.as_ref(), clock.now()).await {
                tracing::warn!(error = %e, "metrics gauges: refresh failed");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::GroupGauges;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_group_that_is_gone_is_set_to_zero_and_lag_is_measured_at_now() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let now = DateTime::<Utc>::from_timestamp(1_774_612_800, 0).unwrap_or_default();
        let mut r = GaugeRefresher::new();
        let first = MetricsGauges {
            groups: vec![
                GroupGauges {
                    group: Some("mail".into()),
                    pending: 4,
                    due: 2,
                    running: 1,
                    failed: 3,
                    oldest_due: Some(now - chrono::Duration::milliseconds(2500)),
                },
                GroupGauges {
                    group: None,
                    pending: 1,
                    ..GroupGauges::default()
                },
            ],
            jobs_processing: 2,
            batches_open: 1,
            claims_held: 7,
        };
        metrics::with_local_recorder(&recorder, || r.set(&first, now));
        let text = handle.render();
        let v = |s: &str| value(&text, s);
        assert_eq!(
            v(r#"dockhand_actions{group="mail",status="pending"}"#),
            Some(4.0)
        );
        assert_eq!(
            v(r#"dockhand_actions{group="mail",status="failed"}"#),
            Some(3.0)
        );
        assert_eq!(
            v(r#"dockhand_actions{group="",status="pending"}"#),
            Some(1.0)
        );
        assert_eq!(v(r#"dockhand_actions_due{group="mail"}"#), Some(2.0));
        assert_eq!(
            v(r#"dockhand_oldest_due_lag_seconds{group="mail"}"#),
            Some(2.5)
        );
        assert_eq!(v("dockhand_item_claims_held"), Some(7.0));
        // The next read has no `mail` row: its series go to 0 instead of keeping 4.
        let second = MetricsGauges::default();
        metrics::with_local_recorder(&recorder, || r.set(&second, now));
        let text = handle.render();
        let v = |s: &str| value(&text, s);
        assert_eq!(
            v(r#"dockhand_actions{group="mail",status="pending"}"#),
            Some(0.0)
        );
        assert_eq!(
            v(r#"dockhand_oldest_due_lag_seconds{group="mail"}"#),
            Some(0.0)
        );
        assert_eq!(v("dockhand_item_claims_held"), Some(0.0));
    }
}
