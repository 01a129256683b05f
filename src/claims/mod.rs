//! Item claims (C1–C8): the exclusive, token-owned right to process one source item under an
//! identity scope, with completion handlers that run inside the claim's own transaction.
//!
//! - [`Identity`]: (scope, source type, item id); item ids of any length, compared in full.
//! - [`Descriptor`]: what names a claim and travels with the work (token + completion config).
//! - [`ClaimItemRequest`] / [`ClaimOutcome`]: taking a claim; a claim for a job is taken only
//!   while that job is live (checked under a lock on the job row, in the claim's transaction),
//!   and a step run's claim only while the run holds its lease ([`ClaimRun`]).
//! - [`completion`]: [`CompletionHandler`], user code that writes its side effect in the same
//!   transaction that marks the claim processed, so a stale worker can never persist a side
//!   effect; its errors say whether a retry may help ([`CompletionError`]).
//! - [`ledger`]: the shipped tracked-items handler.
//!
//! Time-to-live: a claim holds while `now < expires_at`; from `now == expires_at` on it is
//! expired and another owner may take it over (every backend compares the same way, with the
//! `now` the caller passes: the runtime's clock, the database's time by default). Maintenance
//! renews the claims of live jobs (`Store::renew_claims`), so a job holds its items as long as
//! it lives, whatever the TTL.

pub mod completion;
pub mod ledger;

pub use completion::{
    CompletionContext, CompletionError, CompletionHandler, CompletionRegistry, CompletionResult,
    CompletionTx,
};

use crate::error::{Error, Result};
use crate::state::JobStatus;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use crate::state::ClaimStatus;

/// Default claim time-to-live.
pub const DEFAULT_CLAIM_TTL: chrono::Duration = chrono::Duration::minutes(30);

/// Who an item is: a scope (a step id, or a shared name like `shared:feed`), a source type and
/// the item's id in that source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The dedupe scope.
    pub scope: String,
    /// The kind of source (`rss`, `csv`, ...).
    pub source_type: String,
    /// The item's id within the source; any length.
    pub item_id: String,
}

impl Identity {
    /// A validated identity: scope and source type are short names; the item id may be any
    /// length but not empty; no part may contain NUL.
    pub fn new(
        scope: impl Into<String>,
        source_type: impl Into<String>,
        item_id: impl Into<String>,
    ) -> Result<Self> {
        let id = Identity {
            scope: scope.into(),
            source_type: source_type.into(),
            item_id: item_id.into(),
        };
        id.validate()?;
        Ok(id)
    }

    /// Re-checks the parts (for identities built by hand or decoded).
    pub fn validate(&self) -> Result<()> {
        crate::action::validate_name("scope", &self.scope, false)?;
        crate::action::validate_name("source_type", &self.source_type, false)?;
        if self.item_id.is_empty() {
            return Err(Error::invalid("item_id", "must not be empty"));
        }
        if self.item_id.contains('\0') {
            return Err(Error::invalid("item_id", "must not contain NUL"));
        }
        Ok(())
    }

    /// The index key: sha256 over the length-prefixed parts (so no two identities share one by
    /// concatenation), as lowercase hex.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        for part in [&self.scope, &self.source_type, &self.item_id] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        hex(&h.finalize())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// How a claim is completed (C3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionConfig {
    /// The registered completion handler to run in the completing transaction (`None`: just
    /// mark processed).
    pub handler: Option<String>,
    /// Opaque data for the handler.
    #[serde(default)]
    pub payload: Value,
    /// Keep a `processed` row (true), or delete the row because the handler's own ledger is
    /// the record (false).
    pub retain_processed: bool,
}

impl Default for CompletionConfig {
    fn default() -> Self {
        Self {
            handler: None,
            payload: Value::Null,
            retain_processed: true,
        }
    }
}

/// Names one claim: whoever holds it may complete or release it, while the token matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    /// The item.
    pub identity: Identity,
    /// The claim's token (new on every claim and takeover).
    pub token: String,
    /// The owning job, if any.
    pub job_id: Option<i64>,
    /// How to complete it.
    pub completion: CompletionConfig,
}

impl Descriptor {
    /// Parses a descriptor from JSON, naming what is wrong.
    pub fn from_json(v: &Value) -> Result<Self> {
        let d: Descriptor = serde_json::from_value(v.clone())
            .map_err(|e| Error::invalid("descriptor", format!("malformed: {e}")))?;
        d.identity.validate()?;
        if d.token.is_empty() {
            return Err(Error::invalid("descriptor", "empty token"));
        }
        Ok(d)
    }
}

/// What [`crate::Store::claim_item`] is asked to do.
#[derive(Debug, Clone)]
pub struct ClaimItemRequest {
    /// The item.
    pub identity: Identity,
    /// The owning job (None for a free-standing claim).
    pub job_id: Option<i64>,
    /// How long the claim holds before another owner may take it over.
    pub ttl: chrono::Duration,
    /// How it will be completed.
    pub completion: CompletionConfig,
    /// The caller decided to reprocess an already processed item.
    pub reprocess: bool,
    /// The step run taking the claim, if a step takes it (see [`ClaimRun`]).
    pub run: Option<ClaimRun>,
}

/// The step run a claim is taken by: step `step` of the owning job, run by the action lease
/// `lease` (action id and fencing token). Such a claim is refused with [`Error::LeaseLost`]
/// unless the action still runs under that token, and with [`ClaimOutcome::JobNotLive`] unless
/// the job is `processing` at that step, both checked in the claim's transaction. The claim
/// row records the run, so the claims an earlier run of the step took and the committed run
/// does not hold are released when the committed run's output is written
/// (`Store::release_superseded_claims`) instead of being completed with the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRun {
    /// The step's index in its pipeline.
    pub step: i32,
    /// The step action's lease of this run.
    pub lease: Lease,
}

/// The result of a claim attempt. Contention is an outcome, never an error.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// Claimed by the caller (fresh, deferred, reprocessed or taken over after expiry).
    Claimed(Descriptor),
    /// Actively claimed by someone else.
    HeldByOther,
    /// Processed already, and the caller did not ask to reprocess.
    AlreadyProcessed,
    /// The owning job cannot take claims any more: it is final (or, for a step run's claim,
    /// no longer `processing` at the claiming step). Nothing was written.
    JobNotLive {
        /// The owning job.
        job_id: i64,
        /// Its status when the claim was refused.
        status: JobStatus,
        /// Its current step.
        step_index: i32,
    },
}

/// Whether completing a claim took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum CompleteOutcome {
    /// Handler ran and the claim is processed (or deleted), in one commit.
    Completed,
    /// The token no longer holds the claim (taken over, released or already completed):
    /// nothing ran, nothing changed.
    Lost,
}

/// A stored claim row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemClaim {
    /// The item.
    pub identity: Identity,
    /// Its status.
    pub status: ClaimStatus,
    /// Current token (while claimed).
    pub token: Option<String>,
    /// Owning job.
    pub job_id: Option<i64>,
    /// Completion config given at claim time.
    pub completion: Option<CompletionConfig>,
    /// When claimed.
    pub claimed_at: Option<DateTime<Utc>>,
    /// When the claim may be taken over.
    pub expires_at: Option<DateTime<Utc>>,
    /// When processed.
    pub processed_at: Option<DateTime<Utc>>,
}

/// Filters for listing claims.
#[derive(Debug, Clone, Default)]
pub struct ClaimFilter {
    /// Only this scope.
    pub scope: Option<String>,
    /// Only claims owned by this job.
    pub job_id: Option<i64>,
    /// Only this status.
    pub status: Option<ClaimStatus>,
    /// Page size (default 100 when 0).
    pub limit: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_ids_sharing_a_prefix_hash_apart() {
        let prefix = "x".repeat(300);
        let a = Identity::new("s", "t", format!("{prefix}a")).unwrap();
        let b = Identity::new("s", "t", format!("{prefix}b")).unwrap();
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn parts_do_not_run_together() {
        let a = Identity::new("ab", "c", "d").unwrap();
        let b = Identity::new("a", "bc", "d").unwrap();
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn bad_identities_and_descriptors_name_the_field() {
        assert!(Identity::new("", "t", "i")
            .unwrap_err()
            .to_string()
            .contains("scope"));
        assert!(Identity::new("s", "t", "")
            .unwrap_err()
            .to_string()
            .contains("item_id"));
        let e = Descriptor::from_json(&serde_json::json!({"token": 3})).unwrap_err();
        assert!(e.to_string().starts_with("invalid descriptor"), "{e}");
    }
}
