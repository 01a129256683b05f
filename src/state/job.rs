//! The job state machine (J1, J3, J4).
//!
//! ```text
//!  create ──▶ pending ──first step starts──▶ processing ──park──▶ waiting
//!                │                             │  ▲                  │
//!                │                             │  └──────resume──────┘
//!                └──────── finish (terminal bridge only) ─────────────┴──▶ completed |
//!                          completed_no_items | skipped | failed | cancelled
//! ```
//!
//! Every final status is written by the terminal bridge (`jobs::bridge::finish`) and nowhere
//! else; a final status never changes again.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The status of a job (J3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Created; its first step has not started.
    Pending,
    /// A step is queued or running, or (batch parent) children are outstanding.
    Processing,
    /// Parked until resumed.
    Waiting,
    /// Finished with output (final, success).
    Completed,
    /// Finished with nothing to do (final, success).
    CompletedNoItems,
    /// Skipped on purpose (final, success).
    Skipped,
    /// Failed (final).
    Failed,
    /// Cancelled (final).
    Cancelled,
}

impl JobStatus {
    /// Every status.
    pub const ALL: [JobStatus; 8] = [
        JobStatus::Pending,
        JobStatus::Processing,
        JobStatus::Waiting,
        JobStatus::Completed,
        JobStatus::CompletedNoItems,
        JobStatus::Skipped,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Processing => "processing",
            JobStatus::Waiting => "waiting",
            JobStatus::Completed => "completed",
            JobStatus::CompletedNoItems => "completed_no_items",
            JobStatus::Skipped => "skipped",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Final statuses never change again.
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            JobStatus::Pending | JobStatus::Processing | JobStatus::Waiting
        )
    }

    /// Success statuses complete the job's item claims; the other final ones release them.
    pub fn is_success(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::CompletedNoItems | JobStatus::Skipped
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobStatus::ALL
            .into_iter()
            .find(|j| j.as_str() == s)
            .ok_or_else(|| {
                crate::Error::invalid(
                    "job status",
                    format!("unknown job status `{s}` (pending, processing, waiting, completed, completed_no_items, skipped, failed, cancelled)"),
                )
            })
    }
}

/// A named change of job status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobTransition {
    /// The first step starts (pending → processing).
    Start,
    /// A step hands over to the next one (processing → processing).
    Advance,
    /// A step parks the job (processing → waiting).
    Park,
    /// A parked job is resumed (waiting → processing).
    Resume,
    /// The terminal bridge writes a final status (any non-final → final).
    Finish(JobStatus),
}

impl JobTransition {
    /// Whether the transition may start from `from`.
    pub fn allowed_from(self, from: JobStatus) -> bool {
        match self {
            JobTransition::Start => from == JobStatus::Pending,
            JobTransition::Advance | JobTransition::Park => from == JobStatus::Processing,
            JobTransition::Resume => from == JobStatus::Waiting,
            JobTransition::Finish(to) => to.is_final() && !from.is_final(),
        }
    }

    /// The status it ends in.
    pub fn to(self) -> JobStatus {
        match self {
            JobTransition::Start | JobTransition::Advance | JobTransition::Resume => {
                JobStatus::Processing
            }
            JobTransition::Park => JobStatus::Waiting,
            JobTransition::Finish(to) => to,
        }
    }

    /// The target status, or an error naming the refused change.
    pub fn check(self, from: JobStatus) -> crate::Result<JobStatus> {
        if self.allowed_from(from) {
            Ok(self.to())
        } else {
            Err(crate::Error::invalid(
                "job status",
                format!("cannot {self:?} a job that is {from}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::JobStatus::*;
    use super::*;

    #[test]
    fn the_full_job_transition_table() {
        for from in JobStatus::ALL {
            assert_eq!(JobTransition::Start.allowed_from(from), from == Pending);
            assert_eq!(
                JobTransition::Advance.allowed_from(from),
                from == Processing
            );
            assert_eq!(JobTransition::Park.allowed_from(from), from == Processing);
            assert_eq!(JobTransition::Resume.allowed_from(from), from == Waiting);
            for to in JobStatus::ALL {
                let t = JobTransition::Finish(to);
                assert_eq!(
                    t.allowed_from(from),
                    to.is_final() && !from.is_final(),
                    "{from} -> {to}"
                );
                match t.check(from) {
                    Ok(s) => assert_eq!(s, to),
                    Err(e) => assert!(e.to_string().contains(from.as_str())),
                }
            }
        }
    }

    #[test]
    fn success_and_final_sets() {
        let finals: Vec<_> = JobStatus::ALL
            .into_iter()
            .filter(|s| s.is_final())
            .collect();
        assert_eq!(
            finals,
            vec![Completed, CompletedNoItems, Skipped, Failed, Cancelled]
        );
        let ok: Vec<_> = JobStatus::ALL
            .into_iter()
            .filter(|s| s.is_success())
            .collect();
        assert_eq!(ok, vec![Completed, CompletedNoItems, Skipped]);
        for s in JobStatus::ALL {
            assert_eq!(s.as_str().parse::<JobStatus>().unwrap(), s);
        }
    }
}
