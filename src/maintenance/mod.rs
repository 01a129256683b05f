//! Maintenance: the lease reaper (R1), the schedule materialiser (Q7), retention (Q11) and the
//! renewal of live jobs' item claims (`claims`).
//!
//! Every runner runs the maintenance loop, but each task first takes a cluster-wide lease row
//! (`dockhand_maintenance_leases`) valid for the task's interval, so each task does its work
//! once per cluster per interval. (A lease row rather than a PostgreSQL advisory lock: it
//! gives "once per interval" and not just "one at a time", and works the same on every backend.)

use crate::clock::Clock;
use crate::error::Result;
use crate::store::{DynStore, PruneCutoffs};
use crate::telemetry;
use chrono::Duration;
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

mod claims;

/// Maintenance settings.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// How often the loop wakes. Default 1 s.
    pub tick: std::time::Duration,
    /// Reaper interval. Default 5 s.
    pub reaper_interval: std::time::Duration,
    /// Scheduler interval. Default 1 s.
    pub scheduler_interval: std::time::Duration,
    /// Occurrences up to this far ahead are materialised as pending actions. Default 5 s.
    pub schedule_lookahead: std::time::Duration,
    /// Retention interval. Default 60 s.
    pub retention_interval: std::time::Duration,
    /// Keep complete and canceled actions, and completed, completed_no_items, skipped and
    /// cancelled jobs, this long. Default 7 days.
    pub keep_finished: std::time::Duration,
    /// Keep failed actions and jobs this long. Default 30 days.
    pub keep_failed: std::time::Duration,
    /// Rows per retention or reaper batch. Default 1000.
    pub batch: i64,
    /// Item-claim renewal interval: the claims of live jobs that used half their TTL get a
    /// full TTL again. Default 5 s; keep it well below the shortest claim TTL in use.
    pub claim_renew_interval: std::time::Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            tick: std::time::Duration::from_secs(1),
            reaper_interval: std::time::Duration::from_secs(5),
            scheduler_interval: std::time::Duration::from_secs(1),
            schedule_lookahead: std::time::Duration::from_secs(5),
            retention_interval: std::time::Duration::from_secs(60),
            keep_finished: std::time::Duration::from_secs(7 * 24 * 3600),
            keep_failed: std::time::Duration::from_secs(30 * 24 * 3600),
            batch: 1000,
            claim_renew_interval: std::time::Duration::from_secs(5),
        }
    }
}

/// Most batches of each kind one retention pass deletes.
pub const MAX_PRUNE_BATCHES: usize = 100;
/// A packet batch is this many times the row batch (each reads every stored job's refs).
const PACKET_BATCH_FACTOR: i64 = 10;

/// What one maintenance pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MaintenanceReport {
    /// Expired leases put back to pending.
    pub requeued: u64,
    /// Expired leases failed for lack of attempts.
    pub reaped_failed: u64,
    /// Schedule occurrences materialised.
    pub materialised: u64,
    /// Fixed-delay schedules re-armed.
    pub rearmed: u64,
    /// Finished actions deleted.
    pub pruned: u64,
    /// Final jobs deleted (with [`MaintenanceReport::job_events_pruned`] events and
    /// [`MaintenanceReport::worklist_rows_pruned`] worklist rows).
    pub jobs_pruned: u64,
    /// Lifecycle events of deleted jobs.
    pub job_events_pruned: u64,
    /// Leftover worklist rows of deleted batch parents.
    pub worklist_rows_pruned: u64,
    /// Packets no stored job or worklist row referenced.
    pub packets_pruned: u64,
    /// Job lifecycle events delivered from the outbox.
    pub events_delivered: u64,
    /// Item claims of live jobs renewed.
    pub claims_renewed: u64,
}

/// Runs the maintenance tasks.
pub struct Maintenance {
    store: DynStore,
    clock: Arc<dyn Clock>,
    config: MaintenanceConfig,
    owner: String,
    outbox: Option<Arc<crate::jobs::engine::Engine>>,
}

impl std::fmt::Debug for Maintenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maintenance")
            .field("owner", &self.owner)
            .finish()
    }
}

fn dur(d: std::time::Duration) -> Duration {
    Duration::from_std(d).unwrap_or(Duration::MAX)
}

impl Maintenance {
    /// Maintenance over `store`, leases taken as `owner`.
    pub fn new(
        store: DynStore,
        clock: Arc<dyn Clock>,
        config: MaintenanceConfig,
        owner: String,
    ) -> Self {
        Self {
            store,
            clock,
            config,
            owner,
            outbox: None,
        }
    }

    /// Also sweeps the job lifecycle outbox (replays events a crash left undelivered).
    pub fn with_outbox(mut self, engine: Arc<crate::jobs::engine::Engine>) -> Self {
        self.outbox = Some(engine);
        self
    }

    /// Takes or renews this runtime's listener lease, or reads whether another runtime holds
    /// one ([`crate::jobs::listeners`]). An error is logged and the last view kept (a runtime
    /// with no hook starts out assuming others listen).
    pub(crate) async fn refresh_listeners(&self) {
        if let Some(engine) = &self.outbox {
            let refreshed = engine
                .listeners
                .refresh(&self.store, self.clock.as_ref(), &self.owner)
                .await;
            if let Err(e) = refreshed {
                tracing::warn!(error = %e, "could not refresh the event listeners' lease");
            }
        }
    }

    /// Whether this runtime sweeps the outbox ([`crate::jobs::engine::Engine::sweeps_outbox`]).
    fn sweeps_outbox(&self) -> bool {
        self.outbox.as_ref().is_some_and(|e| e.sweeps_outbox())
    }

    async fn sweep_outbox(&self, report: &mut MaintenanceReport) -> Result<()> {
        if let Some(engine) = &self.outbox {
            report.events_delivered += engine.deliver_events().await? as u64;
        }
        Ok(())
    }

    /// Runs every task whose cluster lease this owner can take now.
    pub async fn run_once(&self) -> Result<MaintenanceReport> {
        let mut report = MaintenanceReport::default();
        let c = &self.config;
        if self.lease("reaper", c.reaper_interval).await? {
            self.reap(&mut report).await?;
        }
        if self.lease("scheduler", c.scheduler_interval).await? {
            self.schedule(&mut report).await?;
        }
        if self.lease("retention", c.retention_interval).await? {
            self.prune(&mut report).await?;
        }
        self.refresh_listeners().await;
        // A runtime with no hook takes the sweep's lease only while no one listens, so it
        // never keeps a listener from sweeping.
        if self.sweeps_outbox() && self.lease("outbox", c.reaper_interval).await? {
            self.sweep_outbox(&mut report).await?;
        }
        if self.lease("claims", c.claim_renew_interval).await? {
            self.renew_claims(&mut report).await?;
        }
        Ok(report)
    }

    /// Runs every task now, without taking cluster leases (tests, `dockhand prune`).
    pub async fn run_all_unguarded(&self) -> Result<MaintenanceReport> {
        let mut report = MaintenanceReport::default();
        self.reap(&mut report).await?;
        self.schedule(&mut report).await?;
        self.prune(&mut report).await?;
        self.refresh_listeners().await;
        self.sweep_outbox(&mut report).await?;
        self.renew_claims(&mut report).await?;
        Ok(report)
    }

    async fn lease(&self, task: &str, interval: std::time::Duration) -> Result<bool> {
        let now = self.clock.now();
        // Expire slightly before the next tick so the holder can renew on time.
        let hold = dur(interval).max(Duration::milliseconds(10)) - Duration::milliseconds(5);
        self.store
            .try_maintenance_lease(task, &self.owner, now + hold, now)
            .await
    }

    /// R1: expired leases back to pending or failed. A step action failed here leaves its
    /// job's `dockhand.job.finish` action (enqueued by the store in the same transaction), so
    /// the job follows through the bridge even when this process stops right after.
    pub async fn reap(&self, report: &mut MaintenanceReport) -> Result<()> {
        async {
            loop {
                let r = self
                    .store
                    .reap_expired(self.clock.now(), self.config.batch)
                    .await?;
                report.requeued += r.requeued;
                report.reaped_failed += r.failed;
                if r.requeued > 0 {
                    metrics::counter!(telemetry::REAPED, "outcome" => "requeued")
                        .increment(r.requeued);
                    tracing::info!(count = r.requeued, "expired leases requeued");
                }
                if r.failed > 0 {
                    metrics::counter!(telemetry::REAPED, "outcome" => "failed").increment(r.failed);
                }
                if ((r.requeued + r.failed) as i64) < self.config.batch {
                    return Ok(());
                }
            }
        }
        .instrument(tracing::debug_span!(
            "dockhand.maintenance",
            task = "reaper"
        ))
        .await
    }

    /// Q7: materialise due schedule occurrences and re-arm finished fixed-delay schedules.
    pub async fn schedule(&self, report: &mut MaintenanceReport) -> Result<()> {
        let now = self.clock.now();
        report.rearmed += self.store.rearm_fixed_delay(now).await?;
        let horizon = now + dur(self.config.schedule_lookahead);
        // Bounded rounds: a short interval may need several occurrences within the horizon.
        for _ in 0..16 {
            let due = self.store.due_schedules(horizon, 100).await?;
            if due.is_empty() {
                break;
            }
            let mut progressed = false;
            for s in due {
                let Some(occurrence) = s.next_run_at else {
                    continue;
                };
                let next = match s.recurrence.next_after_occurrence(occurrence, now) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!(schedule = s.id, error = %e, "schedule cannot compute its next run");
                        continue;
                    }
                };
                if self.store.materialise(&s, occurrence, next, now).await? {
                    report.materialised += 1;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        Ok(())
    }

    /// Q11: delete old finished actions and their logs, then final jobs with their events
    /// and worklist rows, then packets nothing stored references, each in bounded batches
    /// (one transaction per batch; at most [`MAX_PRUNE_BATCHES`] batches of each per pass).
    /// Jobs use the actions' cutoffs: completed, completed_no_items, skipped and cancelled
    /// jobs `keep_finished`, failed ones `keep_failed`. A packet goes once it is unused for
    /// [`crate::jobs::packets::MIN_UNUSED_AGE`] and unreferenced; each packet batch reads the
    /// refs of every stored job, so packets go in larger batches, after the jobs.
    pub async fn prune(&self, report: &mut MaintenanceReport) -> Result<()> {
        let now = self.clock.now();
        let cutoffs = PruneCutoffs {
            finished_before: now - dur(self.config.keep_finished),
            failed_before: now - dur(self.config.keep_failed),
            batch: self.config.batch.max(1),
        };
        for _ in 0..MAX_PRUNE_BATCHES {
            let n = self.store.prune(&cutoffs).await?;
            report.pruned += n;
            if (n as i64) < cutoffs.batch {
                break;
            }
        }
        for _ in 0..MAX_PRUNE_BATCHES {
            let done = self.store.prune_jobs(&cutoffs).await?;
            report.jobs_pruned += done.jobs;
            report.job_events_pruned += done.events;
            report.worklist_rows_pruned += done.worklist_rows;
            if (done.jobs as i64) < cutoffs.batch {
                break;
            }
        }
        let unused_before = now - crate::jobs::packets::MIN_UNUSED_AGE;
        let limit = cutoffs.batch.saturating_mul(PACKET_BATCH_FACTOR);
        for _ in 0..MAX_PRUNE_BATCHES {
            let n = self.store.prune_packets(unused_before, limit).await?;
            report.packets_pruned += n;
            if (n as i64) < limit {
                break;
            }
        }
        Ok(())
    }

    /// True when the last [`Maintenance::prune`] stopped at [`MAX_PRUNE_BATCHES`] of some
    /// kind, so more may remain.
    pub fn prune_may_have_more(&self, report: &MaintenanceReport) -> bool {
        let batch = self.config.batch.max(1) as u64;
        let cap = MAX_PRUNE_BATCHES as u64 * batch;
        report.pruned >= cap
            || report.jobs_pruned >= cap
            || report.packets_pruned >= cap * PACKET_BATCH_FACTOR as u64
    }

    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "maintenance pass failed; will retry");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.tick) => {}
                changed = stop.changed() => {
                    // The runtime's handle is gone without a shutdown: stop as if asked to
                    // (a closed channel is ready at once, so looping on would spin).
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::TestClock;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn the_loop_stops_when_its_stop_channel_is_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite:{}", dir.path().join("m.db").display());
        let store: DynStore = Arc::new(SqliteStore::connect(&url).await.expect("open"));
        store.migrate().await.expect("migrate");
        let clock: Arc<dyn Clock> = Arc::new(TestClock::at(chrono::Utc::now()));
        let m = Arc::new(Maintenance::new(
            store,
            clock,
            MaintenanceConfig::default(),
            "test".into(),
        ));
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(Arc::clone(&m).run(rx));
        tokio::task::yield_now().await;
        drop(tx);
        tokio::time::timeout(std::time::Duration::from_secs(10), task)
            .await
            .expect("the loop ends once its stop channel is gone")
            .expect("no panic");
    }
}
