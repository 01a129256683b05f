//! What the backends' grouped step starts and bridge finishes ([`super::Store::start_steps`],
//! [`super::Store::finish_jobs`]) share: the order a group is worked in (job-id order, so
//! concurrent groups lock rows in one order) and the per-parent tally of finished children
//! (a parent's counters are updated once per group with the summed deltas).

use crate::error::{Error, Result};
use crate::jobs::FinishRequest;
use crate::state::JobStatus;
use std::collections::BTreeMap;

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
