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

/// What a delivered step action may do: the step boundary, decided by `Store::start_step` on
/// the job row it locked (B5, J2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepGate {
    /// The job is final, waiting, or at another step: nothing to do.
    Stale,
    /// A batch child whose parent an operator stopped (or that is final): no step starts.
    ParentStopped,
    /// The job fanned out already: its batch drives it, the step does not run again.
    FannedOut,
    /// `pending → processing` ([`JobTransition::Start`]), then run the step.
    Start,
    /// Already `processing` at this step: run it.
    Run,
}

/// The batch parent of a job, as the step boundary sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParentView<'a> {
    /// The parent's status.
    pub status: JobStatus,
    /// Its `batch_outcome` (`cancel_requested` is an operator's stop).
    pub outcome: Option<&'a str>,
}

/// The step boundary: a step action for `at_step` (whether the job's step index is the
/// action's) of a job in `status`. A child stops before any step once its parent is final or
/// stopped by an operator (a schedule failure lets started children finish, B3); a job that
/// fanned out never runs its step again (a re-delivery or an operator's retry resumes the
/// batch, whatever the attempt number).
pub fn step_gate(
    status: JobStatus,
    at_step: bool,
    fanned_out: bool,
    parent: Option<ParentView<'_>>,
) -> StepGate {
    if !at_step || !matches!(status, JobStatus::Pending | JobStatus::Processing) {
        return StepGate::Stale;
    }
    if let Some(p) = parent {
        if p.status.is_final() || p.outcome == Some(crate::batch::outcome::STOPPED) {
            return StepGate::ParentStopped;
        }
    }
    if fanned_out {
        StepGate::FannedOut
    } else if JobTransition::Start.allowed_from(status) {
        StepGate::Start
    } else {
        StepGate::Run
    }
}

#[cfg(test)]
mod tests {
    use super::JobStatus::*;
    use super::*;

    #[test]
    fn the_step_gate() {
        let live = ParentView {
            status: Processing,
            outcome: None,
        };
        let failed_schedule = ParentView {
            status: Processing,
            outcome: Some("batch_schedule_failed"),
        };
        let stopped = ParentView {
            status: Processing,
            outcome: Some("cancel_requested"),
        };
        let final_parent = ParentView {
            status: Failed,
            outcome: None,
        };
        for s in JobStatus::ALL {
            let open = matches!(s, Pending | Processing);
            assert_eq!(step_gate(s, false, false, None), StepGate::Stale, "{s}");
            if !open {
                assert_eq!(step_gate(s, true, true, Some(stopped)), StepGate::Stale);
                continue;
            }
            let run = if s == Pending {
                StepGate::Start
            } else {
                StepGate::Run
            };
            assert_eq!(step_gate(s, true, false, None), run);
            assert_eq!(step_gate(s, true, false, Some(live)), run);
            assert_eq!(step_gate(s, true, false, Some(failed_schedule)), run);
            assert_eq!(step_gate(s, true, true, None), StepGate::FannedOut);
            for p in [stopped, final_parent] {
                assert_eq!(step_gate(s, true, false, Some(p)), StepGate::ParentStopped);
                assert_eq!(step_gate(s, true, true, Some(p)), StepGate::ParentStopped);
            }
        }
    }

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
