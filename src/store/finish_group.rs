//! What the backends' grouped step starts and bridge finishes ([`super::Store::start_steps`],
//! [`super::Store::finish_jobs`]) share: the order a group is worked in (job-id order, so
//! concurrent groups lock rows in one order) and the per-parent tally of finished children
//! (a parent's counters are updated once per group with the summed deltas), what one job's
//! part of a bridge transaction did ([`InTx`]) and how a group's outcomes are recorded
//! ([`GroupOutcomes`]).

use crate::error::{Error, Result};
use crate::jobs::{BridgeOutcome, FinishRequest};
use crate::state::JobStatus;
use crate::store::Lease;
use std::collections::BTreeMap;

/// What one job's part of a bridge transaction did (each backend's `bridge::finish_in_tx`).
#[derive(Debug)]
pub(crate) enum InTx {
    /// Status, claims and event written; the parent's counters are the caller's to bump.
    Finished {
        /// The job's batch parent.
        parent: Option<i64>,
    },
    /// The job was final already: nothing written.
    AlreadyFinal {
        /// The standing status.
        status: JobStatus,
        /// Its reason.
        reason: Option<String>,
    },
    /// A claim completion failed for good: the caller must roll back.
    ClaimCompletionFailed {
        /// What failed.
        error: String,
    },
}

/// A grouped finish's outcomes as its jobs are worked ([`job_order`]), and the tally of its
/// parents' finished children.
#[derive(Debug)]
pub(crate) struct GroupOutcomes {
    out: Vec<Option<BridgeOutcome>>,
    tally: ParentTally,
}

/// A job's part of a group that makes the whole group roll back: a claim completion failed,
/// for good or transiently.
#[derive(Debug)]
pub(crate) struct RollBack {
    /// The job whose completion failed.
    pub(crate) job_id: i64,
    /// What failed.
    pub(crate) error: String,
}

impl GroupOutcomes {
    /// Outcomes for a group of `n` requests.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            out: vec![None; n],
            tally: ParentTally::default(),
        }
    }

    /// Request `i`'s step run no longer holds `lease`: nothing was written for it.
    pub(crate) fn lease_lost(&mut self, i: usize, lease: Lease) {
        self.out[i] = Some(BridgeOutcome::LeaseLost {
            action_id: lease.id,
            token: lease.token,
        });
    }

    /// Records what request `i` (`req`) did in the transaction. `Ok(Some(_))`: the group must
    /// be rolled back; a database error is returned as it is.
    pub(crate) fn record(
        &mut self,
        i: usize,
        req: &FinishRequest,
        done: Result<InTx>,
    ) -> Result<Option<RollBack>> {
        let outcome = match done {
            Ok(InTx::Finished { parent }) => {
                if let Some(parent) = parent {
                    self.tally.add(parent, req.status);
                }
                BridgeOutcome::Finished
            }
            Ok(InTx::AlreadyFinal { status, reason }) => {
                BridgeOutcome::AlreadyFinal { status, reason }
            }
            Ok(InTx::ClaimCompletionFailed { error }) => {
                return Ok(Some(RollBack {
                    job_id: req.job_id,
                    error,
                }))
            }
            Err(e @ Error::TransientCompletion { .. }) => {
                return Ok(Some(RollBack {
                    job_id: req.job_id,
                    error: e.to_string(),
                }))
            }
            Err(e) => return Err(e),
        };
        self.out[i] = Some(outcome);
        Ok(None)
    }

    /// The parents whose counters the group bumps, with their summed deltas, in id order.
    pub(crate) fn parents(&self) -> impl Iterator<Item = (i64, ChildDeltas)> + '_ {
        self.tally.parents()
    }

    /// The outcomes in request order.
    pub(crate) fn into_results(self) -> Result<Vec<BridgeOutcome>> {
        in_request_order(self.out)
    }
}

/// What a backend's set-based group finish did on its open transaction.
pub(crate) enum SetFinished {
    /// Every request's part is written (uncommitted): the outcomes, and the parents to bump.
    Written(GroupOutcomes),
    /// A claim completion failed: the caller must roll back.
    RollBack(RollBack),
}

/// The indexes of `ids` in ascending id order (stable: equal ids keep their request order).
pub(crate) fn job_order(ids: impl Iterator<Item = i64>) -> Vec<usize> {
    let mut order: Vec<(i64, usize)> = ids.enumerate().map(|(i, id)| (id, i)).collect();
    order.sort();
    order.into_iter().map(|(_, i)| i).collect()
}

/// The results of a group worked in [`job_order`], back in request order.
pub(crate) fn in_request_order<T>(slots: Vec<Option<T>>) -> Result<Vec<T>> {
    let n = slots.len();
    slots
        .into_iter()
        .collect::<Option<Vec<T>>>()
        .ok_or_else(|| {
            Error::Config(format!(
                "grouped store call: a request of {n} got no result"
            ))
        })
}

/// Refuses a group holding a request with a status that is not final (nothing is written).
pub(crate) fn check_final(reqs: &[FinishRequest]) -> Result<()> {
    match reqs.iter().find(|r| !r.status.is_final()) {
        Some(r) => Err(Error::invalid(
            "job status",
            format!(
                "cannot finish job {} as {}: not a final status",
                r.job_id, r.status
            ),
        )),
        None => Ok(()),
    }
}

/// How many children of one parent reached each counted final status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChildDeltas {
    /// `children_completed`: completed.
    pub(crate) completed: i64,
    /// `children_failed`: failed, cancelled.
    pub(crate) failed: i64,
    /// `children_skipped`: skipped, completed_no_items.
    pub(crate) skipped: i64,
}

impl ChildDeltas {
    /// One child finished with `status`; `None` for a status that is not final.
    pub(crate) fn of(status: JobStatus) -> Option<Self> {
        let mut d = Self::default();
        d.add(status).then_some(d)
    }

    /// Counts one more child finished with `status`; false (nothing counted) when it is not
    /// final.
    pub(crate) fn add(&mut self, status: JobStatus) -> bool {
        match status {
            JobStatus::Completed => self.completed += 1,
            JobStatus::Failed | JobStatus::Cancelled => self.failed += 1,
            JobStatus::Skipped | JobStatus::CompletedNoItems => self.skipped += 1,
            JobStatus::Pending | JobStatus::Processing | JobStatus::Waiting => return false,
        }
        true
    }

    /// `children_terminal`'s delta.
    pub(crate) fn terminal(&self) -> i64 {
        self.completed + self.failed + self.skipped
    }
}

/// The finished children of a group by parent, parents in id order (the order their rows are
/// locked in).
#[derive(Debug, Default)]
pub(crate) struct ParentTally(BTreeMap<i64, ChildDeltas>);

impl ParentTally {
    /// A child of `parent` finished with `status`.
    pub(crate) fn add(&mut self, parent: i64, status: JobStatus) {
        self.0.entry(parent).or_default().add(status);
    }

    /// Each parent with its summed deltas, in id order.
    pub(crate) fn parents(&self) -> impl Iterator<Item = (i64, ChildDeltas)> + '_ {
        self.0
            .iter()
            .filter(|(_, d)| d.terminal() > 0)
            .map(|(p, d)| (*p, *d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(job_id: i64, status: JobStatus) -> FinishRequest {
        FinishRequest {
            job_id,
            status,
            reason: None,
            lease: None,
            complete_run: false,
            superseded: None,
        }
    }

    #[test]
    fn group_outcomes_keep_request_order_tally_parents_and_roll_back() {
        let mut g = GroupOutcomes::new(3);
        let (a, b, c) = (
            req(7, JobStatus::Completed),
            req(3, JobStatus::Failed),
            req(5, JobStatus::Completed),
        );
        let done = g.record(1, &b, Ok(InTx::Finished { parent: Some(1) }));
        assert!(done.unwrap().is_none());
        g.lease_lost(2, Lease { id: 40, token: 2 });
        let final_ = InTx::AlreadyFinal {
            status: JobStatus::Cancelled,
            reason: None,
        };
        assert!(g.record(0, &a, Ok(final_)).unwrap().is_none());
        let parents: Vec<_> = g.parents().collect();
        assert_eq!(parents.len(), 1);
        assert_eq!((parents[0].0, parents[0].1.failed), (1, 1));
        let transient = Err(Error::TransientCompletion {
            item_id: "i".into(),
            job_id: Some(5),
            message: "busy".into(),
        });
        let rb = g.record(2, &c, transient).unwrap().unwrap();
        assert_eq!(rb.job_id, 5);
        let failed = InTx::ClaimCompletionFailed { error: "no".into() };
        assert_eq!(g.record(2, &c, Ok(failed)).unwrap().unwrap().error, "no");
        let db = Err(Error::Config("db".into()));
        assert!(g.record(2, &c, db).is_err());
        assert_eq!(
            g.into_results().unwrap(),
            vec![
                BridgeOutcome::AlreadyFinal {
                    status: JobStatus::Cancelled,
                    reason: None
                },
                BridgeOutcome::Finished,
                BridgeOutcome::LeaseLost {
                    action_id: 40,
                    token: 2
                },
            ]
        );
        assert!(GroupOutcomes::new(1).into_results().is_err());
    }

    #[test]
    fn order_is_by_id_and_stable() {
        assert_eq!(job_order([5, 2, 5, 1].into_iter()), vec![3, 1, 0, 2]);
    }

    #[test]
    fn tally_sums_per_parent() {
        let mut t = ParentTally::default();
        t.add(9, JobStatus::Completed);
        t.add(3, JobStatus::Failed);
        t.add(9, JobStatus::Skipped);
        t.add(9, JobStatus::Completed);
        t.add(3, JobStatus::Processing);
        let got: Vec<_> = t.parents().collect();
        assert_eq!(
            got,
            vec![
                (
                    3,
                    ChildDeltas {
                        completed: 0,
                        failed: 1,
                        skipped: 0
                    }
                ),
                (
                    9,
                    ChildDeltas {
                        completed: 2,
                        failed: 0,
                        skipped: 1
                    }
                ),
            ]
        );
        assert_eq!(ChildDeltas::of(JobStatus::Waiting), None);
    }
}
