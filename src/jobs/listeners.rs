//! Whether any runtime of the cluster listens for lifecycle events (J5), so that a runtime
//! with no lifecycle hook of its own never marks an event delivered that another runtime's
//! hooks should hear.
//!
//! Lifecycle hooks are registered in code, per runtime. A runtime that registers some holds the
//! shared maintenance lease [`LISTENERS_TASK`] (one holder is enough: it says "someone
//! listens"), taken at build and renewed by its maintenance ticks for [`listener_ttl`], so a
//! restart within that time keeps it. A runtime with no hook reads the lease at build and at
//! each maintenance tick:
//! - while someone listens, it writes its step runs' events undelivered and leaves the outbox
//!   sweep to the listeners (it does not even take the sweep's cluster lease);
//! - while no one does, there is nobody to hear them: its step runs write their events
//!   delivered in the finishing transaction, and its sweep marks the others delivered.
//!
//! The view of a runtime with no hook is at most one maintenance tick old, so it only permits:
//! the statement that writes an event delivered (a step run's finish, the sweep's mark) reads
//! the lease itself and writes the event undelivered while anyone holds it. A listener hears
//! every event whose finish commits after its lease does (on PostgreSQL, whose statement
//! began after; MariaDB's read locks the lease row).

use crate::clock::Clock;
use crate::error::Result;
use crate::store::DynStore;
use chrono::{DateTime, Duration, Utc};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The maintenance lease a runtime with lifecycle hooks holds.
pub const LISTENERS_TASK: &str = "event_listeners";

/// How long a listener's lease lasts after its last renewal (its holder renews it after a
/// quarter of this; another listener tries to take it at each of its ticks).
pub fn listener_ttl() -> Duration {
    Duration::minutes(10)
}

/// A runtime's side of the listener lease.
#[derive(Debug)]
pub(crate) struct Listeners {
    /// Whether this runtime registers lifecycle hooks (it is a listener).
    listens: bool,
    /// For a runtime with no hook: whether another runtime listened when last read. Starts
    /// true (leave events for others) until the first read says otherwise.
    others_listen: AtomicBool,
    /// For a listener: when it last took or renewed the lease.
    renewed_at: Mutex<Option<DateTime<Utc>>>,
}

impl Listeners {
    /// The side of a runtime that `listens` (registers lifecycle hooks) or not.
    pub(crate) fn new(listens: bool) -> Self {
        Self {
            listens,
            others_listen: AtomicBool::new(true),
            renewed_at: Mutex::new(None),
        }
    }

    /// Whether some runtime of the cluster (this one included) hears lifecycle events, as of
    /// the last [`Listeners::refresh`].
    pub(crate) fn someone_listens(&self) -> bool {
        self.listens || self.others_listen.load(Ordering::Acquire)
    }

    /// A listener takes or renews the lease when a quarter of its TTL has passed since the
    /// last time; a runtime with no hook reads whether anyone holds it.
    pub(crate) async fn refresh(
        &self,
        store: &DynStore,
        clock: &dyn Clock,
        owner: &str,
    ) -> Result<()> {
        let now = clock.now();
        if self.listens {
            let due = self
                .renewed_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map_or(true, |at| now - at >= listener_ttl() / 4);
            if due {
                // False while another listener holds it: someone listens either way, and this
                // one tries again at its next tick, to take over once that lease lapses.
                let took = store
                    .try_maintenance_lease(LISTENERS_TASK, owner, now + listener_ttl(), now)
                    .await?;
                if took {
                    *self.renewed_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
                }
            }
            return Ok(());
        }
        let held = store.maintenance_lease_held(LISTENERS_TASK, now).await?;
        self.others_listen.store(held, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_always_listens_and_a_silent_runtime_assumes_others_until_read() {
        assert!(Listeners::new(true).someone_listens());
        let silent = Listeners::new(false);
        assert!(silent.someone_listens(), "until the first read");
        silent.others_listen.store(false, Ordering::Release);
        assert!(!silent.someone_listens());
    }
}
