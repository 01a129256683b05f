//! The runner: the worker pool that claims due actions in rounds (ahead of its free slots, into
//! a bounded buffer, when the queue is deep), runs their handlers, heartbeats their leases and
//! finishes them with owner-guarded, group-committed writes.
//!
//! - `pool`: the claim loop (rounds, starting buffered actions, wake-ups, graceful shutdown, Q12).
//! - `prefetch`: the claim-ahead buffer and the policy sizing claim rounds (Q3).
//! - `held`: the registry of held leases (buffered, running, finishing) and the heartbeat.
//! - `acks`: group-committed rounds of finishes, sharing a round trip with the next claim.
//! - `execute`: one run of one claimed action (timeout, panic capture, outcome → [`Finish`](crate::store::Finish)).

mod acks;
pub(crate) mod execute;
pub(crate) mod held;
mod pool;
mod prefetch;

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::error::Result;
use crate::handler::Registry;
use crate::queue::Queue;
use crate::store::{ClaimRequest, ClaimedAction, DynStore, Routing};
use crate::telemetry;
use chrono::{DateTime, Utc};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;

/// The default [`RunnerConfig::prefetch`].
pub const DEFAULT_PREFETCH: usize = 256;

/// Runner settings.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Actions run at once (the number of slots). Default 10.
    pub concurrency: usize,
    /// Actions claimed ahead of free slots and held, leased and heartbeated, until a slot
    /// frees (Q3). While the queue is deep, one claim round trip then moves up to
    /// `concurrency + prefetch` actions; while it is shallow, claims take only free slots.
    /// Buffered actions start in claim order (a higher-priority action enqueued meanwhile is
    /// claimed by the next round and starts after them) and are given back, attempt not
    /// counted, at shutdown. 0 claims only for free slots. Default [`DEFAULT_PREFETCH`].
    pub prefetch: usize,
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
            prefetch: DEFAULT_PREFETCH,
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
    /// What a run's handler is told of this runner ([`RunnerConfig`]'s lease settings).
    pub(crate) facts: Arc<crate::handler::RunnerFacts>,
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
    /// The facts a run's handler is told of a runner with `config`.
    pub(crate) fn facts_of(config: &RunnerConfig) -> Arc<crate::handler::RunnerFacts> {
        Arc::new(crate::handler::RunnerFacts {
            owner: config.owner.clone(),
            lease: chrono::Duration::from_std(config.lease)
                .unwrap_or(chrono::Duration::seconds(30)),
            heartbeat_interval: config.heartbeat_interval,
            default_timeout: config.default_timeout,
            backoff: config.backoff,
        })
    }

    /// The claim request of this runner for up to `limit` actions, leased until `lease_until`.
    pub(crate) fn claim_request(
        &self,
        limit: usize,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
    ) -> ClaimRequest<'_> {
        ClaimRequest {
            owner: &self.config.owner,
            limit: limit as i64,
            now,
            lease_until,
            hooks: self.claim_hooks.as_deref(),
            routing: Some(Routing {
                hooks: &self.routing.0,
                groups: &self.routing.1,
            }),
        }
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedAction>> {
        let now = self.clock.now();
        let req = self.claim_request(limit, now, now + self.lease_len());
        let started = std::time::Instant::now();
        let claimed = self.store.claim(&req).await?;
        metrics::histogram!(telemetry::CLAIM_DURATION, "op" => "claim")
            .record(started.elapsed().as_secs_f64());
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
}
