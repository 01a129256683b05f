//! The item-claim state machine (C2–C6).
//!
//! ```text
//!  (absent) ──claim──▶ claimed ──complete (token matches)──▶ processed | (row deleted)
//!                       │  ▲ └──release (token matches)──▶ (row deleted) | deferred
//!                       │  ├──takeover (expired; new token, new owner job)
//!                       │  └──re-claim by the owning job (token kept; ttl renewed)
//!  processed ──claim (caller chose to reprocess; new token)──▶ claimed
//!  deferred  ──claim──▶ claimed
//! ```
//!
//! Only the holder of the current token may complete or release; a stale token changes nothing.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The stored status of an item claim row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimStatus {
    /// Owned by a token (and usually a job) until it expires.
    Claimed,
    /// Done; kept as the record (`retain_processed`).
    Processed,
    /// Released for later.
    Deferred,
}

impl ClaimStatus {
    /// Every status.
    pub const ALL: [ClaimStatus; 3] = [
        ClaimStatus::Claimed,
        ClaimStatus::Processed,
        ClaimStatus::Deferred,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimStatus::Claimed => "claimed",
            ClaimStatus::Processed => "processed",
            ClaimStatus::Deferred => "deferred",
        }
    }
}

impl fmt::Display for ClaimStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ClaimStatus {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClaimStatus::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                crate::Error::invalid(
                    "claim status",
                    format!("unknown claim status `{s}` (claimed, processed, deferred)"),
                )
            })
    }
}

/// A named change of a claim row. `None` as a state means "no row".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimTransition {
    /// Take an absent, deferred or expired claim (or a processed one when reprocessing).
    Claim {
        /// The caller decided to reprocess a processed item.
        reprocess: bool,
        /// The current claim's expiry has passed.
        expired: bool,
        /// The claim is already held by the requesting job (a retried step re-claims what it
        /// holds; the token is kept).
        own: bool,
    },
    /// Token holder completes: processed, or the row is deleted (`retain_processed = false`).
    Complete {
        /// Keep a processed row.
        retain: bool,
    },
    /// Token holder releases: row deleted, or deferred.
    Release {
        /// Mark deferred instead of deleting.
        defer: bool,
    },
}

impl ClaimTransition {
    /// The state after the transition from `from`, or `None` if it is refused (the caller gets
    /// "someone else has it", "already processed" or "lost" accordingly). `Some(None)` means the
    /// row is deleted.
    pub fn apply(self, from: Option<ClaimStatus>) -> Option<Option<ClaimStatus>> {
        use ClaimStatus::*;
        match (self, from) {
            (ClaimTransition::Claim { .. }, None | Some(Deferred)) => Some(Some(Claimed)),
            (ClaimTransition::Claim { reprocess, .. }, Some(Processed)) => {
                reprocess.then_some(Some(Claimed))
            }
            (ClaimTransition::Claim { expired, own, .. }, Some(Claimed)) => {
                (expired || own).then_some(Some(Claimed))
            }
            (ClaimTransition::Complete { retain }, Some(Claimed)) => {
                Some(if retain { Some(Processed) } else { None })
            }
            (ClaimTransition::Release { defer }, Some(Claimed)) => {
                Some(if defer { Some(Deferred) } else { None })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ClaimStatus::*;
    use super::*;

    #[test]
    fn the_full_claim_transition_table() {
        let states = [None, Some(Claimed), Some(Processed), Some(Deferred)];
        for from in states {
            for reprocess in [false, true] {
                for expired in [false, true] {
                    for own in [false, true] {
                        let got = ClaimTransition::Claim {
                            reprocess,
                            expired,
                            own,
                        }
                        .apply(from);
                        let want = match from {
                            None | Some(Deferred) => Some(Some(Claimed)),
                            Some(Processed) => reprocess.then_some(Some(Claimed)),
                            Some(Claimed) => (expired || own).then_some(Some(Claimed)),
                        };
                        assert_eq!(
                            got, want,
                            "claim from {from:?} r={reprocess} e={expired} o={own}"
                        );
                    }
                }
            }
            for retain in [false, true] {
                let got = ClaimTransition::Complete { retain }.apply(from);
                let want =
                    (from == Some(Claimed)).then_some(if retain { Some(Processed) } else { None });
                assert_eq!(got, want);
            }
            for defer in [false, true] {
                let got = ClaimTransition::Release { defer }.apply(from);
                let want =
                    (from == Some(Claimed)).then_some(if defer { Some(Deferred) } else { None });
                assert_eq!(got, want);
            }
        }
    }
}
