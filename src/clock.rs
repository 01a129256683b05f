//! Time source. Every "now" the runtime uses comes from a [`Clock`], so tests can move time
//! forward explicitly with a [`TestClock`] instead of sleeping.
//!
//! A runtime built without an explicit clock uses a [`DatabaseClock`]: the system clock
//! corrected by its measured offset from the database server's clock, so processes on hosts
//! whose clocks disagree still compare leases, schedules and claim expiries on one clock.
//! [`OffsetClock`] shifts another clock by a fixed amount (a skewed host, in tests and chaos
//! runs).

use crate::error::Result;
use crate::store::Store;
use chrono::{DateTime, Duration, Utc};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to. Cloning shares the same instant.
#[derive(Debug, Clone)]
pub struct TestClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl TestClock {
    /// A clock frozen at `start`.
    pub fn at(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward (or backward, with a negative duration).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }

    /// Sets the clock to an absolute instant.
    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = to;
    }
}

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Another clock shifted by a fixed offset: a host whose clock is `offset` ahead (or behind,
/// when negative).
#[derive(Debug, Clone)]
pub struct OffsetClock {
    base: Arc<dyn Clock>,
    offset: Duration,
}

impl OffsetClock {
    /// `base` shifted by `offset`.
    pub fn new(base: Arc<dyn Clock>, offset: Duration) -> Self {
        Self { base, offset }
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        self.base.now() + self.offset
    }
}

/// The database's clock, read locally: a base clock plus the offset last measured against
/// [`Store::database_now`]. [`DatabaseClock::sync`] measures it (the runtime does so when it is
/// built and then every [`DatabaseClock::SYNC_EVERY`]); between syncs it follows the base
/// clock. The error is about half a round trip to the database plus the base clock's drift
/// since the last sync.
#[derive(Debug)]
pub struct DatabaseClock {
    base: Arc<dyn Clock>,
    offset_ms: AtomicI64,
}

impl DatabaseClock {
    /// How often a running runtime re-measures the offset.
    pub const SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

    /// A clock over `base`, uncorrected until the first [`DatabaseClock::sync`].
    pub fn new(base: Arc<dyn Clock>) -> Self {
        Self {
            base,
            offset_ms: AtomicI64::new(0),
        }
    }

    /// Reads the database's clock and sets the offset so that `now()` matches it, taking the
    /// midpoint of the round trip as the instant it was read. Returns the new offset.
    pub async fn sync(&self, store: &dyn Store) -> Result<Duration> {
        let before = self.base.now();
        let db = store.database_now().await?;
        let after = self.base.now();
        let midpoint = before + (after - before) / 2;
        let offset = (db - midpoint).num_milliseconds();
        self.offset_ms.store(offset, Ordering::Relaxed);
        Ok(Duration::milliseconds(offset))
    }

    /// The offset in force: database time minus base time.
    pub fn offset(&self) -> Duration {
        Duration::milliseconds(self.offset_ms.load(Ordering::Relaxed))
    }
}

impl Clock for DatabaseClock {
    fn now(&self) -> DateTime<Utc> {
        self.base.now() + self.offset()
    }
}

/// Truncates an instant to whole milliseconds, the precision every backend stores.
pub fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}
