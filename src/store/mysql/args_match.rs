//! MySQL / MariaDB: the `args contains` filter of a search, with PostgreSQL's `jsonb @>`
//! semantics (the reference is [`crate::search::json_contains`]; the conformance suite checks
//! that every backend returns the same rows for random documents and candidates).
//!
//! `JSON_CONTAINS` is not used: it differs from `@>` where a scalar or an object meets an
//! array (`JSON_CONTAINS('{"a":["x"]}', '{"a":"x"}')` and `JSON_CONTAINS('[[1]]', '[1]')` are
//! 1, `@>` says false), and MariaDB and MySQL differ in how they compare numbers and strings
//! inside it. Instead the candidate is compiled into a condition over `JSON_TYPE`,
//! `JSON_EXTRACT` and `JSON_TABLE` (MySQL 8.0.4+, MariaDB 10.6+; no MariaDB-only syntax):
//!
//! - an object matches an object holding each of its keys with a matching value;
//! - an array matches an array in which each of its elements matches some element (an
//!   `EXISTS` over `JSON_TABLE(…, '$[*]' COLUMNS (n FOR ORDINALITY))`, the element being read
//!   back by its position, so nested objects and arrays are matched the same way);
//! - a scalar matches a scalar of the same JSON type: numbers by value (`JSON_EXTRACT(…) = ?`,
//!   a JSON comparison on MySQL and a numeric one of the extracted text on MariaDB), strings
//!   byte for byte (`CAST(JSON_UNQUOTE(…) AS BINARY)`, so the PAD SPACE rule of
//!   `utf8mb4_bin` cannot make `"a "` equal `"a"`), booleans by their text, null by type alone.
//!
//! Paths and values are bound parameters; the candidate's limits (keys a path cannot quote,
//! depth, size) are [`crate::store::operator::check_compiled_candidate`]'s.

use crate::error::Result;
use crate::store::operator::check_compiled_candidate;
use serde_json::Value;
use sqlx::{MySql, QueryBuilder};

/// The args column, qualified so it names the searched row inside the `JSON_TABLE` subqueries.
const ARGS: &str = "dockhand_actions.args";

/// One piece of a JSON path: literal text (bound), or the position of the current element of
/// the `JSON_TABLE` alias `e<n>` (`[n - 1]`).
#[derive(Clone, Debug)]
enum Part {
    Lit(String),
    Index(usize),
}

/// A JSON path under construction.
#[derive(Clone, Debug)]
struct Path(Vec<Part>);

impl Path {
    fn root() -> Self {
        Path(vec![Part::Lit("$".into())])
    }

    fn child(&self, part: Part) -> Self {
        let mut parts = self.0.clone();
        match (parts.last_mut(), part) {
            (Some(Part::Lit(prev)), Part::Lit(more)) => prev.push_str(&more),
            (_, part) => parts.push(part),
        }
        Path(parts)
    }

    fn key(&self, k: &str) -> Self {
        self.child(Part::Lit(format!(".\"{k}\"")))
    }

    /// Appends the path as an SQL expression: one bound string, or a `CONCAT` of bound pieces
    /// and element positions.
    fn push(&self, qb: &mut QueryBuilder<'_, MySql>) {
        if let [Part::Lit(p)] = self.0.as_slice() {
            qb.push_bind(p.clone());
            return;
        }
        qb.push("CONCAT(");
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                qb.push(", ");
            }
            match part {
                Part::Lit(p) => {
                    qb.push_bind(p.clone());
                }
                Part::Index(a) => {
                    qb.push(format!("'[', e{a}.n - 1, ']'"));
                }
            }
        }
        qb.push(")");
    }
}

/// Appends ` AND (<condition>)` matching rows whose `args` contain `cand`.
pub(super) fn push_args_contains(qb: &mut QueryBuilder<'_, MySql>, cand: &Value) -> Result<()> {
    check_compiled_candidate(cand)?;
    qb.push(" AND (");
    let mut aliases = 0;
    push_match(qb, &Path::root(), cand, &mut aliases);
    qb.push(")");
    Ok(())
}

/// The `JSON_TYPE` names a value of `cand`'s type has on MySQL 8 and MariaDB.
fn json_types(cand: &Value) -> &'static str {
    match cand {
        Value::Null => "('NULL')",
        Value::Bool(_) => "('BOOLEAN')",
        Value::Number(_) => "('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL')",
        Value::String(_) => "('STRING')",
        Value::Array(_) => "('ARRAY')",
        Value::Object(_) => "('OBJECT')",
    }
}

fn push_extract(qb: &mut QueryBuilder<'_, MySql>, path: &Path) {
    qb.push(format!("JSON_EXTRACT({ARGS}, "));
    path.push(qb);
    qb.push(")");
}

/// Appends a condition true when the JSON at `path` of the row's args contains `cand`.
fn push_match(qb: &mut QueryBuilder<'_, MySql>, path: &Path, cand: &Value, aliases: &mut usize) {
    qb.push("JSON_TYPE(");
    push_extract(qb, path);
    qb.push(format!(") IN {}", json_types(cand)));
    match cand {
        Value::Object(m) => {
            for (k, v) in m {
                qb.push(" AND ");
                push_match(qb, &path.key(k), v, aliases);
            }
        }
        Value::Array(items) => {
            for item in items {
                *aliases += 1;
                let a = *aliases;
                qb.push(" AND EXISTS (SELECT 1 FROM JSON_TABLE(");
                push_extract(qb, path);
                qb.push(format!(
                    ", '$[*]' COLUMNS (n FOR ORDINALITY)) AS e{a} WHERE "
                ));
                push_match(qb, &path.child(Part::Index(a)), item, aliases);
                qb.push(")");
            }
        }
        Value::Number(n) => {
            qb.push(" AND ");
            push_extract(qb, path);
            qb.push(" = ");
            match n.as_i64() {
                Some(i) => qb.push_bind(i),
                None => qb.push_bind(n.as_f64().unwrap_or(f64::NAN)),
            };
        }
        Value::String(s) => {
            qb.push(" AND CAST(JSON_UNQUOTE(");
            push_extract(qb, path);
            qb.push(") AS BINARY) = CAST(")
                .push_bind(s.clone())
                .push(" AS BINARY)");
        }
        Value::Bool(b) => {
            qb.push(" AND JSON_UNQUOTE(");
            push_extract(qb, path);
            qb.push(if *b { ") = 'true'" } else { ") = 'false'" });
        }
        Value::Null => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sql(cand: &Value) -> Result<String> {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new("SELECT 1 WHERE 1 = 1");
        push_args_contains(&mut qb, cand)?;
        Ok(qb.sql().to_owned())
    }

    #[test]
    fn scalars_and_unquotable_keys_are_refused_by_name() {
        for cand in [json!(3), json!("x"), json!({"a\"b": 1})] {
            let e = sql(&cand).unwrap_err().to_string();
            assert!(e.contains("args_contains"), "{cand}: {e}");
        }
    }

    #[test]
    fn paths_and_values_are_parameters() {
        let s = sql(&json!({"a": "'; DROP TABLE x; --", "b": [{"c": 1}]})).unwrap();
        assert!(!s.contains("DROP") && !s.contains("\"c\""), "{s}");
        assert!(s.contains("AS e1 WHERE"), "{s}");
        assert!(s.contains("'[', e1.n - 1, ']'"), "{s}");
    }
}
