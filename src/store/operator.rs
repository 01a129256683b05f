//! What every backend's operator views and bulk changes share (no SQL): the checks of their
//! arguments, the time column each sort filters on, and the assembly of results
//! (throughput buckets with the empty ones filled in, bulk outcomes).

use super::types::{BulkOutcome, ThroughputBucket};
use crate::error::{Error, Result};
use crate::search::{ActionSort, MAX_PAGE};
use chrono::{DateTime, Utc};
use std::collections::{BTreeSet, HashMap};

/// The most buckets one throughput query returns.
pub const MAX_BUCKETS: i64 = 10_000;

/// The time column a search's `from`/`to` range applies to.
pub fn time_column(sort: ActionSort) -> &'static str {
    match sort {
        ActionSort::NextToRun | ActionSort::Scheduled => "scheduled_at",
        ActionSort::Lease => "lease_until",
        ActionSort::FinishedDesc => "finished_at",
        ActionSort::IdDesc => "created_at",
    }
}

/// The columns of a sort's keys, in cursor order (the id last).
pub fn key_columns(sort: ActionSort) -> &'static [&'static str] {
    match sort {
        ActionSort::NextToRun => &["priority", "scheduled_at", "id"],
        ActionSort::Scheduled => &["scheduled_at", "id"],
        ActionSort::Lease => &["lease_until", "id"],
        ActionSort::FinishedDesc => &["finished_at", "id"],
        ActionSort::IdDesc => &["id"],
    }
}

/// Refuses an empty or oversized id list for a bulk change, naming `ids`.
pub fn check_bulk_ids(ids: &[i64]) -> Result<()> {
    if ids.len() as i64 > MAX_PAGE {
        return Err(Error::invalid(
            "ids",
            format!("{} ids; a bulk change takes at most {MAX_PAGE}", ids.len()),
        ));
    }
    Ok(())
}

/// The bulk outcome: `changed` sorted, and every other distinct id of `ids` skipped.
pub fn outcome(ids: &[i64], changed: impl IntoIterator<Item = i64>) -> BulkOutcome {
    let changed: BTreeSet<i64> = changed.into_iter().collect();
    let skipped: BTreeSet<i64> = ids
        .iter()
        .copied()
        .filter(|id| !changed.contains(id))
        .collect();
    BulkOutcome {
        changed: changed.into_iter().collect(),
        skipped: skipped.into_iter().collect(),
    }
}

/// A throughput window checked and aligned: (first bucket index, bucket count, bucket ms).
pub fn bucket_window(
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    bucket: chrono::Duration,
) -> Result<(i64, i64, i64)> {
    let width = bucket.num_milliseconds();
    if width <= 0 {
        return Err(Error::invalid(
            "bucket",
            format!("{bucket} is not positive"),
        ));
    }
    if until <= since {
        return Err(Error::invalid(
            "time range",
            format!("since {since} is not before until {until}"),
        ));
    }
    let first = since.timestamp_millis().div_euclid(width);
    let end = (until.timestamp_millis() + width - 1).div_euclid(width);
    let count = end - first;
    if count > MAX_BUCKETS {
        return Err(Error::invalid(
            "bucket",
            format!("{count} buckets; at most {MAX_BUCKETS} per query"),
        ));
    }
    Ok((first, count, width))
}

/// Every bucket of the window, oldest first, with the counted ones `(index, completed,
/// failed)` filled in.
pub fn fill_buckets(
    first: i64,
    count: i64,
    width: i64,
    rows: &[(i64, i64, i64)],
) -> Vec<ThroughputBucket> {
    let by_index: HashMap<i64, (i64, i64)> = rows.iter().map(|&(b, c, f)| (b, (c, f))).collect();
    (first..first + count)
        .map(|b| {
            let (completed, failed) = by_index.get(&b).copied().unwrap_or((0, 0));
            ThroughputBucket {
                start: DateTime::<Utc>::from_timestamp_millis(b * width).unwrap_or_default(),
                completed,
                failed,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn buckets_are_aligned_filled_and_bounded() {
        let t = |m: i64| Utc.timestamp_millis_opt(m * 60_000).unwrap();
        let (first, count, width) = bucket_window(
            t(10) + chrono::Duration::seconds(5),
            t(13),
            chrono::Duration::minutes(1),
        )
        .unwrap();
        assert_eq!((first, count, width), (10, 3, 60_000));
        let b = fill_buckets(first, count, width, &[(11, 4, 1)]);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].start, t(10));
        assert_eq!((b[1].completed, b[1].failed), (4, 1));
        assert_eq!((b[2].completed, b[2].failed), (0, 0));
        let e = bucket_window(t(0), t(1), chrono::Duration::zero()).unwrap_err();
        assert!(e.to_string().contains("bucket"));
        let e = bucket_window(t(1), t(1), chrono::Duration::minutes(1)).unwrap_err();
        assert!(e.to_string().contains("time range"));
        let e = bucket_window(t(0), t(20_000), chrono::Duration::minutes(1)).unwrap_err();
        assert!(e.to_string().contains("at most"));
    }

    #[test]
    fn outcomes_split_ids_and_bulk_lists_are_bounded() {
        let o = outcome(&[5, 3, 9, 3], [9, 3]);
        assert_eq!(o.changed, vec![3, 9]);
        assert_eq!(o.skipped, vec![5]);
        assert!(check_bulk_ids(&[1; 500]).is_ok());
        assert!(check_bulk_ids(&[1; 501])
            .unwrap_err()
            .to_string()
            .contains("ids"));
    }
}
