//! `dockhand::search::json_contains`, the reference for the dashboard's `args contains`
//! filter, agrees with PostgreSQL's `jsonb @>` on random documents and candidates (half of
//! them cut down from the document, so both answers are frequent).

use crate::args::json;
use crate::support::{check, tokio_rt};
use dockhand::search::json_contains;
use proptest::prelude::*;
use serde_json::Value;

/// `v` with parts dropped, driven by `bits`: object keys and array elements removed, nested
/// values cut down in turn.
fn drop_next(bits: &mut u64) -> bool {
    *bits = bits.rotate_left(7) ^ 0x9e37_79b9_7f4a_7c15;
    *bits & 3 == 0
}

fn prune(v: &Value, bits: &mut u64) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m {
                if !drop_next(bits) {
                    out.insert(k.clone(), prune(x, bits));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => {
            let mut out = Vec::new();
            for x in a {
                if !drop_next(bits) {
                    out.push(prune(x, bits));
                }
            }
            Value::Array(out)
        }
        other => other.clone(),
    }
}

fn pairs() -> impl Strategy<Value = (Value, Value)> {
    prop_oneof![
        (json(), json()),
        (json(), any::<u64>()).prop_map(|(d, mut bits)| {
            let c = prune(&d, &mut bits);
            (d, c)
        }),
    ]
}

#[test]
fn reference_agrees_with_postgres() {
    // The query reads no table: a plain connection to the server will do.
    let Ok(url) = std::env::var("DOCKHAND_TEST_POSTGRES_URL") else {
        eprintln!("skipped: DOCKHAND_TEST_POSTGRES_URL not set (json_contains vs PostgreSQL)");
        return;
    };
    let rt = tokio_rt();
    let pool = rt
        .block_on(sqlx::PgPool::connect(&url))
        .expect("connect to PostgreSQL");
    check(1024, pairs(), |(doc, cand)| {
        let pg: bool = rt
            .block_on(
                sqlx::query_scalar("SELECT $1::jsonb @> $2::jsonb")
                    .bind(sqlx::types::Json(&doc))
                    .bind(sqlx::types::Json(&cand))
                    .fetch_one(&pool),
            )
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(json_contains(&doc, &cand), pg, "{} @> {}", doc, cand);
        Ok(())
    });
    rt.block_on(pool.close());
}
