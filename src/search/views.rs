//! The operator views beyond the action list: keyset searches of jobs ([`JobSearch`]) and item
//! claims ([`ClaimSearch`]), both paged by id (newest first), and the per-group and per-scope
//! summaries ([`GroupStat`], [`ScopeStat`]) whose counts stop at a cap.

use crate::claims::ItemClaim;
use crate::error::{Error, Result};
use crate::jobs::Job;
use crate::state::{ClaimStatus, JobStatus};
use crate::store::Capped;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::MAX_PAGE;

/// A keyset-paged job search, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSearch {
    /// Only this status.
    pub status: Option<JobStatus>,
    /// Only this pipeline.
    pub pipeline: Option<String>,
    /// Only children of this batch parent.
    pub parent_id: Option<i64>,
    /// Only batch parents (jobs that fanned out).
    pub batches_only: bool,
    /// Ids below this one (next page)…
    pub after: Option<i64>,
    /// …or above it (previous page); at most one of the two.
    pub before: Option<i64>,
    /// Rows per page, 1 to [`MAX_PAGE`].
    pub limit: i64,
}

impl Default for JobSearch {
    fn default() -> Self {
        Self {
            status: None,
            pipeline: None,
            parent_id: None,
            batches_only: false,
            after: None,
            before: None,
            limit: 50,
        }
    }
}

/// Checks a page size and the cursors of an id-paged search.
fn check_id_page(limit: i64, after: Option<i64>, before: Option<i64>) -> Result<()> {
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::invalid(
            "limit",
            format!("{limit} is outside 1..={MAX_PAGE}"),
        ));
    }
    if after.is_some() && before.is_some() {
        return Err(Error::invalid(
            "cursor",
            "give `after` or `before`, not both",
        ));
    }
    Ok(())
}

impl JobSearch {
    /// Checks the search before any query; the error names the field.
    pub fn validate(&self) -> Result<()> {
        check_id_page(self.limit, self.after, self.before)
    }
}

/// A page of an id-paged search (newest first) with its neighbours' cursors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdPage<T> {
    /// The rows, newest first.
    pub rows: Vec<T>,
    /// `after` for the next (older) page, if there is one.
    pub next: Option<i64>,
    /// `before` for the previous (newer) page, if there may be one.
    pub prev: Option<i64>,
}

impl<T> IdPage<T> {
    /// Builds a page from at most `limit + 1` rows fetched in walk order: id descending, or
    /// ascending when paging `before` a cursor.
    pub fn assemble(
        mut rows: Vec<T>,
        id: impl Fn(&T) -> i64,
        limit: i64,
        after: Option<i64>,
        before: Option<i64>,
    ) -> Self {
        let limit = usize::try_from(limit).unwrap_or(0);
        let more = rows.len() > limit;
        rows.truncate(limit);
        if before.is_some() {
            rows.reverse();
            let prev = if more { rows.first().map(&id) } else { None };
            let next = rows.last().map(&id);
            Self { rows, next, prev }
        } else {
            let next = if more { rows.last().map(&id) } else { None };
            let prev = after.and_then(|_| rows.first().map(&id));
            Self { rows, next, prev }
        }
    }
}

/// A page of jobs.
pub type JobPage = IdPage<Job>;

/// A keyset-paged item-claim search, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSearch {
    /// Only this scope.
    pub scope: Option<String>,
    /// Only this status.
    pub status: Option<ClaimStatus>,
    /// Only claims of this job.
    pub job_id: Option<i64>,
    /// Only stale claims: `claimed` with `expires_at` before this time.
    pub stale_at: Option<DateTime<Utc>>,
    /// Ids below this one (next page)…
    pub after: Option<i64>,
    /// …or above it (previous page).
    pub before: Option<i64>,
    /// Rows per page, 1 to [`MAX_PAGE`].
    pub limit: i64,
}

impl Default for ClaimSearch {
    fn default() -> Self {
        Self {
            scope: None,
            status: None,
            job_id: None,
            stale_at: None,
            after: None,
            before: None,
            limit: 50,
        }
    }
}

impl ClaimSearch {
    /// Checks the search before any query; the error names the field.
    pub fn validate(&self) -> Result<()> {
        check_id_page(self.limit, self.after, self.before)?;
        if self.stale_at.is_some() && self.status.is_some_and(|s| s != ClaimStatus::Claimed) {
            return Err(Error::invalid(
                "status",
                "stale claims are `claimed` ones; drop the status or pick claimed",
            ));
        }
        Ok(())
    }
}

/// One item claim with its row id (the claims list's cursor).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimRow {
    /// The row id.
    pub id: i64,
    /// The claim.
    pub claim: ItemClaim,
}

/// A page of item claims.
pub type ClaimPage = IdPage<ClaimRow>;

/// One action group on the overview and the groups page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupStat {
    /// The group; `None` for actions without one.
    pub group: Option<String>,
    /// Pending actions (capped).
    pub pending: Capped,
    /// Pending actions already due (capped).
    pub due: Capped,
    /// Running actions (capped).
    pub running: Capped,
    /// When the oldest due pending action was due (lag = now − this).
    pub oldest_due: Option<DateTime<Utc>>,
}

/// A paused action group: claims skip its pending actions until it is resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPause {
    /// The group.
    pub group: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
    /// Who paused it (`ui:<user>`, or what the caller passed).
    pub paused_by: String,
}

/// One claim scope on the claims page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeStat {
    /// The scope.
    pub scope: String,
    /// Claims held now (capped).
    pub claimed: Capped,
    /// Processed items (capped).
    pub processed: Capped,
    /// Deferred items (capped).
    pub deferred: Capped,
    /// Held claims past their expiry (capped).
    pub stale: Capped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_pages_link_both_ways() {
        // Forward from the top: 5 fetched for a limit of 4 → a next page, no previous.
        let p = IdPage::assemble(vec![9, 8, 7, 6, 5], |x| *x, 4, None, None);
        assert_eq!((p.rows, p.next, p.prev), (vec![9, 8, 7, 6], Some(6), None));
        // After a cursor, the last page: a previous page, no next.
        let p = IdPage::assemble(vec![5, 4], |x| *x, 4, Some(6), None);
        assert_eq!((p.rows, p.next, p.prev), (vec![5, 4], None, Some(5)));
        // Before a cursor, walked upwards: rows come back newest first.
        let p = IdPage::assemble(vec![7, 8, 9], |x| *x, 2, None, Some(6));
        assert_eq!((p.rows, p.next, p.prev), (vec![8, 7], Some(7), Some(8)));
    }

    #[test]
    fn searches_name_bad_fields() {
        let e = JobSearch {
            limit: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("limit"));
        let e = ClaimSearch {
            stale_at: Some(Utc::now()),
            status: Some(ClaimStatus::Processed),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("status"));
    }
}
