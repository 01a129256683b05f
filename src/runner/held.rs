//! The leases a runner holds, buffered or running, and the heartbeat that keeps them.
//!
//! Every claimed action is registered here until its finish is written: *buffered* (claimed
//! ahead, waiting for a slot), then *running* (its handler runs; the abort handle lets
//! shutdown stop it), then *finishing* (handler ended, finish write pending: its slot is free
//! already). The heartbeat extends all of them. A buffered action whose lease would expire
//! before the next heartbeat could extend it (heartbeats failing) is given back (pending
//! again, attempt not counted) and dropped from the registry, so it is never started after
//! its lease could have lapsed; one the store no longer holds for us (canceled, or reclaimed)
//! is dropped without running. The claim loop starts a buffered action only if it is still
//! registered as buffered here.

use super::acks::{AckRequest, AckSender};
use super::{lock, Runner};
use crate::store::{Finish, Lease};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::AbortHandle;

/// Where a held action is in its life on this runner.
#[derive(Debug)]
pub(crate) enum Stage {
    /// Claimed ahead, waiting for a slot.
    Buffered,
    /// Started; the handle aborts its run (shutdown deadline).
    Running(AbortHandle),
    /// The handler has ended; only its finish write is pending (shutdown leaves it alone).
    Finishing,
}

/// One held lease.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) lease: Lease,
    /// When the lease expires, as far as this runner knows (claim or last heartbeat).
    pub(crate) until: DateTime<Utc>,
    pub(crate) stage: Stage,
}

/// The registry of held leases by action id.
pub(crate) type Leases = Arc<Mutex<HashMap<i64, Held>>>;

/// A run's concurrency slot. Dropped when the handler ends: frees the slot for the next action
/// and marks the run as finishing in the registry.
pub(crate) struct RunSlot {
    pub(crate) _permit: OwnedSemaphorePermit,
    pub(crate) leases: Leases,
    pub(crate) id: i64,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        if let Some(held) = lock(&self.leases).get_mut(&self.id) {
            held.stage = Stage::Finishing;
        }
    }
}

/// Whether a buffered lease expiring at `until` may still be started at `now`: the next
/// heartbeat is up to `margin` away.
pub(crate) fn startable(
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    margin: chrono::Duration,
) -> bool {
    until > now + margin
}

/// A fire-and-forget give-back (Finish::Release) for the claim loop's next round.
pub(crate) fn release_request(lease: Lease) -> AckRequest {
    let (reply, _) = tokio::sync::oneshot::channel();
    AckRequest {
        lease,
        outcome: Finish::Release,
        reply,
    }
}

impl Runner {
    /// How long a claim's lease lasts.
    pub(crate) fn lease_len(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.config.lease).unwrap_or(chrono::Duration::seconds(30))
    }

    /// How far from expiry a buffered lease is given back instead of started: the next
    /// heartbeat may be a whole interval away (at most half the lease, so a misconfigured
    /// heartbeat cannot make every buffered action look lapsed).
    pub(crate) fn lapse_margin(&self) -> chrono::Duration {
        let beat = chrono::Duration::from_std(self.config.heartbeat_interval)
            .unwrap_or(chrono::Duration::seconds(10));
        beat.min(self.lease_len() / 2)
    }

    /// Extends every held lease each heartbeat interval and gives back buffered ones that
    /// would lapse before they start. Runs until aborted.
    pub(crate) async fn heartbeat_loop(self: Arc<Self>, leases: Leases, give_back: AckSender) {
        let mut tick = tokio::time::interval(
            self.config
                .heartbeat_interval
                .max(Duration::from_millis(10)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (buffered, running): (Vec<Lease>, Vec<Lease>) = {
                let held = lock(&leases);
                let mut b = Vec::new();
                let mut r = Vec::new();
                for h in held.values() {
                    match h.stage {
                        Stage::Buffered => b.push(h.lease),
                        _ => r.push(h.lease),
                    }
                }
                (b, r)
            };
            let now = self.clock.now();
            let until = now + self.lease_len();
            if !running.is_empty() {
                if let Err(e) = self
                    .store
                    .heartbeat(&self.config.owner, &running, until)
                    .await
                {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
            }
            if !buffered.is_empty() {
                self.beat_buffered(&leases, &buffered, until).await;
            }
            for lease in lapsing(&leases, self.clock.now(), self.lapse_margin()) {
                tracing::info!(
                    action_id = lease.id,
                    "buffered lease would lapse before it starts; giving it back"
                );
                if give_back.send(release_request(lease)).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Extends the buffered leases; when the store holds fewer than were sent, finds out
    /// which one by one and drops the lost ones (canceled or reclaimed: never started here).
    async fn beat_buffered(&self, leases: &Leases, buffered: &[Lease], until: DateTime<Utc>) {
        let owner = &self.config.owner;
        match self.store.heartbeat(owner, buffered, until).await {
            Ok(n) if n as usize == buffered.len() => renew(leases, buffered, until),
            Ok(_) => {
                for lease in buffered {
                    match self
                        .store
                        .heartbeat(owner, std::slice::from_ref(lease), until)
                        .await
                    {
                        Ok(1) => renew(leases, std::slice::from_ref(lease), until),
                        Ok(_) => {
                            let mut held = lock(leases);
                            if held.get(&lease.id).is_some_and(|h| is_buffered(h, lease)) {
                                held.remove(&lease.id);
                                tracing::info!(
                                    action_id = lease.id,
                                    "buffered action is no longer ours (canceled or reclaimed); dropped"
                                );
                            }
                        }
                        Err(e) => {
                            tracing::warn!(action_id = lease.id, error = %e, "heartbeat failed")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat of buffered leases failed"),
        }
    }
}

fn is_buffered(h: &Held, lease: &Lease) -> bool {
    h.lease == *lease && matches!(h.stage, Stage::Buffered)
}

/// Records a successful heartbeat for these leases (those still held with the same token).
fn renew(leases: &Leases, renewed: &[Lease], until: DateTime<Utc>) {
    let mut held = lock(leases);
    for lease in renewed {
        if let Some(h) = held.get_mut(&lease.id) {
            if h.lease == *lease {
                h.until = h.until.max(until);
            }
        }
    }
}

/// Removes and returns the buffered leases that may not be started any more at `now`.
pub(crate) fn lapsing(leases: &Leases, now: DateTime<Utc>, margin: chrono::Duration) -> Vec<Lease> {
    let mut held = lock(leases);
    let gone: Vec<Lease> = held
        .values()
        .filter(|h| matches!(h.stage, Stage::Buffered) && !startable(h.until, now, margin))
        .map(|h| h.lease)
        .collect();
    for lease in &gone {
        held.remove(&lease.id);
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, TestClock};
    use crate::runner::RunnerConfig;
    use crate::store::sqlite::SqliteStore;
    use crate::store::DynStore;
    use crate::{ActionSpec, Queue};
    use serde_json::json;

    /// A runner over a fresh SQLite file, with two claimed actions registered as buffered.
    async fn runner_with_two_buffered() -> (tempfile::TempDir, Arc<Runner>, Leases, Vec<Lease>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite:{}", dir.path().join("held.db").display());
        let store: DynStore = Arc::new(SqliteStore::connect(&url).await.expect("open"));
        store.migrate().await.expect("migrate");
        let clock: Arc<dyn Clock> = Arc::new(TestClock::at(chrono::Utc::now()));
        let queue = Queue::with_clock(Arc::clone(&store), Arc::clone(&clock));
        for i in 0..2 {
            queue
                .enqueue(ActionSpec::new("h", json!(i)))
                .await
                .expect("enqueue");
        }
        let runner = Arc::new(Runner {
            store,
            clock,
            registry: Arc::default(),
            facts: Runner::facts_of(&RunnerConfig::default()),
            config: RunnerConfig::default(),
            queue,
            claim_hooks: None,
            routing: Default::default(),
        });
        let claimed = runner.claim(2).await.expect("claim");
        let leases: Leases = Arc::default();
        let until = runner.clock.now() + runner.lease_len();
        for a in &claimed {
            lock(&leases).insert(
                a.id,
                Held {
                    lease: a.lease(),
                    until,
                    stage: Stage::Buffered,
                },
            );
        }
        let held = claimed.iter().map(|a| a.lease()).collect();
        (dir, runner, leases, held)
    }

    #[tokio::test]
    async fn heartbeat_drops_a_buffered_action_canceled_meanwhile() {
        let (_dir, runner, leases, held) = runner_with_two_buffered().await;
        assert!(runner.queue.cancel(held[1].id).await.expect("cancel"));
        let until = runner.clock.now() + chrono::Duration::seconds(60);
        runner.beat_buffered(&leases, &held, until).await;
        let registry = lock(&leases);
        assert_eq!(registry.get(&held[0].id).map(|h| h.until), Some(until));
        assert!(
            !registry.contains_key(&held[1].id),
            "a canceled buffered action is never started"
        );
    }

    #[tokio::test]
    async fn lapsing_takes_only_buffered_leases_the_next_heartbeat_could_miss() {
        let (_dir, runner, leases, held) = runner_with_two_buffered().await;
        let now = runner.clock.now();
        let margin = runner.lapse_margin();
        if let Some(h) = lock(&leases).get_mut(&held[1].id) {
            h.stage = Stage::Finishing;
            h.until = now;
        }
        assert!(lapsing(&leases, now, margin).is_empty(), "still startable");
        let late = now + runner.lease_len() - margin;
        assert_eq!(lapsing(&leases, late, margin), vec![held[0]]);
        assert!(!lock(&leases).contains_key(&held[0].id));
        assert!(
            lock(&leases).contains_key(&held[1].id),
            "a started one is left to its finish"
        );
    }
}
