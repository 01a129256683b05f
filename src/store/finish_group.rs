//! What the backends' grouped step starts and bridge finishes ([`super::Store::start_steps`],
//! [`super::Store::finish_jobs`]) share: the order a group is worked in (job-id order, so
//! concurrent groups lock rows in one order) and the per-parent tally of finished children
//! (a parent's counters are updated once per group with the summed deltas), what one job's
//! part of a bridge transaction did ([`InTx`]) and how a group's outcomes are recorded
//! ([`GroupOutcomes`]).

use crate::error::{Error, Result};
use crate::jobs::{BridgeOutcome, FinishRequest, Job};
use crate::state::JobStatus;
use crate::store::Lease;
use std::collections::{BTreeMap, HashMap};

/// What one job's part of a bridge transaction did (each backend's `bridge::finish_in_tx`).
#[derive(Debug)]
pub(crate) enum InTx {
    /// Status, claims and event written; the parent's counters are the caller's to bump.
    Finished {
        /// The job's batch parent.
        parent: Option<i64>,
        /// The step it finished at (the key of a step action still queued for it:
        /// [`crate::jobs::step_action_key`]).
        step: i32,
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
            Ok(InTx::Finished { parent, .. }) => {
                if let Some(parent) = parent {
                    self.tally.add(parent, req.status);
                }
                BridgeOutcome::Finished
            }
            Ok(InTx::AlreadyFinal { status, reason }) => {
                BridgeOutcome::AlreadyFinal { status, reason }
            }
            Ok(InTx::ClaimCompletionFailed { error }) => {
                return roll_back_on(req.job_id, Ok(Err(error)))
            }
            Err(e) => return roll_back_on(req.job_id, Err(e)),
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

/// A claim completion's result for one job (each backend's `complete_claims`): the inner `Err`
/// is a completion that failed for good, the outer one a database error or a transient
/// completion failure ([`Error::TransientCompletion`]).
pub(crate) type Completed = Result<std::result::Result<(), String>>;

/// `done` for job `job_id` as the group's fate: `Ok(None)` goes on, `Ok(Some(_))` rolls the
/// group back (a completion failed, for good or transiently), a database error is returned.
pub(crate) fn roll_back_on(job_id: i64, done: Completed) -> Result<Option<RollBack>> {
    match done {
        Ok(Ok(())) => Ok(None),
        Ok(Err(error)) => Ok(Some(RollBack { job_id, error })),
        Err(e @ Error::TransientCompletion { .. }) => Ok(Some(RollBack {
            job_id,
            error: e.to_string(),
        })),
        Err(e) => Err(e),
    }
}

/// One job a set-based group finish moves to its final status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Move<'a> {
    /// The job.
    pub(crate) job_id: i64,
    /// Its final status (the request's).
    pub(crate) status: JobStatus,
    /// The request's reason.
    pub(crate) reason: Option<&'a str>,
    /// Its status when read: the compare-and-swap's guard.
    pub(crate) was: JobStatus,
    /// Its event is written delivered ([`FinishRequest::event_delivered`]).
    pub(crate) event_delivered: bool,
}

/// A set-based group finish decided before its claims are completed ([`plan`]).
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// Every request's outcome, the moves' as [`BridgeOutcome::Finished`] with their parents
    /// tallied: valid once every succeeding move's claims completed (otherwise the group rolls
    /// back and these are dropped).
    pub(crate) group: GroupOutcomes,
    /// The jobs to move, in job order (the order their claims are completed in).
    pub(crate) moves: Vec<Move<'a>>,
}

/// The single bridge path's decisions for a group, request by request in [`job_order`]: a run
/// that lost its lease (`held[i]` false) leaves its job alone, a job already final (or moved
/// by an earlier request of the group) is [`InTx::AlreadyFinal`], any other job moves to the
/// request's status. `jobs` holds the held requests' jobs, read under their row locks; a
/// held request whose job is missing is [`Error::NotFound`].
pub(crate) fn plan<'a>(
    reqs: &'a [FinishRequest],
    held: &[bool],
    jobs: &HashMap<i64, Job>,
) -> Result<Plan<'a>> {
    let mut group = GroupOutcomes::new(reqs.len());
    let mut moves = Vec::new();
    let mut moved: HashMap<i64, (JobStatus, Option<String>)> = HashMap::new();
    for i in job_order(reqs.iter().map(|r| r.job_id)) {
        let r = &reqs[i];
        if !held.get(i).copied().unwrap_or(false) {
            if let Some(lease) = r.lease {
                group.lease_lost(i, lease);
            }
            continue;
        }
        let Some(job) = jobs.get(&r.job_id) else {
            return Err(Error::NotFound {
                what: "job",
                id: r.job_id,
            });
        };
        let standing = moved.get(&r.job_id).cloned().or_else(|| {
            job.status
                .is_final()
                .then(|| (job.status, job.reason.clone()))
        });
        if let Some((status, reason)) = standing {
            group.record(i, r, Ok(InTx::AlreadyFinal { status, reason }))?;
            continue;
        }
        moves.push(Move {
            job_id: r.job_id,
            status: r.status,
            reason: r.reason.as_deref(),
            was: job.status,
            event_delivered: r.event_delivered,
        });
        moved.insert(r.job_id, (r.status, r.reason.clone()));
        let finished = InTx::Finished {
            parent: job.parent_id,
            step: job.step_index,
        };
        group.record(i, r, Ok(finished))?;
    }
    Ok(Plan { group, moves })
}

/// Checks that a grouped write moved all `n` jobs it was meant to: the rows are locked and
/// were read under the lock, so fewer is unreachable; never report a write that did not
/// happen.
pub(crate) fn all_moved(op: &str, moved: u64, n: usize) -> Result<()> {
    if moved == n as u64 {
        return Ok(());
    }
    Err(Error::Config(format!(
        "{op}: {} of {n} jobs changed under their row locks",
        (n as u64).saturating_sub(moved)
    )))
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
            event_delivered: false,
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
        let done = g.record(
            1,
            &b,
            Ok(InTx::Finished {
                parent: Some(1),
                step: 0,
            }),
        );
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

    fn job(id: i64, status: JobStatus, parent_id: Option<i64>) -> (i64, Job) {
        let at = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let job = Job {
            id,
            pipeline: "p".into(),
            status,
            reason: status.is_final().then(|| "before".to_string()),
            step_index: 0,
            input_refs: vec![],
            engine_version: 0,
            parent_id,
            created_at: at,
            updated_at: at,
            finished_at: None,
        };
        (id, job)
    }

    #[test]
    fn plan_decides_each_request_as_the_single_path_in_job_order() {
        let mut lost = req(2, JobStatus::Completed);
        lost.lease = Some(Lease { id: 70, token: 4 });
        let mut failing = req(8, JobStatus::Failed);
        failing.reason = Some("boom".into());
        let reqs = vec![
            req(9, JobStatus::Completed),
            lost,
            failing,
            req(5, JobStatus::Completed),
            req(8, JobStatus::Completed),
        ];
        let held = [true, false, true, true, true];
        let jobs: HashMap<i64, Job> = [
            job(9, JobStatus::Processing, Some(1)),
            job(2, JobStatus::Processing, None),
            job(8, JobStatus::Processing, Some(1)),
            job(5, JobStatus::Cancelled, Some(1)),
        ]
        .into_iter()
        .collect();
        let Plan { group, moves } = plan(&reqs, &held, &jobs).unwrap();
        let moved = |job_id, status, reason| Move {
            job_id,
            status,
            reason,
            was: JobStatus::Processing,
            event_delivered: false,
        };
        // Job order; job 8's second request finds the first's status; job 5 was final.
        assert_eq!(
            moves,
            vec![
                moved(8, JobStatus::Failed, Some("boom")),
                moved(9, JobStatus::Completed, None)
            ]
        );
        let parents: Vec<_> = group.parents().collect();
        assert_eq!(parents.len(), 1, "both moves tallied on parent 1");
        assert_eq!((parents[0].1.completed, parents[0].1.failed), (1, 1));
        assert_eq!(
            group.into_results().unwrap(),
            vec![
                BridgeOutcome::Finished,
                BridgeOutcome::LeaseLost {
                    action_id: 70,
                    token: 4
                },
                BridgeOutcome::Finished,
                BridgeOutcome::AlreadyFinal {
                    status: JobStatus::Cancelled,
                    reason: Some("before".into())
                },
                BridgeOutcome::AlreadyFinal {
                    status: JobStatus::Failed,
                    reason: Some("boom".into())
                },
            ]
        );
        // A held request whose job has no row is named.
        let missing = plan(&reqs[..1], &[true], &HashMap::new()).unwrap_err();
        assert!(
            matches!(missing, Error::NotFound { what: "job", id: 9 }),
            "{missing}"
        );
    }

    #[test]
    fn roll_back_on_names_the_job_and_passes_database_errors() {
        assert!(roll_back_on(3, Ok(Ok(()))).unwrap().is_none());
        assert_eq!(
            roll_back_on(3, Ok(Err("bad".into())))
                .unwrap()
                .unwrap()
                .error,
            "bad"
        );
        let transient = Error::TransientCompletion {
            item_id: "i".into(),
            job_id: Some(3),
            message: "busy".into(),
        };
        assert_eq!(roll_back_on(3, Err(transient)).unwrap().unwrap().job_id, 3);
        assert!(roll_back_on(3, Err(Error::Config("db".into()))).is_err());
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
