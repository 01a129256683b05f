//! A [`Store`] wrapper that runs every store call inside a `dockhand.store` span (field `op`),
//! so traces show each database round trip of an action's life. [`crate::store::connect`] wraps
//! every store it opens; wrap a store you opened yourself with [`Traced::wrap`].

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
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

/// Spans around an inner store.
pub struct Traced {
    inner: DynStore,
}

impl Traced {
    /// Wraps `inner`.
    pub fn wrap(inner: DynStore) -> DynStore {
        Arc::new(Traced { inner })
    }
}

macro_rules! span {
    ($self:ident, $op:literal, $call:expr) => {
        $call
            .instrument(tracing::debug_span!("dockhand.store", op = $op))
            .await
    };
}

delegate_store!(Traced, span);
