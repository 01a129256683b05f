//! The runner: the worker pool that claims due actions in batches sized to its free slots,
//! runs their handlers, heartbeats their leases and finishes them with owner-guarded writes.
//!
//! - `execute`: one run of one claimed action (timeout, panic capture, outcome → [`Finish`]).
//! - this module: the claim loop, heartbeats, wake-ups and graceful shutdown (Q12).

mod acks;
mod execute;

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::error::Result;
use crate::handler::Registry;
use crate::queue::Queue;
use crate::store::{ClaimRequest, ClaimedAction, DynStore, Finish, Lease, Routing};
use crate::telemetry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Runner settings.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Actions run at once (the number of slots). Default 10.
    pub concurrency: usize,
    /// How often an idle runner looks for due actions when no wake-up arrives. Default 1 s.
    pub poll_interval: Duration,
    /// How long a claim's lease lasts without a heartbeat. Default 30 s.
    pub lease: Duration,
    /// How often leases of in-flight actions are extended. Default 10 s.
    pub heartbeat_interval: Duration,
    /// How long shutdown waits for in-flight handlers before giving their leases back.
    /// Default 30 s.
    pub shutdown_timeout: Duration,
    /// Timeout for actions that have none of their own. Default 5 min; `None` = unlimited.
    pub default_timeout: Option<Duration>,
    /// Retry delays.
    pub backoff: Backoff,
    /// This runner's owner id, stamped on every lease.
    pub owner: String,
    /// Claim only actions whose hook has a handler here (for several services sharing one
    /// queue). Default false: Action Scheduler's behaviour, where an action nobody handles
    /// fails with an "unknown hook" error instead of waiting forever.
    pub only_registered_hooks: bool,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            concurrency: 10,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            default_timeout: Some(Duration::from_secs(300)),
            backoff: Backoff::default(),
            owner: default_owner(),
            only_registered_hooks: false,
        }
    }
}

/// `host:pid:random`, unique per runner.
pub fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}:{}:{}", std::process::id(), &id[..8])
}

/// In-flight runs by action id: their lease and the task's abort handle.
/// Leases in flight, heartbeated until their finish is written; the abort handle is `None`
/// once the handler has ended (the run is only waiting for its finish write, so shutdown must
/// not abort or release it).
type InFlight = Arc<Mutex<HashMap<i64, (Lease, Option<tokio::task::AbortHandle>)>>>;

/// A run's concurrency slot. Dropped when the handler ends: frees the slot for the next claim
/// and marks the run as finishing in the in-flight registry.
pub(crate) struct RunSlot {
    _permit: OwnedSemaphorePermit,
    in_flight: InFlight,
    id: i64,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        if let Some(entry) = lock(&self.in_flight).get_mut(&self.id) {
            entry.1 = None;
        }
    }
}

/// The worker pool.
pub struct Runner {
    pub(crate) store: DynStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: RunnerConfig,
    pub(crate) queue: Queue,
    /// The hook filter for claims (`Some` when `only_registered_hooks`).
    pub(crate) claim_hooks: Option<Vec<String>>,
    /// The routed hooks and the groups this runner takes them from (the job engine's
    /// actions, by pipeline); see [`crate::store::Routing`].
    pub(crate) routing: (Vec<String>, Vec<String>),
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("owner", &self.config.owner)
            .field("hooks", &self.registry)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runner {
    fn claim_request(&self, limit: usize) -> (chrono::DateTime<chrono::Utc>, i64) {
        (self.clock.now(), limit as i64)
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedAction>> {
        let (now, limit) = self.claim_request(limit);
        let lease =
            chrono::Duration::from_std(self.config.lease).unwrap_or(chrono::Duration::seconds(30));
        let claimed = self
            .store
            .claim(&ClaimRequest {
                owner: &self.config.owner,
                limit,
                now,
                lease_until: now + lease,
                hooks: self.claim_hooks.as_deref(),
                routing: Some(Routing {
                    hooks: &self.routing.0,
                    groups: &self.routing.1,
                }),
            })
            .await?;
        if !claimed.is_empty() {
            metrics::counter!(telemetry::CLAIMED).increment(claimed.len() as u64);
        }
        Ok(claimed)
    }

    /// Testing helper: claims what is due now (up to the concurrency) and runs it to the end,
    /// inline. Returns how many actions ran.
    pub async fn run_due_once(self: &Arc<Self>) -> Result<usize> {
        let claimed = self.claim(self.config.concurrency).await?;
        let n = claimed.len();
        let mut set = JoinSet::new();
        for action in claimed {
            let me = Arc::clone(self);
            set.spawn(async move { me.execute(action, None, None).await });
        }
        while set.join_next().await.is_some() {}
        Ok(n)
    }

    /// The claim loop; returns after `stop` turns true and in-flight work is settled.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let in_flight: InFlight = Arc::default();
        let heartbeat = tokio::spawn(Arc::clone(&self).heartbeat_loop(Arc::clone(&in_flight)));
        let (ack_tx, ack_rx) = tokio::sync::mpsc::channel(1024);
        let ack_writer = tokio::spawn(acks::writer(
            Arc::clone(&self.store),
            Arc::clone(&self.clock),
            ack_rx,
        ));
        let mut wake = self.store.wakeups();
        let mut tasks = JoinSet::new();
        let mut error_pause = Duration::from_millis(50);
        loop {
            if *stop.borrow() {
                break;
            }
            // Reap finished tasks so the set does not grow.
            while tasks.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    permit = slots.acquire() => drop(permit),
                    _ = stop.changed() => {}
                }
                continue;
            }
            wake.borrow_and_update();
            let claimed = match self.claim(free).await {
                Ok(c) => {
                    error_pause = Duration::from_millis(50);
                    c
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(error_pause) => {}
                        _ = stop.changed() => {}
                    }
                    error_pause = (error_pause * 2)
                        .min(self.config.poll_interval.max(Duration::from_millis(100)));
                    continue;
                }
            };
            let full = claimed.len() == free;
            for action in claimed {
                crate::failpoint::crash("runner.after_claim");
                let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                    // Cannot happen (we claimed at most `free`); give the lease back.
                    let _ = self
                        .store
                        .finish(action.lease(), &Finish::Release, self.clock.now())
                        .await;
                    continue;
                };
                let lease = action.lease();
                let me = Arc::clone(&self);
                let registry = Arc::clone(&in_flight);
                let acker = ack_tx.clone();
                let slot = RunSlot {
                    _permit: permit,
                    in_flight: Arc::clone(&in_flight),
                    id: lease.id,
                };
                // Registered under the lock, so the run cannot end before it is registered.
                let mut registered = lock(&in_flight);
                let handle = tasks.spawn(async move {
                    me.execute(action, Some(&acker), Some(slot)).await;
                    lock(&registry).remove(&lease.id);
                });
                registered.insert(lease.id, (lease, Some(handle)));
                drop(registered);
            }
            if full {
                continue;
            }
            tokio::select! {
                _ = wake.changed() => {}
                _ = tokio::time::sleep(self.config.poll_interval) => {}
                _ = stop.changed() => {}
            }
        }
        self.settle_on_shutdown(slots, in_flight, tasks).await;
        // Every run has ended: close the queue and let the writer flush what is left.
        drop(ack_tx);
        if let Err(e) = ack_writer.await {
            tracing::error!(error = %e, "acknowledgement writer ended abnormally");
        }
        heartbeat.abort();
    }

    /// Q12: wait for in-flight handlers up to the deadline, then give the rest back.
    async fn settle_on_shutdown(
        &self,
        slots: Arc<Semaphore>,
        in_flight: InFlight,
        mut tasks: JoinSet<()>,
    ) {
        let all = self.config.concurrency.max(1) as u32;
        let drained =
            tokio::time::timeout(self.config.shutdown_timeout, slots.acquire_many(all)).await;
        if drained.is_ok() {
            while tasks.join_next().await.is_some() {}
            return;
        }
        // Runs whose handler has ended are only waiting for their finish write: leave them.
        let leftovers: Vec<(Lease, tokio::task::AbortHandle)> = lock(&in_flight)
            .values()
            .filter_map(|(lease, handle)| handle.clone().map(|h| (*lease, h)))
            .collect();
        for (_, handle) in &leftovers {
            handle.abort();
        }
        while tasks.join_next().await.is_some() {}
        for (lease, _) in leftovers {
            match self
                .store
                .finish(lease, &Finish::Release, self.clock.now())
                .await
            {
                Ok(_) => tracing::info!(action_id = lease.id, "lease given back at shutdown"),
                Err(e) => {
                    tracing::warn!(action_id = lease.id, error = %e, "could not give lease back; the reaper will")
                }
            }
        }
    }

    async fn heartbeat_loop(self: Arc<Self>, in_flight: InFlight) {
        let lease =
            chrono::Duration::from_std(self.config.lease).unwrap_or(chrono::Duration::seconds(30));
        let mut tick = tokio::time::interval(
            self.config
                .heartbeat_interval
                .max(Duration::from_millis(10)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let leases: Vec<Lease> = lock(&in_flight).values().map(|(l, _)| *l).collect();
            if leases.is_empty() {
                continue;
            }
            let now = self.clock.now();
            if let Err(e) = self
                .store
                .heartbeat(&self.config.owner, &leases, now + lease)
                .await
            {
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
    }
}
