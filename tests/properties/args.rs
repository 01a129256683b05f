//! Args JSON (§5 row 3): random `serde_json` values round-trip through enqueue → read back on
//! every backend with the same value back (on PostgreSQL up to one documented number-type
//! difference, see [`same_json`]); what a backend cannot store faithfully (NUL in a
//! string or key, documents nested too deep to read back, oversize documents) is refused by
//! `ActionSpec::prepare` with an error naming `args`, before anything is written.

use crate::harness::{t0, Kind, TestDb};
use crate::support::{check, tokio_rt};
use dockhand::action::{encode_args, MAX_ARGS_BYTES, MAX_ARGS_DEPTH};
use dockhand::{ActionSpec, Error};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Strings with the characters JSON has to escape, quotes, non-BMP characters — never NUL.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}",
        "[\\x01-\\x1f\"\\\\/\\u{7f}-\\u{a0}\\u{2028}\\u{2029}é€😀]{0,8}",
        "\\PC{0,12}",
    ]
}

fn number() -> impl Strategy<Value = Number> {
    prop_oneof![
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
        (-1000i64..1000).prop_map(Number::from),
        any::<f64>().prop_filter_map("finite", Number::from_f64),
        (-1e6f64..1e6).prop_filter_map("finite", Number::from_f64),
        // Integral floats printed in exponent form (`1e16`): PostgreSQL's jsonb gives them
        // back as integer literals (see `same_json`).
        (1e16f64..1e19).prop_filter_map("finite", |f| Number::from_f64(f.trunc())),
    ]
}

/// Any JSON value up to 6 levels deep (well within the depth limit).
pub fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number().prop_map(Value::Number),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// `depth` levels of arrays/objects (chosen by `shape`'s bits) around `null`.
fn nested(depth: usize, shape: u64) -> Value {
    let mut v = Value::Null;
    for level in 0..depth {
        v = if shape >> (level % 64) & 1 == 0 {
            Value::Array(vec![v])
        } else {
            Value::Object(Map::from_iter([("k".to_string(), v)]))
        };
    }
    v
}

fn depth_of(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth_of).max().unwrap_or(0),
        _ => 0,
    }
}

/// Equal values, except one known PostgreSQL difference: jsonb keeps numbers as `numeric`,
/// so an integral float serde_json prints in exponent form (`1e16`, from 1e16 up) comes back
/// as the integer literal `10000000000000000`, which serde_json reads as an integer. The
/// value is the same number (`as_f64` agrees) but no longer `is_f64`. Reported, not fixed:
/// storing args as `json` instead of `jsonb` would be a migration.
fn same_json(back: &Value, sent: &Value, kind: Kind) -> bool {
    match (back, sent) {
        (Value::Number(b), Value::Number(s)) => {
            b == s || (kind == Kind::Postgres && s.is_f64() && b.as_f64() == s.as_f64())
        }
        (Value::Array(b), Value::Array(s)) => {
            b.len() == s.len() && b.iter().zip(s).all(|(b, s)| same_json(b, s, kind))
        }
        (Value::Object(b), Value::Object(s)) => {
            b.len() == s.len()
                && s.iter()
                    .all(|(k, s)| b.get(k).is_some_and(|b| same_json(b, s, kind)))
        }
        (b, s) => b == s,
    }
}

fn round_trip(kind: Kind) {
    let rt = tokio_rt();
    let Some(db) = rt.block_on(TestDb::new(kind)) else {
        return;
    };
    let queue = db.queue();
    let cases = if kind == Kind::Sqlite { 256 } else { 128 };
    check(cases, json(), |args| {
        let back = rt.block_on(async {
            let id = queue.enqueue(ActionSpec::new("h", args.clone())).await?;
            queue.get(id).await
        });
        let back = back.map_err(|e| TestCaseError::fail(format!("{kind:?}: {e}")))?;
        prop_assert!(
            same_json(&back.args, &args, kind),
            "{kind:?}: {args} came back as {}",
            back.args
        );
        Ok(())
    });
    rt.block_on(db.cleanup());
}

/// Nesting from 1 to 3 × the limit: up to the limit it round-trips, beyond it `prepare` refuses
/// it naming `args` (serde_json reads back at most 128 levels: before the limit, depth 128
/// was stored and then read back as a corrupt row).
fn depth_limit(kind: Kind) {
    let rt = tokio_rt();
    let Some(db) = rt.block_on(TestDb::new(kind)) else {
        return;
    };
    let queue = db.queue();
    check(
        48,
        (1..=3 * MAX_ARGS_DEPTH, any::<u64>()),
        |(depth, shape)| {
            let args = nested(depth, shape);
            prop_assert_eq!(depth_of(&args), depth);
            let r = rt.block_on(async {
                let id = queue.enqueue(ActionSpec::new("h", args.clone())).await?;
                queue.get(id).await
            });
            match r {
                Ok(a) => {
                    prop_assert!(depth <= MAX_ARGS_DEPTH, "depth {depth} accepted");
                    prop_assert_eq!(a.args, args);
                }
                Err(Error::InvalidInput { field: "args", .. }) => {
                    prop_assert!(depth > MAX_ARGS_DEPTH, "depth {depth} refused")
                }
                Err(e) => prop_assert!(false, "{kind:?} depth {depth}: {e}"),
            }
            Ok(())
        },
    );
    rt.block_on(db.cleanup());
}

crate::per_backend!(round_trip, depth_limit);

/// A NUL anywhere (in a string or a key, at any depth) is refused up front, naming `args`.
#[test]
fn nul_is_refused_up_front() {
    let with_nul =
        (json(), text(), text(), any::<bool>(), 0..4usize).prop_map(|(v, a, b, in_key, wrap)| {
            let s = format!("{a}\u{0}{b}");
            let mut out = if in_key {
                Value::Object(Map::from_iter([(s, v)]))
            } else {
                Value::Array(vec![v, Value::String(s)])
            };
            for _ in 0..wrap {
                out = Value::Array(vec![Value::Null, out]);
            }
            out
        });
    check(512, with_nul, |args| {
        match ActionSpec::new("h", args).prepare(t0()) {
            Err(Error::InvalidInput { field, message }) => {
                prop_assert_eq!(field, "args");
                prop_assert!(message.contains("NUL"), "{}", message);
            }
            other => prop_assert!(false, "not refused: {other:?}"),
        }
        Ok(())
    });
}

/// The size limit is exact (a boundary, so three fixed cases rather than random ones), and
/// `encode_args` agrees with `serde_json` on everything it accepts.
#[test]
fn size_limit_is_exact() {
    // `"…"` adds 2 bytes of quotes around the string.
    for (len, ok) in [
        (MAX_ARGS_BYTES - 2, true),
        (MAX_ARGS_BYTES - 1, false),
        (MAX_ARGS_BYTES + 10, false),
    ] {
        match encode_args(&Value::String("x".repeat(len))) {
            Ok(text) => assert!(ok && text.len() == len + 2, "{} bytes accepted", len + 2),
            Err(Error::InvalidInput { field, .. }) => {
                assert!(!ok && field == "args", "{} bytes refused", len + 2)
            }
            Err(e) => panic!("untyped error {e:?}"),
        }
    }
    check(512, json(), |v| {
        prop_assert_eq!(encode_args(&v).unwrap(), serde_json::to_string(&v).unwrap());
        Ok(())
    });
}
