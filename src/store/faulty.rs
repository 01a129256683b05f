//! Fault injection for tests (RELIABILITY.md §1): a [`Store`] wrapper that fails the Nth call
//! of a named method — before it runs, after it committed, with a delay, or with the backend's
//! transient (busy/deadlock-like) error — or every call from the Nth on, until healed.
//!
//! It wraps a real store: every call that is not faulted runs against the real database. It is
//! how the failure routes of the runner, the terminal bridge and item claims are tested.
//!
//! A crash ([`FaultyStore::crash_at`]) fails one call and every call after it, whatever the
//! method, until healed: the process stopped there, and a restarted one carries on.
//!
//! It also keeps a call log ([`FaultyStore::call_log`]): the method name of every call, in
//! order, faulted or not. The fault-point sweep runs a workload once without faults to learn
//! its call sequence, then faults each point of it in turn.

use super::delegate::delegate_store;
use super::{
    Backend, ClaimRequest, ClaimedAction, DynStore, Enqueued, Finish, FinishAndClaim, FinishResult,
    JobPrune, Lease, PruneCutoffs, QueueStats, ReapReport, Store,
};
use crate::action::{Action, ActionFilter, ActionLog, ActionQuery, PreparedAction};
use crate::batch::{
    BatchAbort, BatchState, ChildOutcome, ChildSpec, FailedChild, FanOutOutcome, FenceOutcome,
    JobLiveness, RowSettle, Violation, WorkItem, WorkRow,
};
use crate::claims::ledger::TrackedItem;
use crate::claims::{
    ClaimFilter, ClaimItemRequest, ClaimOutcome, ClaimRun, CompleteOutcome, CompletionHandler,
    CompletionRegistry, Descriptor, Identity, ItemClaim,
};
use crate::error::{Error, Result};
use crate::jobs::packets::EncodedPacket;
use crate::jobs::{
    BridgeOutcome, Job, JobCreated, JobEvent, JobFilter, NewJob, ScheduleGuard, StepAction,
};
use crate::schedule::{PreparedSchedule, Schedule};
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Return an error; the call does not run.
    FailBefore,
    /// Run the call (it commits), then return an error: "acknowledgement lost".
    ExecuteThenFail,
    /// Wait, then run the call normally.
    Delay(Duration),
    /// Return a transient error (as a busy or deadlocked backend would); the call does not run.
    Retryable,
}

#[derive(Debug, Clone)]
struct Fault {
    method: String,
    nth: u64,
    mode: FaultMode,
    every_after: bool,
}

/// Something a test does right before a planned store call runs (an operator's move landing
/// between two store calls of a handler, deterministically: see [`FaultyStore::before_call`]).
pub type CallHook =
    Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync + 'static>;

/// A store that injects planned faults into a real store.
pub struct FaultyStore {
    inner: DynStore,
    plan: Mutex<Vec<Fault>>,
    /// Planned hooks: (method, call number, hook, counted as an injected fault).
    hooks: Mutex<Vec<(String, u64, CallHook, bool)>>,
    calls: Mutex<HashMap<String, u64>>,
    log: Mutex<Vec<&'static str>>,
    /// A planned crash: (1-based index into the call log, mode of that call).
    crash: Mutex<Option<(u64, FaultMode)>>,
    injected: AtomicU64,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("plan", &self.plan)
            .field("crash", &self.crash)
            .field("injected", &self.injected)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FaultyStore {
    /// Wraps `inner` with an empty plan.
    pub fn wrap(inner: DynStore) -> Arc<FaultyStore> {
        Arc::new(FaultyStore {
            inner,
            plan: Mutex::new(Vec::new()),
            hooks: Mutex::new(Vec::new()),
            calls: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
            crash: Mutex::new(None),
            injected: AtomicU64::new(0),
        })
    }

    /// Faults the `nth` call (1-based, counted from now) of `method` once.
    pub fn fail_nth(&self, method: &str, nth: u64, mode: FaultMode) {
        self.plan_fault(method, nth, mode, false);
    }

    /// Faults every call of `method` from the `nth` one (counted from now) on, until healed.
    pub fn fail_from(&self, method: &str, nth: u64, mode: FaultMode) {
        self.plan_fault(method, nth, mode, true);
    }

    fn plan_fault(&self, method: &str, nth: u64, mode: FaultMode, every_after: bool) {
        let base = lock(&self.calls).get(method).copied().unwrap_or(0);
        lock(&self.plan).push(Fault {
            method: method.to_string(),
            nth: base + nth.max(1),
            mode,
            every_after,
        });
    }

    /// Runs `hook` once, right before the `nth` call (1-based, counted from now) of `method`
    /// runs, and counts it as an injected fault. The call waits for the hook; the hook should
    /// use another store (the wrapped one), or its own calls are counted and logged here too.
    /// This is how a test lands an operator's move (a cancel, say) between two store calls of
    /// a running handler without threads racing.
    pub fn before_call(&self, method: &str, nth: u64, hook: CallHook) {
        self.plan_hook(method, nth, hook, true);
    }

    /// Like [`FaultyStore::before_call`], but not counted as an injected fault: a move that
    /// belongs to the test's workload (an operator acting while a handler runs), made the same
    /// way whether or not a fault is planned.
    pub fn on_call(&self, method: &str, nth: u64, hook: CallHook) {
        self.plan_hook(method, nth, hook, false);
    }

    fn plan_hook(&self, method: &str, nth: u64, hook: CallHook, counted: bool) {
        let base = lock(&self.calls).get(method).copied().unwrap_or(0);
        lock(&self.hooks).push((method.to_string(), base + nth.max(1), hook, counted));
    }

    /// Simulates a crash of the process at its `nth` store call from now, whatever the
    /// method: that call fails in `mode` (`FailBefore`: it does not run; `ExecuteThenFail`: it
    /// commits first), and every later call fails before running, until healed.
    pub fn crash_at(&self, nth: u64, mode: FaultMode) {
        let base = lock(&self.log).len() as u64;
        *lock(&self.crash) = Some((base + nth.max(1), mode));
    }

    /// Removes every planned fault, hook and crash.
    pub fn heal(&self) {
        lock(&self.plan).clear();
        lock(&self.hooks).clear();
        *lock(&self.crash) = None;
    }

    /// Calls of `method` so far.
    pub fn calls(&self, method: &str) -> u64 {
        lock(&self.calls).get(method).copied().unwrap_or(0)
    }

    /// The method name of every call so far, in call order (faulted calls included). Calls
    /// made concurrently are logged in the order they reached the wrapper.
    pub fn call_log(&self) -> Vec<&'static str> {
        lock(&self.log).clone()
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn injected_error(method: &'static str, mode: FaultMode) -> Error {
        let source = match mode {
            FaultMode::Retryable => sqlx::Error::Io(std::io::Error::other(format!(
                "injected transient fault in {method}"
            ))),
            _ => sqlx::Error::Protocol(format!("injected fault in {method}")),
        };
        Error::Database { op: method, source }
    }

    async fn before(&self, method: &'static str) -> Result<Option<FaultMode>> {
        let k = {
            let mut log = lock(&self.log);
            log.push(method);
            log.len() as u64
        };
        let crashed = match *lock(&self.crash) {
            Some((at, mode)) if k == at => Some(mode),
            Some((at, _)) if k > at => Some(FaultMode::FailBefore),
            _ => None,
        };
        let n = {
            let mut calls = lock(&self.calls);
            let c = calls.entry(method.to_string()).or_default();
            *c += 1;
            *c
        };
        let hook = {
            let mut hooks = lock(&self.hooks);
            hooks
                .iter()
                .position(|(m, nth, _, _)| m == method && *nth == n)
                .map(|i| hooks.remove(i))
        };
        if let Some((_, _, hook, counted)) = hook {
            if counted {
                self.injected.fetch_add(1, Ordering::SeqCst);
            }
            hook().await;
        }
        let mode = crashed.or_else(|| {
            lock(&self.plan)
                .iter()
                .find(|f| f.method == method && (f.nth == n || (f.every_after && n >= f.nth)))
                .map(|f| f.mode)
        });
        match mode {
            None => Ok(None),
            Some(FaultMode::Delay(d)) => {
                self.injected.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(d).await;
                Ok(None)
            }
            Some(m @ (FaultMode::FailBefore | FaultMode::Retryable)) => {
                self.injected.fetch_add(1, Ordering::SeqCst);
                Err(Self::injected_error(method, m))
            }
            Some(FaultMode::ExecuteThenFail) => Ok(Some(FaultMode::ExecuteThenFail)),
        }
    }

    fn after<T>(&self, method: &'static str, mode: Option<FaultMode>, r: Result<T>) -> Result<T> {
        match (mode, r) {
            (Some(FaultMode::ExecuteThenFail), Ok(_)) => {
                self.injected.fetch_add(1, Ordering::SeqCst);
                Err(Self::injected_error(method, FaultMode::ExecuteThenFail))
            }
            (_, r) => r,
        }
    }
}

/// Runs one delegated call under the fault plan.
macro_rules! faulted {
    ($self:ident, $op:literal, $call:expr) => {{
        let mode = $self.before($op).await?;
        let r = $call.await;
        $self.after($op, mode, r)
    }};
}

delegate_store!(FaultyStore, faulted);
