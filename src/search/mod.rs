//! What a keyset-paged action list asks for (issue 8, docs/dashboard_plan.md §2): the filters
//! ([`ActionSearch`]), the sort orders that each have an index ([`ActionSort`]), and the
//! position a page starts after ([`Cursor`]), written in URLs as plain text.
//!
//! This module owns their shapes, their parsing, the validation that names what was wrong, what
//! a page holds ([`ActionSummary`], [`ActionPage`]) and how a page is assembled from the rows a
//! store fetched ([`ActionPage::assemble`]); the SQL of each backend lives in `store/<backend>/ui.rs`.

mod views;

pub use views::{
    ClaimPage, ClaimRow, ClaimSearch, GroupPause, GroupStat, IdPage, JobPage, JobSearch, ScopeStat,
};

use crate::error::{Error, Result};
use crate::state::ActionStatus;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

/// The sort orders a list offers; each is served by one index (plan §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionSort {
    /// `(priority, scheduled_at, id)` ascending: what runs next (pending, the default).
    NextToRun,
    /// `(scheduled_at, id)` ascending.
    Scheduled,
    /// `(lease_until, id)` ascending: running actions whose lease ends first.
    Lease,
    /// `(finished_at, id)` descending: the latest finished first.
    FinishedDesc,
    /// `id` descending: newest first.
    IdDesc,
}

impl ActionSort {
    /// Every sort order.
    pub const ALL: [ActionSort; 5] = [
        ActionSort::NextToRun,
        ActionSort::Scheduled,
        ActionSort::Lease,
        ActionSort::FinishedDesc,
        ActionSort::IdDesc,
    ];

    /// The name used in URLs and cursors.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionSort::NextToRun => "n",
            ActionSort::Scheduled => "s",
            ActionSort::Lease => "l",
            ActionSort::FinishedDesc => "f",
            ActionSort::IdDesc => "i",
        }
    }

    /// How many integer keys a cursor of this order carries (the last is always the id).
    pub fn keys(self) -> usize {
        match self {
            ActionSort::NextToRun => 3,
            ActionSort::Scheduled | ActionSort::Lease | ActionSort::FinishedDesc => 2,
            ActionSort::IdDesc => 1,
        }
    }

    /// Whether the order walks its keys downwards (latest first).
    pub fn descending(self) -> bool {
        matches!(self, ActionSort::FinishedDesc | ActionSort::IdDesc)
    }

    /// Parses the name used in URLs.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// A position in one sort order: the sort keys of the last row of a page, times as Unix
/// milliseconds, the id last. Written `<sort>.<key>.<key>…`, e.g. `n.10.1733155200000.4711`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The order the keys belong to.
    pub sort: ActionSort,
    /// The keys, [`ActionSort::keys`] of them.
    pub keys: Vec<i64>,
}

impl Cursor {
    /// A cursor; refuses a key count that does not fit the order.
    pub fn new(sort: ActionSort, keys: Vec<i64>) -> Result<Self> {
        if keys.len() != sort.keys() {
            return Err(Error::invalid(
                "cursor",
                format!(
                    "sort `{}` needs {} key(s), got {}",
                    sort.as_str(),
                    sort.keys(),
                    keys.len()
                ),
            ));
        }
        Ok(Self { sort, keys })
    }

    /// The id of the row the cursor points at.
    pub fn id(&self) -> i64 {
        self.keys.last().copied().unwrap_or(0)
    }

    /// Parses the text form; the error names the cursor and what is wrong with it.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |why: String| Error::invalid("cursor", format!("`{text}`: {why}"));
        let mut parts = text.split('.');
        let name = parts.next().unwrap_or("");
        let sort = ActionSort::parse(name).ok_or_else(|| bad(format!("unknown sort `{name}`")))?;
        let keys = parts
            .map(|p| {
                p.parse::<i64>()
                    .map_err(|_| bad(format!("`{p}` is not an integer")))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(sort, keys).map_err(|e| bad(e.to_string()))
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.sort.as_str())?;
        for k in &self.keys {
            write!(f, ".{k}")?;
        }
        Ok(())
    }
}

/// The hook prefix of the runtime's own actions (job steps, chunks, finalizers).
pub const INTERNAL_HOOK_PREFIX: &str = "dockhand.";

/// The largest page a search returns.
pub const MAX_PAGE: i64 = 500;

/// A keyset-paged action search.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionSearch {
    /// Only this status.
    pub status: Option<ActionStatus>,
    /// Only this hook.
    pub hook: Option<String>,
    /// `Some(Some(g))`: group `g`; `Some(None)`: no group; `None`: any.
    pub group: Option<Option<String>>,
    /// Priority range, inclusive.
    pub priority: Option<(i32, i32)>,
    /// Range on the sort's time column (scheduled, lease or finished time), inclusive start.
    pub from: Option<DateTime<Utc>>,
    /// Exclusive end of that range.
    pub to: Option<DateTime<Utc>>,
    /// Args containing this JSON object or array (PostgreSQL `@>` semantics).
    pub args_contains: Option<Value>,
    /// Leave out the runtime's own `dockhand.*` actions.
    pub exclude_internal: bool,
    /// The order.
    pub sort: ActionSort,
    /// Start after this position (next page)…
    pub after: Option<Cursor>,
    /// …or end before it (previous page); at most one of the two.
    pub before: Option<Cursor>,
    /// Rows per page, 1 to [`MAX_PAGE`].
    pub limit: i64,
    /// Only ids up to this one (a bulk operation's snapshot of "all matching").
    pub max_id: Option<i64>,
}

impl Default for ActionSearch {
    fn default() -> Self {
        Self {
            status: None,
            hook: None,
            group: None,
            priority: None,
            from: None,
            to: None,
            args_contains: None,
            exclude_internal: false,
            sort: ActionSort::IdDesc,
            after: None,
            before: None,
            limit: 50,
            max_id: None,
        }
    }
}

impl ActionSearch {
    /// Checks the search before any query; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_PAGE).contains(&self.limit) {
            return Err(Error::invalid(
                "limit",
                format!("{} is outside 1..={MAX_PAGE}", self.limit),
            ));
        }
        if self.after.is_some() && self.before.is_some() {
            return Err(Error::invalid(
                "cursor",
                "give `after` or `before`, not both",
            ));
        }
        for c in self.after.iter().chain(&self.before) {
            if c.sort != self.sort {
                return Err(Error::invalid(
                    "cursor",
                    format!(
                        "`{c}` belongs to sort `{}`, the search sorts by `{}`",
                        c.sort.as_str(),
                        self.sort.as_str()
                    ),
                ));
            }
        }
        match (self.sort, self.status) {
            (ActionSort::Lease, s) if s != Some(ActionStatus::Running) => {
                return Err(Error::invalid(
                    "sort",
                    "sort `l` (lease) lists running actions: add status=running",
                ))
            }
            (ActionSort::FinishedDesc, s) if !s.is_some_and(ActionStatus::is_final) => {
                return Err(Error::invalid(
                    "sort",
                    "sort `f` (finished) lists finished actions: add status complete, failed or canceled",
                ))
            }
            _ => {}
        }
        if let Some((lo, hi)) = self.priority {
            if lo > hi {
                return Err(Error::invalid(
                    "priority",
                    format!("range {lo}..={hi} is empty"),
                ));
            }
        }
        if let (Some(from), Some(to)) = (self.from, self.to) {
            if from >= to {
                return Err(Error::invalid(
                    "time range",
                    format!("from {from} is not before to {to}"),
                ));
            }
        }
        if let Some(v) = &self.args_contains {
            if !(v.is_object() || v.is_array()) {
                return Err(Error::invalid(
                    "args_contains",
                    format!("`{v}` must be a JSON object or array"),
                ));
            }
        }
        Ok(())
    }
}

/// One row of an action list: the columns a list shows, with args and the last error cut to
/// [`HEAD_CHARS`] characters by the database (a list never loads a 16 MB args document).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActionSummary {
    /// Primary key.
    pub id: i64,
    /// Hook name.
    pub hook: String,
    /// Group label.
    pub group: Option<String>,
    /// Current status.
    pub status: ActionStatus,
    /// Priority, lower first.
    pub priority: i32,
    /// When it is (or was) due.
    pub scheduled_at: DateTime<Utc>,
    /// Attempts started so far.
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Uniqueness key (a job step's key names its job).
    pub unique_key: Option<String>,
    /// Lease owner while running.
    pub lease_owner: Option<String>,
    /// Lease expiry while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// When it reached a final status.
    pub finished_at: Option<DateTime<Utc>>,
    /// The first [`HEAD_CHARS`] characters of the JSON args.
    pub args_head: String,
    /// The first [`HEAD_CHARS`] characters of the last error.
    pub error_head: Option<String>,
}

/// How many characters of args and errors a list row carries.
pub const HEAD_CHARS: i64 = 200;

impl ActionSummary {
    /// This row's position in `sort` (times as Unix milliseconds; a missing lease or finish
    /// time, which validation rules out for those sorts, counts as 0).
    pub fn cursor(&self, sort: ActionSort) -> Cursor {
        let t = |d: Option<DateTime<Utc>>| d.map_or(0, |d| d.timestamp_millis());
        let keys = match sort {
            ActionSort::NextToRun => vec![
                i64::from(self.priority),
                self.scheduled_at.timestamp_millis(),
                self.id,
            ],
            ActionSort::Scheduled => vec![self.scheduled_at.timestamp_millis(), self.id],
            ActionSort::Lease => vec![t(self.lease_until), self.id],
            ActionSort::FinishedDesc => vec![t(self.finished_at), self.id],
            ActionSort::IdDesc => vec![self.id],
        };
        Cursor { sort, keys }
    }
}

/// One page of a keyset search, with the cursors of its neighbours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActionPage {
    /// The rows, in the search's order.
    pub rows: Vec<ActionSummary>,
    /// `after` for the next page, if there is one.
    #[serde(serialize_with = "cursor_text")]
    pub next: Option<Cursor>,
    /// `before` for the previous page, if there may be one.
    #[serde(serialize_with = "cursor_text")]
    pub prev: Option<Cursor>,
}

fn cursor_text<S: serde::Serializer>(
    c: &Option<Cursor>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match c {
        Some(c) => s.serialize_some(&c.to_string()),
        None => s.serialize_none(),
    }
}

impl ActionPage {
    /// Builds a page from the rows a store fetched in walk order: the search's order, or its
    /// reverse when paging `before` a cursor, at most `limit + 1` rows (the extra one only says
    /// that more rows follow).
    pub fn assemble(search: &ActionSearch, mut rows: Vec<ActionSummary>) -> Self {
        let limit = usize::try_from(search.limit).unwrap_or(0);
        let more = rows.len() > limit;
        rows.truncate(limit);
        let sort = search.sort;
        let first = |rows: &[ActionSummary]| rows.first().map(|r| r.cursor(sort));
        let last = |rows: &[ActionSummary]| rows.last().map(|r| r.cursor(sort));
        if search.before.is_some() {
            rows.reverse();
            let prev = if more { first(&rows) } else { None };
            let next = last(&rows);
            Self { rows, next, prev }
        } else {
            let next = if more { last(&rows) } else { None };
            let prev = search.after.as_ref().and_then(|_| first(&rows));
            Self { rows, next, prev }
        }
    }
}

/// Whether `doc` contains `cand` with PostgreSQL's `jsonb @>` semantics: objects contain
/// objects whose every key they hold with a containing value; arrays contain arrays whose every
/// element some element of theirs contains (order and repeats ignored); scalars contain equal
/// scalars (numbers by value); and, at the top level only, an array contains a scalar it holds.
/// The reference the backends' `args_contains` filters are tested against.
pub fn json_contains(doc: &Value, cand: &Value) -> bool {
    if let (Value::Array(items), false) = (doc, cand.is_array() || cand.is_object()) {
        return items.iter().any(|d| scalar_eq(d, cand));
    }
    contains(doc, cand)
}

fn contains(doc: &Value, cand: &Value) -> bool {
    match (doc, cand) {
        (Value::Object(d), Value::Object(c)) => c
            .iter()
            .all(|(k, cv)| d.get(k).is_some_and(|dv| contains(dv, cv))),
        (Value::Array(d), Value::Array(c)) => {
            c.iter().all(|cv| d.iter().any(|dv| contains(dv, cv)))
        }
        (Value::Object(_) | Value::Array(_), _) | (_, Value::Object(_) | Value::Array(_)) => false,
        _ => scalar_eq(doc, cand),
    }
}

fn scalar_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Object(_) | Value::Array(_), _) | (_, Value::Object(_) | Value::Array(_)) => false,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_named() {
        let c = Cursor::new(ActionSort::NextToRun, vec![10, 1_733_155_200_000, 4711]).unwrap();
        assert_eq!(c.to_string(), "n.10.1733155200000.4711");
        assert_eq!(Cursor::parse(&c.to_string()).unwrap(), c);
        assert_eq!(c.id(), 4711);
        for (bad, why) in [
            ("x.1", "unknown sort"),
            ("n.1.2", "needs 3 key(s)"),
            ("i.abc", "not an integer"),
            ("", "unknown sort"),
            ("i.99999999999999999999", "not an integer"),
        ] {
            let e = Cursor::parse(bad).unwrap_err().to_string();
            assert!(e.contains("cursor") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn searches_are_checked_before_any_query() {
        assert!(ActionSearch::default().validate().is_ok());
        let with = |f: fn(&mut ActionSearch)| {
            let mut s = ActionSearch::default();
            f(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(with(|s| s.limit = 0).contains("limit"));
        assert!(with(|s| s.limit = MAX_PAGE + 1).contains("limit"));
        assert!(with(|s| s.priority = Some((5, 1))).contains("priority"));
        assert!(with(|s| s.args_contains = Some(json!(3))).contains("args_contains"));
        assert!(with(|s| {
            s.after = Some(Cursor::new(ActionSort::Scheduled, vec![1, 2]).unwrap())
        })
        .contains("belongs to sort `s`"));
        assert!(with(|s| {
            s.after = Some(Cursor::new(ActionSort::IdDesc, vec![1]).unwrap());
            s.before = Some(Cursor::new(ActionSort::IdDesc, vec![9]).unwrap());
        })
        .contains("not both"));
        assert!(with(|s| {
            let t = chrono::DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap();
            s.from = Some(t);
            s.to = Some(t);
        })
        .contains("time range"));
    }

    #[test]
    fn containment_follows_postgres() {
        let doc = json!({"a": 1, "b": [1, 2, {"c": "x"}], "d": {"e": null, "f": 2.0}});
        for (cand, want) in [
            (json!({}), true),
            (json!({"a": 1}), true),
            (json!({"a": 1.0}), true),
            (json!({"a": "1"}), false),
            (json!({"b": [2]}), true),
            (json!({"b": [2, 2, 1]}), true),
            (json!({"b": [{"c": "x"}]}), true),
            (json!({"b": [{}]}), true),
            (json!({"b": 1}), false),
            (json!({"d": {"e": null}}), true),
            (json!({"d": {"f": 2}}), true),
            (json!({"z": null}), false),
            (json!([]), false),
        ] {
            assert_eq!(json_contains(&doc, &cand), want, "{doc} @> {cand}");
        }
        // Top-level arrays contain their scalars; nested ones do not.
        assert!(json_contains(&json!(["foo", "bar"]), &json!("foo")));
        assert!(!json_contains(&json!({"a": ["foo"]}), &json!({"a": "foo"})));
        assert!(json_contains(&json!([1, [2, 3]]), &json!([[3]])));
        assert!(!json_contains(&json!([1, [2, 3]]), &json!([3])));
    }
}
