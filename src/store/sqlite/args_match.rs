//! SQLite: the `args contains` filter of a search. SQLite has no JSON containment operator, so
//! the candidate document is compiled into a condition over `json_type`, `json_extract` and
//! `json_each` with PostgreSQL's `@>` semantics (the reference is
//! [`crate::search::json_contains`]; the conformance suite checks that every backend returns
//! the same rows for random documents and candidates).
//!
//! - an object matches an object holding each of its keys with a matching value;
//! - an array matches an array in which each of its elements matches some element;
//! - a scalar matches an equal scalar of the same JSON type (numbers by value).
//!
//! Paths and values are bound parameters; keys holding `"`, `\` or control characters, which a
//! JSON path cannot quote, are refused, and so are candidates nested deeper than [`MAX_DEPTH`]
//! or with more than [`MAX_NODES`] values (the condition grows with the candidate).

use crate::error::{Error, Result};
use serde_json::Value;
use sqlx::{QueryBuilder, Sqlite};

/// How deep a candidate may nest.
pub(super) const MAX_DEPTH: usize = 8;
/// How many values (keys' values and elements, at every level) a candidate may hold.
pub(super) const MAX_NODES: usize = 64;

/// Appends ` AND (<condition>)` matching rows whose `args` contain `cand`.
pub(super) fn push_args_contains(qb: &mut QueryBuilder<'_, Sqlite>, cand: &Value) -> Result<()> {
    if !(cand.is_object() || cand.is_array()) {
        return Err(bad(format!("`{cand}` must be a JSON object or array")));
    }
    let mut nodes = 0;
    check(cand, 0, &mut nodes)?;
    qb.push(" AND (");
    let mut aliases = 0;
    push_match(qb, "args", "$", cand, &mut aliases);
    qb.push(")");
    Ok(())
}

fn bad(why: String) -> Error {
    Error::invalid("args_contains", why)
}

/// Refuses what the compiled condition cannot express or would make too large.
fn check(v: &Value, depth: usize, nodes: &mut usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(bad(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Object(m) => {
            if let Some(k) = m.keys().find(|k| !key_is_quotable(k)) {
                return Err(bad(format!(
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
        if *nodes > MAX_NODES {
            return Err(bad(format!("more than {MAX_NODES} values")));
        }
        check(c, depth + 1, nodes)?;
    }
    Ok(())
}

fn key_is_quotable(k: &str) -> bool {
    !k.chars().any(|c| c == '"' || c == '\\' || c.is_control())
}

/// The JSON type names SQLite's `json_type` gives a scalar (numbers: either numeric type).
fn scalar_types(v: &Value) -> &'static str {
    match v {
        Value::Null => "('null')",
        Value::Bool(true) => "('true')",
        Value::Bool(false) => "('false')",
        Value::Number(_) => "('integer','real')",
        Value::String(_) => "('text')",
        Value::Array(_) => "('array')",
        Value::Object(_) => "('object')",
    }
}

/// Binds a scalar for comparison with `json_extract` / `json_each.value`.
fn push_scalar(qb: &mut QueryBuilder<'_, Sqlite>, v: &Value) {
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) => qb.push_bind(i),
            None => qb.push_bind(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => qb.push_bind(s.clone()),
        // Types alone decide null and booleans.
        _ => qb.push("1"),
    };
}

/// Appends a condition true when the JSON at (`base`, `path`) contains `cand`.
fn push_match(
    qb: &mut QueryBuilder<'_, Sqlite>,
    base: &str,
    path: &str,
    cand: &Value,
    aliases: &mut usize,
) {
    qb.push(format!("json_type({base}, "))
        .push_bind(path.to_owned())
        .push(format!(") IN {}", scalar_types(cand)));
    match cand {
        Value::Object(m) => {
            for (k, v) in m {
                qb.push(" AND ");
                push_match(qb, base, &format!("{path}.\"{k}\""), v, aliases);
            }
        }
        Value::Array(items) => {
            for item in items {
                *aliases += 1;
                let e = format!("e{aliases}");
                qb.push(format!(" AND EXISTS (SELECT 1 FROM json_each({base}, "))
                    .push_bind(path.to_owned())
                    .push(format!(") {e} WHERE "));
                if item.is_object() || item.is_array() {
                    // `value` is JSON text only for containers; CASE keeps the other
                    // elements (bare strings) from reaching json_type.
                    qb.push(format!(
                        "CASE WHEN {e}.type IN {} THEN (",
                        scalar_types(item)
                    ));
                    push_match(qb, &format!("{e}.value"), "$", item, aliases);
                    qb.push(") ELSE 0 END");
                } else {
                    qb.push(format!("{e}.type IN {}", scalar_types(item)));
                    if item.is_number() || item.is_string() {
                        qb.push(format!(" AND {e}.value = "));
                        push_scalar(qb, item);
                    }
                }
                qb.push(")");
            }
        }
        Value::Number(_) | Value::String(_) => {
            qb.push(format!(" AND json_extract({base}, "))
                .push_bind(path.to_owned())
                .push(") = ");
            push_scalar(qb, cand);
        }
        Value::Null | Value::Bool(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sql(cand: &Value) -> Result<String> {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new("SELECT 1 WHERE 1 = 1");
        push_args_contains(&mut qb, cand)?;
        Ok(qb.sql().to_owned())
    }

    #[test]
    fn scalars_and_unquotable_keys_are_refused_by_name() {
        for (cand, why) in [
            (json!(3), "must be a JSON object or array"),
            (json!("x"), "must be a JSON object or array"),
            (json!({"a\"b": 1}), "quote"),
            (json!({"a": {"b\\": 1}}), "backslash"),
            (json!({"a\n": 1}), "control"),
        ] {
            let e = sql(&cand).unwrap_err().to_string();
            assert!(
                e.contains("args_contains") && e.contains(why),
                "{cand}: {e}"
            );
        }
        let mut deep = json!(1);
        for _ in 0..=MAX_DEPTH + 1 {
            deep = json!({ "a": deep });
        }
        assert!(sql(&deep).unwrap_err().to_string().contains("deeper"));
        let wide: Value = (0..=MAX_NODES).map(|i| json!(i)).collect();
        assert!(sql(&wide).unwrap_err().to_string().contains("more than"));
    }

    #[test]
    fn paths_and_values_are_parameters() {
        let s = sql(&json!({"a": "'; DROP TABLE x; --", "b": [{"c": 1}]})).unwrap();
        assert!(!s.contains("DROP"), "{s}");
        assert!(
            s.contains("json_each(e1.value") || s.contains("json_type(e1.value"),
            "{s}"
        );
    }
}
