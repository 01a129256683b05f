//! The action state machine.
//!
//! ```text
//!   pending ──claim──▶ running ──complete──▶ complete
//!      ▲  │               │ │──fail / retries exhausted──▶ failed
//!      │  │               │ └──retry / snooze / release / lease expired──▶ pending
//!      │  └──cancel──▶ canceled ◀──cancel── running
//!      └──────────────retry (operator)── failed | canceled
//! ```
//!
//! Stores encode these rules as guards in their UPDATE statements (`WHERE status = ...`); the
//! transition table here is the specification those guards follow, and `docs/state_machine.md`
//! draws it. [`ActionTransition::check`] is what non-SQL code (runner, CLI) consults.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The status of an action (Q2). "Past due" is a view (pending and due), not a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ActionStatus {
    /// Waiting to become due or to be claimed.
    Pending,
    /// Claimed by a runner holding a lease.
    Running,
    /// Finished successfully (final).
    Complete,
    /// Finished unsuccessfully (final).
    Failed,
    /// Canceled before it finished (final).
    Canceled,
}

impl ActionStatus {
    /// All statuses, in display order.
    pub const ALL: [ActionStatus; 5] = [
        ActionStatus::Pending,
        ActionStatus::Running,
        ActionStatus::Complete,
        ActionStatus::Failed,
        ActionStatus::Canceled,
    ];

    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionStatus::Pending => "pending",
            ActionStatus::Running => "running",
            ActionStatus::Complete => "complete",
            ActionStatus::Failed => "failed",
            ActionStatus::Canceled => "canceled",
        }
    }

    /// True for complete, failed and canceled.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            ActionStatus::Complete | ActionStatus::Failed | ActionStatus::Canceled
        )
    }

    /// True while the action counts for uniqueness (pending or running).
    pub fn is_active(self) -> bool {
        !self.is_final()
    }
}

impl fmt::Display for ActionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ActionStatus {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(ActionStatus::Pending),
            "running" => Ok(ActionStatus::Running),
            "complete" => Ok(ActionStatus::Complete),
            "failed" => Ok(ActionStatus::Failed),
            "canceled" => Ok(ActionStatus::Canceled),
            other => Err(crate::Error::invalid(
                "status",
                format!("unknown status `{other}` (pending, running, complete, failed, canceled)"),
            )),
        }
    }
}

/// A named change of action status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionTransition {
    /// A runner takes a due pending action (pending → running).
    Claim,
    /// The handler succeeded (running → complete).
    Complete,
    /// A retryable error with attempts left (running → pending).
    Retry,
    /// The handler asked to run later without using an attempt (running → pending).
    Snooze,
    /// Graceful shutdown gives the lease back, attempt uncounted (running → pending).
    Release,
    /// Fatal error or attempts exhausted (running → failed).
    Fail,
    /// The lease expired with attempts left (running → pending).
    LeaseExpired,
    /// The lease expired with no attempts left (running → failed).
    LeaseExpiredExhausted,
    /// Canceled by a caller (pending | running → canceled).
    Cancel,
    /// An operator retries a finished action (failed | canceled → pending).
    OperatorRetry,
    /// An operator makes a pending action that is due later due now (pending → pending).
    RunNow,
}

impl ActionTransition {
    /// The statuses this transition may start from.
    pub fn from(self) -> &'static [ActionStatus] {
        use ActionStatus::*;
        match self {
            ActionTransition::Claim | ActionTransition::RunNow => &[Pending],
            ActionTransition::Complete
            | ActionTransition::Retry
            | ActionTransition::Snooze
            | ActionTransition::Release
            | ActionTransition::Fail
            | ActionTransition::LeaseExpired
            | ActionTransition::LeaseExpiredExhausted => &[Running],
            ActionTransition::Cancel => &[Pending, Running],
            ActionTransition::OperatorRetry => &[Failed, Canceled],
        }
    }

    /// The status this transition ends in.
    pub fn to(self) -> ActionStatus {
        use ActionStatus::*;
        match self {
            ActionTransition::Claim => Running,
            ActionTransition::Complete => Complete,
            ActionTransition::Retry
            | ActionTransition::Snooze
            | ActionTransition::Release
            | ActionTransition::LeaseExpired
            | ActionTransition::OperatorRetry
            | ActionTransition::RunNow => Pending,
            ActionTransition::Fail | ActionTransition::LeaseExpiredExhausted => Failed,
            ActionTransition::Cancel => Canceled,
        }
    }

    /// Whether the transition may start from `status`.
    pub fn allowed_from(self, status: ActionStatus) -> bool {
        self.from().contains(&status)
    }

    /// Returns the target status, or an error naming the refused change.
    pub fn check(self, status: ActionStatus) -> crate::Result<ActionStatus> {
        if self.allowed_from(status) {
            Ok(self.to())
        } else {
            Err(crate::Error::invalid(
                "status",
                format!("cannot {self:?} an action that is {status}"),
            ))
        }
    }

    /// Every transition, for exhaustive tests and docs.
    pub const ALL: [ActionTransition; 11] = [
        ActionTransition::Claim,
        ActionTransition::Complete,
        ActionTransition::Retry,
        ActionTransition::Snooze,
        ActionTransition::Release,
        ActionTransition::Fail,
        ActionTransition::LeaseExpired,
        ActionTransition::LeaseExpiredExhausted,
        ActionTransition::Cancel,
        ActionTransition::OperatorRetry,
        ActionTransition::RunNow,
    ];
}

/// The status names (SQL literal lists) stores use in their guards, derived from the table.
pub mod sql {
    /// Statuses in which an action holds its unique key.
    pub const ACTIVE: &str = "'pending','running'";
    /// Final statuses.
    pub const FINAL: &str = "'complete','failed','canceled'";
}

#[cfg(test)]
mod tests {
    use super::ActionStatus::*;
    use super::*;

    #[test]
    fn the_full_transition_table() {
        // (transition, from, allowed?) for every pair: the table is exhaustive.
        let expected: &[(ActionTransition, &[ActionStatus], ActionStatus)] = &[
            (ActionTransition::Claim, &[Pending], Running),
            (ActionTransition::Complete, &[Running], Complete),
            (ActionTransition::Retry, &[Running], Pending),
            (ActionTransition::Snooze, &[Running], Pending),
            (ActionTransition::Release, &[Running], Pending),
            (ActionTransition::Fail, &[Running], Failed),
            (ActionTransition::LeaseExpired, &[Running], Pending),
            (ActionTransition::LeaseExpiredExhausted, &[Running], Failed),
            (ActionTransition::Cancel, &[Pending, Running], Canceled),
            (
                ActionTransition::OperatorRetry,
                &[Failed, Canceled],
                Pending,
            ),
            (ActionTransition::RunNow, &[Pending], Pending),
        ];
        assert_eq!(expected.len(), ActionTransition::ALL.len());
        for (t, from, to) in expected {
            for s in ActionStatus::ALL {
                let allowed = from.contains(&s);
                assert_eq!(t.allowed_from(s), allowed, "{t:?} from {s}");
                match t.check(s) {
                    Ok(target) => {
                        assert!(allowed);
                        assert_eq!(target, *to);
                    }
                    Err(e) => {
                        assert!(!allowed);
                        assert!(e.to_string().contains(s.as_str()));
                    }
                }
            }
        }
    }

    #[test]
    fn final_statuses_have_no_way_out_but_operator_retry() {
        for s in ActionStatus::ALL.into_iter().filter(|s| s.is_final()) {
            let exits: Vec<_> = ActionTransition::ALL
                .into_iter()
                .filter(|t| t.allowed_from(s))
                .collect();
            if s == Complete {
                assert!(exits.is_empty());
            } else {
                assert_eq!(exits, vec![ActionTransition::OperatorRetry]);
            }
        }
    }

    #[test]
    fn status_names_round_trip() {
        for s in ActionStatus::ALL {
            assert_eq!(s.as_str().parse::<ActionStatus>().unwrap(), s);
        }
        assert!("done".parse::<ActionStatus>().is_err());
    }
}
