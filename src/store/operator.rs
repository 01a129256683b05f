//! What every backend's operator views and bulk changes share (no SQL): the checks of their
//! arguments (bulk id lists, `args contains` candidates), the time column each sort filters
//! on, and the assembly of results (throughput buckets with the empty ones filled in, bulk
//! outcomes).

use super::types::{BulkOutcome, ThroughputBucket};
use crate::error::{Error, Result};
use crate::search::{ActionSort, MAX_PAGE};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// The hooks of the actions a job owns: its step actions, its finish action, and a batch
/// parent's chunk and finalize actions. Each is its job's scheduler path (R2), so an
/// operator's cancel, unschedule or delete of an active one would leave the job `processing`
/// with nothing to move it; every backend's operator writes skip them
/// (`job_owned_hooks!`; [`Error::OwnedByJob`] from [`crate::Queue::cancel`]). The job's own
/// commands (`cancel-job`, `Jobs::cancel`) stop it through the bridge instead.
pub const JOB_OWNED_HOOKS: [&str; 4] = [
    crate::jobs::STEP_HOOK,
    crate::jobs::FINISH_HOOK,
    crate::batch::CHUNK_HOOK,
    crate::batch::FINALIZE_HOOK,
];

/// The job that owns an action of hook `hook` and args `args`: `job` of a step or finish
/// action, `parent` of a chunk or finalize action; `None` for any other hook (or args without
/// the id).
pub fn owning_job(hook: &str, args: &Value) -> Option<i64> {
    let field = match hook {
        crate::jobs::STEP_HOOK | crate::jobs::FINISH_HOOK => "job",
        crate::batch::CHUNK_HOOK | crate::batch::FINALIZE_HOOK => "parent",
        _ => return None,
    };
    args.get(field)?.as_i64()
}

/// [`JOB_OWNED_HOOKS`] as an SQL list, `('…', …)`, for `hook NOT IN …` in the backends'
/// operator writes (a literal, so a statement stays one `concat!`; a unit test checks it
/// against the constants).
macro_rules! job_owned_hooks {
    () => {
        "('dockhand.job.step', 'dockhand.job.finish', 'dockhand.batch.chunk', \
         'dockhand.batch.finalize')"
    };
}
pub(crate) use job_owned_hooks;

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

/// Refuses an oversized id list for a bulk change, naming `ids` (an empty one changes nothing).
pub fn check_bulk_ids(ids: &[i64]) -> Result<()> {
    if ids.len() as i64 > MAX_PAGE {
        return Err(Error::invalid(
            "ids",
            format!("{} ids; a bulk change takes at most {MAX_PAGE}", ids.len()),
        ));
    }
    Ok(())
}

/// How deep an `args contains` candidate compiled into SQL (no native containment) may nest.
pub const ARGS_MAX_DEPTH: usize = 8;
/// How many values (keys' values and elements, at every level) a compiled candidate may hold.
pub const ARGS_MAX_NODES: usize = 64;

fn bad_candidate(why: String) -> Error {
    Error::invalid("args_contains", why)
}

/// Refuses an `args contains` candidate that is not a JSON object or array (every backend).
pub fn check_candidate_shape(cand: &Value) -> Result<()> {
    if cand.is_object() || cand.is_array() {
        Ok(())
    } else {
        Err(bad_candidate(format!(
            "`{cand}` must be a JSON object or array"
        )))
    }
}

/// Refuses what a candidate compiled into a condition over JSON paths cannot express or would
/// make too large: a scalar, keys holding `"`, `\` or control characters (a JSON path cannot
/// quote them), nesting deeper than [`ARGS_MAX_DEPTH`], more than [`ARGS_MAX_NODES`] values.
pub fn check_compiled_candidate(cand: &Value) -> Result<()> {
    check_candidate_shape(cand)?;
    let mut nodes = 0;
    check_node(cand, 0, &mut nodes)
}

fn check_node(v: &Value, depth: usize, nodes: &mut usize) -> Result<()> {
    if depth > ARGS_MAX_DEPTH {
        return Err(bad_candidate(format!(
            "nested deeper than {ARGS_MAX_DEPTH} levels"
        )));
    }
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Object(m) => {
            if let Some(k) = m.keys().find(|k| !key_is_quotable(k)) {
                return Err(bad_candidate(format!(
                    "key {k:?} holds a quote, a backslash or a control character"
                )));
            }
            Box::new(m.values())
        }
        Value::Array(a) => Box::new(a.iter()),
        _ => return Ok(()),
    };
    for c in children {
        *nodes += 1;
        if *nodes > ARGS_MAX_NODES {
            return Err(bad_candidate(format!("more than {ARGS_MAX_NODES} values")));
        }
        check_node(c, depth + 1, nodes)?;
    }
    Ok(())
}

/// Whether a key can be written inside a double-quoted JSON path member (`$."k"`).
pub fn key_is_quotable(k: &str) -> bool {
    !k.chars().any(|c| c == '"' || c == '\\' || c.is_control())
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
    fn compiled_candidates_are_checked_by_name() {
        use serde_json::json;
        for (cand, why) in [
            (json!(3), "must be a JSON object or array"),
            (json!({"a\"b": 1}), "quote"),
            (json!({"a": {"b\\": 1}}), "backslash"),
            (json!({"a\n": 1}), "control"),
        ] {
            let e = check_compiled_candidate(&cand).unwrap_err().to_string();
            assert!(
                e.contains("args_contains") && e.contains(why),
                "{cand}: {e}"
            );
        }
        assert!(check_candidate_shape(&json!({"a\"b": 1})).is_ok());
        let mut deep = json!(1);
        for _ in 0..=ARGS_MAX_DEPTH + 1 {
            deep = json!({ "a": deep });
        }
        let e = check_compiled_candidate(&deep).unwrap_err().to_string();
        assert!(e.contains("deeper"), "{e}");
        let wide: Value = (0..=ARGS_MAX_NODES).map(|i| json!(i)).collect();
        let e = check_compiled_candidate(&wide).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        assert!(check_compiled_candidate(&json!({"a": [1, {"b": null}], "c d": "x"})).is_ok());
    }

    #[test]
    fn owning_job_reads_the_job_or_parent_of_job_owned_hooks_only() {
        use serde_json::json;
        assert_eq!(
            owning_job(crate::jobs::STEP_HOOK, &json!({"job": 7, "step": 1})),
            Some(7)
        );
        assert_eq!(
            owning_job(crate::jobs::FINISH_HOOK, &json!({"job": 8})),
            Some(8)
        );
        assert_eq!(
            owning_job(crate::batch::CHUNK_HOOK, &json!({"parent": 9})),
            Some(9)
        );
        assert_eq!(
            owning_job(crate::batch::FINALIZE_HOOK, &json!({"parent": 3})),
            Some(3)
        );
        assert_eq!(owning_job("send.mail", &json!({"job": 7})), None);
        assert_eq!(
            owning_job(crate::jobs::STEP_HOOK, &json!({"job": "x"})),
            None
        );
    }

    #[test]
    fn the_sql_list_of_job_owned_hooks_names_every_one() {
        let listed: Vec<&str> = job_owned_hooks!()
            .trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .map(|h| h.trim().trim_matches('\''))
            .collect();
        assert_eq!(listed, JOB_OWNED_HOOKS);
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
