//! A [`Store`] wrapper that counts the calls of each store method and the wall time they took
//! ([`OpTimes`]): the per-phase timers `dockhand bench --profile` prints, to see where a
//! workload's time goes (how many round trips per item, and which ones are slow).

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
use crate::error::Result;
use crate::jobs::packets::EncodedPacket;
use crate::jobs::{
    BridgeOutcome, Job, JobCreated, JobEvent, JobFilter, NewJob, ScheduleGuard, StepAction,
};
use crate::schedule::{PreparedSchedule, Schedule};
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Calls and total wall time per store method.
#[derive(Debug, Default)]
pub struct OpTimes(Mutex<BTreeMap<&'static str, (u64, Duration)>>);

impl OpTimes {
    fn add(&self, op: &'static str, took: Duration) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(op).or_default();
        e.0 += 1;
        e.1 += took;
    }

    /// `(method, calls, total time)`, the most expensive first.
    pub fn snapshot(&self) -> Vec<(&'static str, u64, Duration)> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = m.iter().map(|(k, (n, d))| (*k, *n, *d)).collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.2));
        v
    }
}

/// Times every call of an inner store into shared [`OpTimes`].
pub struct Timed {
    inner: DynStore,
    times: Arc<OpTimes>,
}

impl Timed {
    /// Wraps `inner`, recording into `times`.
    pub fn wrap(inner: DynStore, times: Arc<OpTimes>) -> DynStore {
        Arc::new(Timed { inner, times })
    }
}

macro_rules! timed {
    ($self:ident, $op:literal, $call:expr) => {{
        let start = Instant::now();
        let r = $call.await;
        $self.times.add($op, start.elapsed());
        r
    }};
}

delegate_store!(Timed, timed);
