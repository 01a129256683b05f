//! The action list's filter state as it lives in the URL ([`ListParams`]): parsed into an
//! [`ActionSearch`] with errors that name the field, and written back into query strings for
//! tabs, pager links and the bulk forms, so every view of a list is a link.

use crate::error::{Error, Result};
use crate::search::{ActionSearch, ActionSort, Cursor, MAX_PAGE};
use crate::state::ActionStatus;
use crate::ui::pages::layout::query_value;
use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::Deserialize;

/// The query string of `/actions` (and the hidden fields of its bulk forms). Every field is
/// text as the browser sends it; empty means unset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct ListParams {
    /// `pending`, `running`, `complete`, `failed`, `canceled`; empty: all.
    #[serde(default)]
    pub(crate) status: String,
    /// A sort name (`n`, `s`, `l`, `f`, `i`); empty: the status's default.
    #[serde(default)]
    pub(crate) sort: String,
    /// Exact hook.
    #[serde(default)]
    pub(crate) hook: String,
    /// Exact group; `-` means "no group".
    #[serde(default)]
    pub(crate) group: String,
    /// Lowest priority.
    #[serde(default)]
    pub(crate) pmin: String,
    /// Highest priority.
    #[serde(default)]
    pub(crate) pmax: String,
    /// Start of the time range on the sort's time column (RFC 3339, or `YYYY-MM-DDTHH:MM` in
    /// the viewer's timezone).
    #[serde(default)]
    pub(crate) from: String,
    /// End of that range (exclusive).
    #[serde(default)]
    pub(crate) to: String,
    /// A JSON object or array the args must contain.
    #[serde(default)]
    pub(crate) args: String,
    /// `1`: include the runtime's own `dockhand.*` actions.
    #[serde(default)]
    pub(crate) internal: String,
    /// Next-page cursor.
    #[serde(default)]
    pub(crate) after: String,
    /// Previous-page cursor.
    #[serde(default)]
    pub(crate) before: String,
}

/// The sort a status tab uses when the URL names none.
pub(crate) fn default_sort(status: Option<ActionStatus>) -> ActionSort {
    match status {
        Some(ActionStatus::Pending) => ActionSort::NextToRun,
        Some(ActionStatus::Running) => ActionSort::Lease,
        Some(s) if s.is_final() => ActionSort::FinishedDesc,
        _ => ActionSort::IdDesc,
    }
}

/// The sorts a status tab offers, with their labels.
pub(crate) fn sorts_for(status: Option<ActionStatus>) -> &'static [(ActionSort, &'static str)] {
    match status {
        Some(ActionStatus::Pending) => &[
            (ActionSort::NextToRun, "next to run"),
            (ActionSort::Scheduled, "scheduled time"),
            (ActionSort::IdDesc, "newest"),
        ],
        Some(ActionStatus::Running) => &[
            (ActionSort::Lease, "lease ends"),
            (ActionSort::IdDesc, "newest"),
        ],
        Some(s) if s.is_final() => &[
            (ActionSort::FinishedDesc, "latest finished"),
            (ActionSort::IdDesc, "newest"),
        ],
        // The "all" tab has an index for id order only (migration 0005).
        _ => &[(ActionSort::IdDesc, "newest")],
    }
}

fn text(s: &str) -> Option<&str> {
    let t = s.trim();
    (!t.is_empty()).then_some(t)
}

fn time(field: &'static str, s: &str, tz: Option<Tz>) -> Result<Option<DateTime<Utc>>> {
    let Some(t) = text(s) else { return Ok(None) };
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(Some(d.with_timezone(&Utc)));
    }
    let naive = NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M")
        .or_else(|_| NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S"))
        .map_err(|_| {
            Error::invalid(
                field,
                format!("`{t}` is not a time (RFC 3339, or YYYY-MM-DDTHH:MM)"),
            )
        })?;
    let local = match tz {
        Some(tz) => tz
            .from_local_datetime(&naive)
            .earliest()
            .map(|d| d.with_timezone(&Utc)),
        None => Some(Utc.from_utc_datetime(&naive)),
    };
    local
        .map(Some)
        .ok_or_else(|| Error::invalid(field, format!("`{t}` does not exist in {tz:?}")))
}

fn int(field: &'static str, s: &str) -> Result<Option<i32>> {
    text(s)
        .map(|t| {
            t.parse::<i32>()
                .map_err(|_| Error::invalid(field, format!("`{t}` is not an integer")))
        })
        .transpose()
}

impl ListParams {
    /// The status the URL names, if any.
    pub(crate) fn status(&self) -> Result<Option<ActionStatus>> {
        text(&self.status).map(str::parse).transpose()
    }

    /// The search these parameters describe; each error names the field.
    pub(crate) fn search(&self, limit: i64, tz: Option<Tz>) -> Result<ActionSearch> {
        let status = self.status()?;
        let sort = match text(&self.sort) {
            None => default_sort(status),
            Some(name) => {
                let sort = ActionSort::parse(name)
                    .ok_or_else(|| Error::invalid("sort", format!("unknown sort `{name}`")))?;
                let offered = sorts_for(status);
                if !offered.iter().any(|(s, _)| *s == sort) {
                    let names: Vec<String> = offered
                        .iter()
                        .map(|(s, label)| format!("`{}` ({label})", s.as_str()))
                        .collect();
                    return Err(Error::invalid(
                        "sort",
                        format!(
                            "sort `{name}` has no index on this tab; it offers {}",
                            names.join(", ")
                        ),
                    ));
                }
                sort
            }
        };
        let priority = match (int("pmin", &self.pmin)?, int("pmax", &self.pmax)?) {
            (None, None) => None,
            (lo, hi) => Some((lo.unwrap_or(i32::MIN), hi.unwrap_or(i32::MAX))),
        };
        let args_contains = text(&self.args)
            .map(|a| {
                serde_json::from_str(a)
                    .map_err(|e| Error::invalid("args_contains", format!("not JSON: {e}")))
            })
            .transpose()?;
        let search = ActionSearch {
            status,
            hook: text(&self.hook).map(str::to_owned),
            group: text(&self.group).map(|g| (g != "-").then(|| g.to_owned())),
            priority,
            from: time("from", &self.from, tz)?,
            to: time("to", &self.to, tz)?,
            args_contains,
            exclude_internal: text(&self.internal).is_none(),
            sort,
            after: text(&self.after).map(Cursor::parse).transpose()?,
            before: text(&self.before).map(Cursor::parse).transpose()?,
            limit: limit.clamp(1, MAX_PAGE),
            max_id: None,
        };
        search.validate()?;
        Ok(search)
    }

    /// The filter fields (not the cursor) as `(name, value)` pairs, unset ones left out.
    pub(crate) fn filter_pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("status", &self.status),
            ("sort", &self.sort),
            ("hook", &self.hook),
            ("group", &self.group),
            ("pmin", &self.pmin),
            ("pmax", &self.pmax),
            ("from", &self.from),
            ("to", &self.to),
            ("args", &self.args),
            ("internal", &self.internal),
        ]
        .into_iter()
        .filter_map(|(k, v)| text(v).map(|v| (k, v)))
        .collect()
    }

    /// `/actions?…` with these filters, and `extra` pairs (a cursor) appended.
    pub(crate) fn href(&self, extra: &[(&str, &str)]) -> String {
        let pairs: Vec<String> = self
            .filter_pairs()
            .into_iter()
            .chain(extra.iter().copied())
            .map(|(k, v)| format!("{k}={}", query_value(v)))
            .collect();
        if pairs.is_empty() {
            "/actions".into()
        } else {
            format!("/actions?{}", pairs.join("&"))
        }
    }

    /// The same filters on another status tab (its default sort).
    pub(crate) fn with_status(&self, status: Option<ActionStatus>) -> Self {
        Self {
            status: status.map(|s| s.as_str().to_owned()).unwrap_or_default(),
            sort: String::new(),
            after: String::new(),
            before: String::new(),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(q: &str) -> ListParams {
        let uri: axum::http::Uri = format!("/actions?{q}").parse().unwrap();
        axum::extract::Query::<ListParams>::try_from_uri(&uri)
            .unwrap()
            .0
    }

    #[test]
    fn urls_become_searches_and_back() {
        let params = p("status=pending&hook=mail&group=-&pmin=5&args=%7B%22a%22%3A1%7D&from=2026-03-01T10%3A00");
        let s = params.search(50, None).unwrap();
        assert_eq!(s.status, Some(ActionStatus::Pending));
        assert_eq!(s.sort, ActionSort::NextToRun);
        assert_eq!(s.hook.as_deref(), Some("mail"));
        assert_eq!(s.group, Some(None));
        assert_eq!(s.priority, Some((5, i32::MAX)));
        assert_eq!(s.args_contains, Some(serde_json::json!({"a": 1})));
        assert_eq!(
            s.from.map(|t| t.to_rfc3339()),
            Some("2026-03-01T10:00:00+00:00".into())
        );
        assert!(s.exclude_internal);
        // The filters survive the round trip through a link.
        let href = params.href(&[("after", "n.1.2.3")]);
        let back = p(href.trim_start_matches("/actions?"));
        assert_eq!(back.after, "n.1.2.3");
        assert_eq!(
            ListParams {
                after: String::new(),
                ..back
            },
            params
        );
        // A local time is read in the viewer's timezone.
        let paris: Tz = "Europe/Paris".parse().unwrap();
        let s = p("from=2026-03-01T10%3A00")
            .search(50, Some(paris))
            .unwrap();
        assert_eq!(
            s.from.map(|t| t.to_rfc3339()),
            Some("2026-03-01T09:00:00+00:00".into())
        );
    }

    #[test]
    fn bad_fields_are_named() {
        for (q, field) in [
            ("status=done", "status"),
            ("sort=zz", "sort"),
            ("pmin=x", "pmin"),
            ("from=yesterday", "from"),
            ("args=%7Bnope", "args_contains"),
            ("args=3", "args_contains"),
            ("after=q.1", "cursor"),
            ("status=pending&sort=l", "sort"),
            ("sort=s", "sort"),
            ("status=running&sort=n", "sort"),
        ] {
            let e = p(q).search(50, None).unwrap_err().to_string();
            assert!(e.contains(field), "{q}: {e}");
        }
    }
}
