//! Operator search by args containment (the dashboard's args filter, issue 8): every backend
//! agrees with PostgreSQL's `@>` semantics (`dockhand::search::json_contains`, the reference)
//! on random documents and candidates.

use crate::harness::TestDb;
use dockhand::search::{json_contains, ActionSearch};
use dockhand::ActionSpec;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// A random JSON value of bounded depth from a small alphabet, so containment happens often.
fn random_json(rng: &mut fastrand::Rng, depth: u32) -> Value {
    let scalar = |rng: &mut fastrand::Rng| match rng.u8(0..7) {
        0 => Value::Null,
        1 => json!(rng.bool()),
        2 => json!(rng.i64(0..3)),
        3 => json!(rng.i64(0..3) as f64 + 0.5),
        4 => json!(["a", "b", "1"][rng.usize(0..3)]),
        5 => json!(2.0),
        _ => json!(rng.i64(0..3)),
    };
    if depth == 0 || rng.u8(0..3) == 0 {
        return scalar(rng);
    }
    if rng.bool() {
        let n = rng.usize(0..4);
        Value::Object(
            (0..n)
                .map(|_| {
                    (
                        ["a", "b", "c"][rng.usize(0..3)].to_string(),
                        random_json(rng, depth - 1),
                    )
                })
                .collect(),
        )
    } else {
        Value::Array(
            (0..rng.usize(0..4))
                .map(|_| random_json(rng, depth - 1))
                .collect(),
        )
    }
}

/// A candidate drawn from a document (so it often matches), sometimes perturbed.
fn sub_candidate(rng: &mut fastrand::Rng, doc: &Value) -> Value {
    match doc {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                if rng.bool() {
                    let v = if rng.u8(0..4) == 0 {
                        random_json(rng, 1)
                    } else {
                        sub_candidate(rng, v)
                    };
                    out.insert(k.clone(), v);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Vec::new();
            for v in items {
                if rng.bool() {
                    out.push(sub_candidate(rng, v));
                }
            }
            Value::Array(out)
        }
        other => other.clone(),
    }
}

pub async fn ops_args_contains_agrees_with_postgres_semantics(db: TestDb) {
    let mut rng = fastrand::Rng::with_seed(8);
    let q = db.queue();
    let mut docs = Vec::new();
    for _ in 0..120 {
        let doc = if rng.u8(0..4) == 0 {
            Value::Array(
                (0..rng.usize(0..4))
                    .map(|_| random_json(&mut rng, 2))
                    .collect(),
            )
        } else {
            random_json(&mut rng, 3)
        };
        let doc = if doc.is_object() || doc.is_array() {
            doc
        } else {
            json!({"v": doc})
        };
        let id = q.enqueue(ActionSpec::new("h", doc.clone())).await.unwrap();
        docs.push((id, doc));
    }
    let mut matched = 0;
    for n in 0..150 {
        let cand = if n % 3 == 0 {
            random_json(&mut rng, 2)
        } else {
            let d = &docs[rng.usize(0..docs.len())].1;
            sub_candidate(&mut rng, d)
        };
        if !(cand.is_object() || cand.is_array()) {
            continue;
        }
        let want: BTreeSet<i64> = docs
            .iter()
            .filter(|(_, d)| json_contains(d, &cand))
            .map(|(id, _)| *id)
            .collect();
        let s = ActionSearch {
            args_contains: Some(cand.clone()),
            limit: 500,
            ..Default::default()
        };
        let got: BTreeSet<i64> = db
            .store
            .search_actions(&s)
            .await
            .unwrap()
            .rows
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(got, want, "args @> {cand}");
        if !want.is_empty() && want.len() < docs.len() {
            matched += 1;
        }
    }
    assert!(matched > 30, "candidates discriminate ({matched})");
}
