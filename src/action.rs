//! Actions: what a caller enqueues ([`ActionSpec`]), what the store receives once it has been
//! validated ([`PreparedAction`]), and what the store gives back ([`Action`], [`ActionLog`]).
//!
//! Validation lives here and runs before any statement: a bad hook, args or priority is refused
//! with an error naming the field, and nothing is written.

use crate::error::{Error, Result};
use crate::state::ActionStatus;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Default priority: lower runs first.
pub const DEFAULT_PRIORITY: i32 = 10;
/// Default number of attempts before an action that keeps failing is marked failed.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Longest accepted hook or group name, in bytes.
pub const MAX_NAME_LEN: usize = 191;
/// Largest accepted serialized args document, in bytes.
pub const MAX_ARGS_BYTES: usize = 16 * 1024 * 1024;
/// Deepest accepted nesting of arrays and objects in args: deeper documents could be stored but
/// not read back (`serde_json` stops at 128 levels; the row would read as corrupt).
pub const MAX_ARGS_DEPTH: usize = 64;

/// How duplicates of an action are recognised while one is pending or running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Uniqueness {
    /// No uniqueness: every enqueue creates a row.
    None,
    /// Unique by hook + args + group (Action Scheduler's `$unique`).
    ByContent,
    /// Unique by a caller-chosen key.
    Key(String),
}

/// An action to enqueue. Build one with [`ActionSpec::new`] and the `with_*`/`at`/`unique`
/// methods, then hand it to [`crate::Queue::enqueue`].
#[derive(Debug, Clone)]
pub struct ActionSpec {
    pub(crate) hook: String,
    pub(crate) args: Value,
    pub(crate) group: Option<String>,
    pub(crate) priority: i32,
    pub(crate) scheduled_at: Option<DateTime<Utc>>,
    pub(crate) delay: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) timeout: Option<std::time::Duration>,
    pub(crate) uniqueness: Uniqueness,
}

impl ActionSpec {
    /// An async action (due now) for `hook` with JSON `args`.
    pub fn new(hook: impl Into<String>, args: Value) -> Self {
        Self {
            hook: hook.into(),
            args,
            group: None,
            priority: DEFAULT_PRIORITY,
            scheduled_at: None,
            delay: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout: None,
            uniqueness: Uniqueness::None,
        }
    }

    /// Runs the action at `at` (a "single" action in Action Scheduler terms).
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.scheduled_at = Some(at);
        self.delay = None;
        self
    }

    /// Runs the action `delay` after it is enqueued.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.scheduled_at = None;
        self
    }

    /// Puts the action in a group (a free-form label used by filters and unschedule).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Sets the priority; lower runs first. Default 10.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the number of attempts (at least 1). Default 5.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Limits one run of the handler; a run that takes longer is cancelled and retried.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Makes the action unique by hook + args + group among pending and running actions.
    pub fn unique(mut self) -> Self {
        self.uniqueness = Uniqueness::ByContent;
        self
    }

    /// Makes the action unique by `key` among pending and running actions.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.uniqueness = Uniqueness::Key(key.into());
        self
    }

    /// Validates the spec and resolves its times against `now`.
    pub fn prepare(&self, now: DateTime<Utc>) -> Result<PreparedAction> {
        validate_name("hook", &self.hook, false)?;
        if let Some(group) = &self.group {
            validate_name("group", group, true)?;
        }
        let args_json = encode_args(&self.args)?;
        if self.max_attempts == 0 {
            return Err(Error::invalid("max_attempts", "must be at least 1"));
        }
        let max_attempts = i32::try_from(self.max_attempts)
            .map_err(|_| Error::invalid("max_attempts", "too large"))?;
        let timeout_ms = match self.timeout {
            None => None,
            Some(t) if t.is_zero() => return Err(Error::invalid("timeout", "must be positive")),
            Some(t) => Some(
                i64::try_from(t.as_millis()).map_err(|_| Error::invalid("timeout", "too large"))?,
            ),
        };
        let scheduled_at = match (self.scheduled_at, self.delay) {
            (Some(at), _) => at,
            (None, Some(d)) if d < Duration::zero() => {
                return Err(Error::invalid("delay", "must not be negative"))
            }
            (None, Some(d)) => now
                .checked_add_signed(d)
                .ok_or_else(|| Error::invalid("delay", "out of range"))?,
            (None, None) => now,
        };
        let unique_key = match &self.uniqueness {
            Uniqueness::None => None,
            Uniqueness::ByContent => {
                Some(content_key(&self.hook, &args_json, self.group.as_deref()))
            }
            Uniqueness::Key(k) => {
                validate_name("unique_key", k, false)?;
                Some(format!("k:{k}"))
            }
        };
        Ok(PreparedAction {
            hook: self.hook.clone(),
            args_json,
            group: self.group.clone(),
            priority: self.priority,
            scheduled_at: crate::clock::to_millis(scheduled_at),
            max_attempts,
            timeout_ms,
            unique_key,
            schedule_id: None,
        })
    }
}

/// A validated action, ready to insert. Produced by [`ActionSpec::prepare`].
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedAction {
    /// The hook name.
    pub hook: String,
    /// Canonical JSON text of the args.
    pub args_json: String,
    /// Optional group label.
    pub group: Option<String>,
    /// Priority, lower first.
    pub priority: i32,
    /// When it becomes due.
    pub scheduled_at: DateTime<Utc>,
    /// Attempts before failing for good.
    pub max_attempts: i32,
    /// Per-run timeout in milliseconds.
    pub timeout_ms: Option<i64>,
    /// Uniqueness key among pending/running actions.
    pub unique_key: Option<String>,
    /// The schedule that materialised this action, if any.
    pub schedule_id: Option<i64>,
}

/// Checks a hook/group/key name: non-empty, bounded, no control characters.
pub(crate) fn validate_name(field: &'static str, value: &str, allow_empty: bool) -> Result<()> {
    if value.is_empty() && !allow_empty {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes long; at most {MAX_NAME_LEN} allowed",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// Serializes args canonically (object keys sorted) and rejects what a backend cannot store
/// faithfully: NUL characters in strings (PostgreSQL `jsonb` refuses them), nesting deeper than
/// [`MAX_ARGS_DEPTH`] (it could not be read back) and oversized documents.
pub fn encode_args(args: &Value) -> Result<String> {
    match scan(args, 0) {
        Scan::Ok => {}
        Scan::Nul => {
            return Err(Error::invalid(
                "args",
                "strings must not contain the NUL character (\\u0000)",
            ))
        }
        Scan::TooDeep => {
            return Err(Error::invalid(
                "args",
                format!("nests arrays/objects more than {MAX_ARGS_DEPTH} levels deep"),
            ))
        }
    }
    let text = serde_json::to_string(args).map_err(|e| Error::invalid("args", e.to_string()))?;
    if text.len() > MAX_ARGS_BYTES {
        return Err(Error::invalid(
            "args",
            format!("is {} bytes; at most {MAX_ARGS_BYTES} allowed", text.len()),
        ));
    }
    Ok(text)
}

/// Parses args given as text (CLI, files): must be a JSON document.
pub fn parse_args(text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error::invalid("args", format!("not valid JSON: {e}")))
}

enum Scan {
    Ok,
    Nul,
    TooDeep,
}

/// Looks for NUL and excess depth; never descends past [`MAX_ARGS_DEPTH`] + 1 levels.
fn scan(v: &Value, depth: usize) -> Scan {
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::String(s) if s.contains('\0') => return Scan::Nul,
        Value::Array(a) => Box::new(a.iter()),
        Value::Object(o) => {
            if o.keys().any(|k| k.contains('\0')) {
                return Scan::Nul;
            }
            Box::new(o.values())
        }
        _ => return Scan::Ok,
    };
    if depth >= MAX_ARGS_DEPTH {
        return Scan::TooDeep;
    }
    for c in children {
        match scan(c, depth + 1) {
            Scan::Ok => {}
            other => return other,
        }
    }
    Scan::Ok
}

/// The uniqueness key for "same hook, args and group".
pub(crate) fn content_key(hook: &str, args_json: &str, group: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(hook.as_bytes());
    h.update([0]);
    h.update(args_json.as_bytes());
    h.update([0]);
    h.update(group.unwrap_or("").as_bytes());
    let digest = h.finalize();
    let mut out = String::with_capacity(2 + 64);
    out.push_str("c:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A stored action as read back from the database.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Action {
    /// Primary key.
    pub id: i64,
    /// Hook name.
    pub hook: String,
    /// JSON args.
    pub args: Value,
    /// Group label.
    pub group: Option<String>,
    /// Priority, lower first.
    pub priority: i32,
    /// Current status.
    pub status: ActionStatus,
    /// When it is (or was) due.
    pub scheduled_at: DateTime<Utc>,
    /// Attempts started so far.
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Per-run timeout in milliseconds.
    pub timeout_ms: Option<i64>,
    /// Uniqueness key, if any.
    pub unique_key: Option<String>,
    /// Lease owner while running.
    pub lease_owner: Option<String>,
    /// Fencing token of the latest claim (0 before the first).
    pub lease_token: i64,
    /// Lease expiry while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// When it reached a final status.
    pub finished_at: Option<DateTime<Utc>>,
    /// The last error a run reported.
    pub last_error: Option<String>,
    /// The schedule that produced it.
    pub schedule_id: Option<i64>,
}

/// One entry of an action's log (Q11).
///
/// The `created` entry is not a stored log row: it is read from the action's `created_at`
/// (from migration 0017 on, an enqueue writes the action row alone). Rows enqueued before
/// that keep their stored `created` row, and no second one is added for them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActionLog {
    /// The action it belongs to.
    pub action_id: i64,
    /// When it happened.
    pub at: DateTime<Utc>,
    /// What happened: `created`, `started`, `completed`, `retry`, `failed`, `snoozed`,
    /// `released`, `canceled`, `lease_lost`, `lease_expired`, `requeued`.
    pub event: String,
    /// Details: owner, error text, next run time.
    pub detail: Option<String>,
}

/// Selects actions by hook/args/group (Action Scheduler's search arguments).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionFilter {
    /// Only this hook.
    pub hook: Option<String>,
    /// Only these exact args.
    pub args: Option<Value>,
    /// Only this group.
    pub group: Option<String>,
}

/// Sort order for [`ActionQuery`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ActionOrder {
    /// By scheduled time, then id, oldest first.
    #[default]
    ScheduledAsc,
    /// By scheduled time, then id, newest first.
    ScheduledDesc,
    /// By id ascending.
    IdAsc,
    /// By id descending.
    IdDesc,
}

/// A query over stored actions (Action Scheduler's `as_get_scheduled_actions`).
#[derive(Debug, Clone, PartialEq)]
pub struct ActionQuery {
    /// Hook, args and group filters.
    pub filter: ActionFilter,
    /// Only these statuses (empty = all).
    pub statuses: Vec<ActionStatus>,
    /// scheduled_at >= this.
    pub scheduled_from: Option<DateTime<Utc>>,
    /// scheduled_at < this.
    pub scheduled_to: Option<DateTime<Utc>>,
    /// created_at >= this.
    pub created_from: Option<DateTime<Utc>>,
    /// created_at < this.
    pub created_to: Option<DateTime<Utc>>,
    /// Some(true): only actions holding a lease; Some(false): only those without.
    pub claimed: Option<bool>,
    /// Page size.
    pub limit: i64,
    /// Rows to skip.
    pub offset: i64,
    /// Sort order.
    pub order: ActionOrder,
}

impl Default for ActionQuery {
    fn default() -> Self {
        Self {
            filter: ActionFilter::default(),
            statuses: Vec::new(),
            scheduled_from: None,
            scheduled_to: None,
            created_from: None,
            created_to: None,
            claimed: None,
            limit: 100,
            offset: 0,
            order: ActionOrder::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_empty_hook_naming_the_field() {
        let err = ActionSpec::new("", json!({}))
            .prepare(Utc::now())
            .unwrap_err();
        assert!(err.to_string().contains("invalid hook"), "{err}");
    }

    #[test]
    fn rejects_nul_in_args() {
        let err = ActionSpec::new("h", json!({"a": "x\u{0}y"}))
            .prepare(Utc::now())
            .unwrap_err();
        assert!(err.to_string().contains("invalid args"), "{err}");
    }

    #[test]
    fn rejects_zero_attempts_and_negative_delay() {
        let now = Utc::now();
        let e = ActionSpec::new("h", json!(1)).max_attempts(0).prepare(now);
        assert!(e.unwrap_err().to_string().contains("max_attempts"));
        let e = ActionSpec::new("h", json!(1))
            .after(Duration::seconds(-1))
            .prepare(now);
        assert!(e.unwrap_err().to_string().contains("delay"));
    }

    #[test]
    fn content_key_depends_on_hook_args_and_group() {
        let a = content_key("h", "{}", None);
        assert_eq!(a, content_key("h", "{}", None));
        assert_ne!(a, content_key("h", "{}", Some("g")));
        assert_ne!(a, content_key("h", "[]", None));
        assert_ne!(a, content_key("i", "{}", None));
    }

    #[test]
    fn rejects_args_nested_too_deep() {
        let mut v = json!(1);
        for _ in 0..MAX_ARGS_DEPTH {
            v = json!([v]);
        }
        assert!(encode_args(&v).is_ok());
        let e = encode_args(&json!({ "k": v })).unwrap_err().to_string();
        assert!(e.starts_with("invalid args: nests"), "{e}");
    }

    #[test]
    fn args_are_canonical() {
        let a = encode_args(&json!({"b": 1, "a": 2})).unwrap();
        assert_eq!(a, r#"{"a":2,"b":1}"#);
    }

    #[test]
    fn parse_args_names_the_field() {
        let err = parse_args("{nope").unwrap_err();
        assert!(
            err.to_string().starts_with("invalid args: not valid JSON"),
            "{err}"
        );
    }
}
