//! PostgreSQL: a runner's round, its completions and its next claim in one statement (two
//! data-modifying CTEs: the guarded completions and the claim, which records each attempt's
//! `started` entry in its row, migration 0020), so they cost one round trip and one WAL flush
//! instead of two of each.
//! The completed rows are `running` and the claim picks `pending` ones, so the two updates
//! never touch the same row. A round with other outcomes than completions takes the two
//! calls of the trait's default, and so does every round while group limits exist (the
//! limited claim of [`super::limits`] then runs after the finishes' commit).

use super::claim::decode_claimed;
use super::finish::{complete_leases_sql, log};
use super::{ts, PgStore};
use crate::error::{Error, Result};
use crate::store::{ClaimRequest, Finish, FinishAndClaim, FinishResult, Lease, Store};
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::collections::HashSet;

/// Binds: 1 now, 2 limit, 3 owner, 4 lease_until, 5 hooks, 6 routed hooks, 7 their groups,
/// 8 ids, 9 tokens. Rows: the completed ids (`done` true), then the claimed actions in claim
/// order. The completions are [`super::finish::complete_leases_sql`]'s.
pub(super) const ROUND: &str = concat!(
    "WITH done AS (",
    complete_leases_sql!("$1", "$8", "$9"),
    "),
 claimed AS (
     UPDATE dockhand_actions a
     SET status = 'running', lease_owner = $3, lease_token = a.lease_token + 1,
         lease_until = $4, attempt = a.attempt + 1, started_at = $1, started_by = $3,
         started_after = COALESCE(
             (SELECT MAX(l.id) FROM dockhand_action_logs l WHERE l.action_id = a.id), 0)
     WHERE a.id = ANY(ARRAY(SELECT dockhand_due_ids($1, $2, $5::text[], $6::text[], $7::text[])))
     RETURNING a.*)
 SELECT r.*, (SELECT EXISTS (SELECT 1 FROM dockhand_group_limits)) AS limited FROM (
     SELECT true AS done, id, NULL::text AS hook, NULL::jsonb AS args, NULL::text AS group_name,
            NULL::timestamptz AS scheduled_at, NULL::int4 AS attempt,
            NULL::int4 AS max_attempts, NULL::int8 AS timeout_ms, NULL::int8 AS lease_token,
            NULL::int4 AS priority
     FROM done
     UNION ALL
     SELECT false, id, hook, args, group_name, scheduled_at, attempt, max_attempts, timeout_ms,
            lease_token, priority
     FROM claimed) r
 ORDER BY done DESC, priority, scheduled_at, id"
);

pub(super) async fn finish_and_claim(
    store: &PgStore,
    items: &[(Lease, Finish)],
    req: &ClaimRequest<'_>,
    now: DateTime<Utc>,
) -> Result<FinishAndClaim> {
    let all_complete = items.iter().all(|(_, o)| matches!(o, Finish::Complete));
    if !all_complete || items.is_empty() || req.limit <= 0 || store.limits_seen() {
        let finished = store.finish_many(items, now).await?;
        let claimed = store.claim(req).await;
        return Ok(FinishAndClaim { finished, claimed });
    }
    let ids: Vec<i64> = items.iter().map(|(l, _)| l.id).collect();
    let tokens: Vec<i64> = items.iter().map(|(l, _)| l.token).collect();
    let rows = sqlx::query(ROUND)
        .bind(ts(req.now))
        .bind(req.limit)
        .bind(req.owner)
        .bind(ts(req.lease_until))
        .bind(req.hooks)
        .bind(req.routing.map(|r| r.hooks))
        .bind(req.routing.map(|r| r.groups))
        .bind(ids)
        .bind(tokens)
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("finish_and_claim"))?;
    let mut done = HashSet::new();
    let mut claimed = Vec::new();
    let mut decode_error = None;
    for row in &rows {
        let is_done: bool = row.try_get("done").map_err(Error::db("finish_and_claim"))?;
        if is_done {
            done.insert(
                row.try_get::<i64, _>("id")
                    .map_err(Error::db("finish_and_claim"))?,
            );
        } else {
            match decode_claimed(row) {
                Ok(a) => claimed.push(a),
                Err(e) => decode_error = Some(e),
            }
        }
    }
    match super::claim::limited_flag(&rows)? {
        Some(seen) => store.set_limits_seen(seen),
        None => store.set_limits_seen(super::limits::any(store).await?),
    }
    let finished = lost_completions(store, items, &done, now).await?;
    Ok(FinishAndClaim {
        finished,
        claimed: match decode_error {
            Some(e) => Err(e),
            None => Ok(claimed),
        },
    })
}

/// The results of completions-only `items` given the ids that were applied; a `lease_lost`
/// log row for each of the others.
pub(super) async fn lost_completions(
    store: &PgStore,
    items: &[(Lease, Finish)],
    applied: &HashSet<i64>,
    now: DateTime<Utc>,
) -> Result<Vec<FinishResult>> {
    let mut out = Vec::with_capacity(items.len());
    let mut conn = None;
    for (lease, outcome) in items {
        if applied.contains(&lease.id) {
            out.push(FinishResult::Applied);
            continue;
        }
        if conn.is_none() {
            conn = Some(
                store
                    .pool
                    .acquire()
                    .await
                    .map_err(Error::db("finish (lease lost)"))?,
            );
        }
        if let Some(c) = conn.as_mut() {
            let (event, detail) = outcome.lease_lost_entry(lease.token);
            log(c, lease.id, now, event, Some(detail)).await?;
        }
        out.push(FinishResult::LeaseLost);
    }
    Ok(out)
}
