//! Plans of the statements that join a set of leases or runs passed as arrays (`UNNEST`),
//! under the generic plan PostgreSQL switches a prepared statement to after five runs: each
//! must find its rows by key, never test every unnested row against every candidate row (the
//! key equality as a nested loop's `Join Filter`). With an `id = ANY($1)` beside the join, 2,700 finishes
//! took 1.2 s instead of 13 ms once the plan went generic. Also: the batch hand-over of claims
//! by token, and the grouped finish's release of superseded claims, on stale statistics.

use super::{claim_request, cleanup, fresh, t0};
use crate::store::postgres::{children, claim, finish, finish_set, round};
use crate::store::{PreparedAction, Store};
use crate::ActionSpec;
use serde_json::json;
use sqlx::Row;

/// Rows enough for statistics to favour an index over a scan.
const ROWS: usize = 20_000;

/// `statement` prepared under `plan_cache_mode = force_generic_plan` and explained with
/// `args` (SQL literals; their values do not shape a generic plan). `args` may start with the
/// parameters' types in parentheses, for a statement whose types PostgreSQL cannot infer.
async fn generic_plan(
    conn: &mut sqlx::PgConnection,
    name: &str,
    statement: &str,
    args: &str,
) -> String {
    let (types, args) = match args.strip_prefix('(').and_then(|a| a.split_once(") ")) {
        Some((types, args)) => (format!("({types})"), args),
        None => (String::new(), args),
    };
    sqlx::raw_sql(&format!("PREPARE {name} {types} AS {statement}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let rows = sqlx::raw_sql(&format!("EXPLAIN EXECUTE {name}({args})"))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn lease_sets_are_joined_by_key_under_a_generic_plan() {
    let Some((s, url, schema)) = fresh("lease_sets_are_joined_by_key_under_a_generic_plan").await
    else {
        return;
    };
    let now = t0();
    let actions: Vec<PreparedAction> = (0..ROWS)
        .map(|i| {
            ActionSpec::new("plan.test", json!({ "n": i }))
                .prepare(now)
                .unwrap()
        })
        .collect();
    s.enqueue_bulk(&actions, now).await.unwrap();
    let claimed = s.claim(&claim_request("w", now, 3_000)).await.unwrap();
    assert_eq!(claimed.len(), 3_000);
    let mut conn = s.pool.acquire().await.unwrap();
    sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let ids = "'{1,2,3}'";
    let cases = [
        (
            "finish::COMPLETE_LEASES",
            ("a.id", "l.id"),
            finish::COMPLETE_LEASES,
            format!("{ids}, {ids}, now()"),
        ),
        (
            "claim::HEARTBEAT",
            ("a.id", "l.id"),
            claim::HEARTBEAT,
            format!("'w', {ids}, {ids}, now()"),
        ),
        (
            "round::ROUND",
            ("a.id", "l.id"),
            round::ROUND,
            format!("now(), 10, 'w', now(), '{{plan.test}}', '{{}}', '{{}}', {ids}, {ids}"),
        ),
    ];
    for (i, (name, (left, right), statement, args)) in cases.into_iter().enumerate() {
        let plan = generic_plan(&mut conn, &format!("plan_{i}"), statement, &args).await;
        let by_filter = plan.lines().any(|l| {
            l.contains("Join Filter")
                && (l.contains(&format!("{left} = {right}"))
                    || l.contains(&format!("{right} = {left}")))
        });
        assert!(
            !by_filter,
            "{name}: the generic plan tests every unnested row against each candidate \
             ({left} = {right} as a join filter):\n{plan}"
        );
    }
    drop(conn);
    cleanup(s, &url, &schema).await;
}

/// The claims of a chunk, handed from the batch parent to its children, are found by token and
/// then by primary key, also on statistics taken before the batch's claims existed: neither a
/// scan of the claims table nor a walk of the parent's claims (its `job_id` index), which
/// costs every chunk the whole batch. The grouped finish's superseded claims, on the same
/// statistics, are read by the `job_id` index of the group's own jobs.
#[tokio::test]
async fn hand_over_finds_claims_by_token_on_stale_statistics() {
    let Some((s, url, schema)) = fresh("hand_over_finds_claims_by_token_on_stale_statistics").await
    else {
        return;
    };
    let parent = super::new_job(&s).await;
    let mut conn = s.pool.acquire().await.unwrap();
    sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
    // The batch's claims arrive after the statistics were taken, as W4's do.
    sqlx::query(
        "INSERT INTO dockhand_item_claims
             (identity_hash, scope, source_type, item_id, status, token, job_id, claimed_at,
              expires_at)
         SELECT 'h' || g, 'shared:plan', 'plan', 'item-' || g, 'claimed', 't' || g, $1, now(),
                now() + INTERVAL '5 minutes'
         FROM generate_series(1, 5000) AS g",
    )
    .bind(parent)
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let cases = [
        (
            "children::HELD_CLAIMS",
            children::HELD_CLAIMS,
            format!("{parent}, '{{t1,t2,t3}}'"),
        ),
        (
            "children::HAND_OVER_CLAIMS",
            children::HAND_OVER_CLAIMS,
            format!(
                "(text[], timestamptz, int8[], int8[], int8) \
                 '{{t1,t2,t3}}', now(), '{{7,8,9}}', '{{1000,1000,1000}}', {parent}"
            ),
        ),
    ];
    for (i, (name, statement, args)) in cases.into_iter().enumerate() {
        let plan = generic_plan(&mut conn, &format!("hand_{i}"), statement, &args).await;
        assert!(
            !plan.contains("dockhand_item_claims_job")
                && !plan.contains("Seq Scan on dockhand_item_claims"),
            "{name}: the plan walks the parent's claims or scans the table:\n{plan}"
        );
    }
    // The grouped finish's release of superseded claims reads the claims of the group's own
    // jobs by their index, never every claimed claim of the table.
    let plan = generic_plan(
        &mut conn,
        "release_superseded",
        finish_set::RELEASE_SUPERSEDED,
        &format!("'{{{parent},2,3}}', '{{1,1,1}}', '{{4,5,6}}', '{{1,1,1}}', '{{}}', '{{}}'"),
    )
    .await;
    assert!(
        plan.contains("dockhand_item_claims_job")
            && !plan.contains("Seq Scan on dockhand_item_claims")
            && !plan.contains("dockhand_item_claims_expiry"),
        "finish_set::RELEASE_SUPERSEDED: the plan reads more than the group's jobs' claims:\n{plan}"
    );
    drop(conn);
    cleanup(s, &url, &schema).await;
}
