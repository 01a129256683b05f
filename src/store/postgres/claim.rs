//! PostgreSQL: claiming due actions and heartbeating their leases.
//!
//! Claim SQL (Q3): one statement. `dockhand_due_ids` (migration 0004; 0006 skips paused
//! groups, 0009 adds the routing of [`crate::store::Routing`]) locks up to n due
//! pending rows in (priority, scheduled_at, id) order with `FOR UPDATE SKIP LOCKED` (concurrent
//! claimers take disjoint rows without waiting) through the ordered partial claim index, whatever
//! the table's statistics say; `claimed` stamps the lease, counts the attempt and records its
//! `started` log entry in the row (migration 0020: `started_by`, `started_after`; only a
//! re-claim stores the previous attempt's entry, by trigger). Limited groups (0016) are left
//! out of the pick too; the statement also says whether any exist, and while some do claims
//! take the limited path of [`super::limits`].
//!
//! Picked ids go through `id = ANY(ARRAY(…))`, never a join or `IN (subquery)`: sqlx prepares
//! statements, and PostgreSQL's generic plan for `LIMIT $n` guesses hundreds of rows and
//! hash-joins them against a sequential scan of the whole table, making every claim O(table).
//! `= ANY(ARRAY(…))` is always a primary-key index scan. The same holds for every statement in
//! this backend that updates rows picked by a subquery.

use super::{limits, ts, PgStore};
use crate::error::{Error, Result};
use crate::store::{ClaimRequest, ClaimedAction, Lease};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::Row;

/// Binds: 1 owner, 2 ids, 3 tokens, 4 lease until. A join with the unnested leases by primary
/// key (an `IN (SELECT … FROM UNNEST …)` semi-join beside `id = ANY($2)` tested every
/// lease against each held row: 2,700 leases took 0.4-0.6 s; `tests/plans.rs`).
pub(super) const HEARTBEAT: &str = "UPDATE dockhand_actions a SET lease_until = $4
 FROM UNNEST($2::bigint[], $3::bigint[]) AS l(id, token)
 WHERE a.id = l.id AND a.lease_token = l.token
   AND a.status = 'running' AND a.lease_owner = $1";

const CLAIM: &str = "WITH claimed AS (
     UPDATE dockhand_actions a
     SET status = 'running', lease_owner = $3, lease_token = a.lease_token + 1,
         lease_until = $4, attempt = a.attempt + 1, started_at = $1, started_by = $3,
         started_after = COALESCE(
             (SELECT MAX(l.id) FROM dockhand_action_logs l WHERE l.action_id = a.id), 0)
     WHERE a.id = ANY(ARRAY(SELECT dockhand_due_ids($1, $2, $5::text[], $6::text[], $7::text[])))
     RETURNING a.*)
 SELECT id, hook, args, group_name, scheduled_at, attempt, max_attempts, timeout_ms, lease_token,
        (SELECT EXISTS (SELECT 1 FROM dockhand_group_limits)) AS limited
 FROM claimed
 ORDER BY priority, scheduled_at, id";

pub(super) async fn claim(store: &PgStore, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedAction>> {
    if req.limit <= 0 {
        return Ok(Vec::new());
    }
    if store.limits_seen() {
        return limits::claim_limited(store, req).await;
    }
    let rows = claim_rows(store, req).await?;
    match limited_flag(&rows)? {
        Some(seen) => store.set_limits_seen(seen),
        // Nothing claimed: perhaps because every due action is in a limited group.
        None if limits::any(store).await? => return limits::claim_limited(store, req).await,
        None => {}
    }
    rows.iter().map(decode_claimed).collect()
}

/// Whether group limits exist, as the claim statement's rows say (`None`: no rows). While
/// they do, claims take the limited path ([`limits`]).
pub(super) fn limited_flag(rows: &[PgRow]) -> Result<Option<bool>> {
    rows.first()
        .map(|r| r.try_get("limited").map_err(Error::db("claim")))
        .transpose()
}

/// The claim statement (limited groups left out), its rows undecoded.
pub(super) async fn claim_rows(store: &PgStore, req: &ClaimRequest<'_>) -> Result<Vec<PgRow>> {
    sqlx::query(CLAIM)
        .bind(ts(req.now))
        .bind(req.limit)
        .bind(req.owner)
        .bind(ts(req.lease_until))
        .bind(req.hooks)
        .bind(req.routing.map(|r| r.hooks))
        .bind(req.routing.map(|r| r.groups))
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("claim"))
}

/// One claimed row (`id, hook, args, group_name, scheduled_at, attempt, max_attempts,
/// timeout_ms, lease_token`).
pub(super) fn decode_claimed(row: &PgRow) -> Result<ClaimedAction> {
    let d = || Error::db("claim");
    let args: Json<Value> = row.try_get("args").map_err(d())?;
    Ok(ClaimedAction {
        id: row.try_get("id").map_err(d())?,
        hook: row.try_get("hook").map_err(d())?,
        args: args.0,
        group: row.try_get("group_name").map_err(d())?,
        scheduled_at: row.try_get("scheduled_at").map_err(d())?,
        attempt: row.try_get("attempt").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        timeout_ms: row.try_get("timeout_ms").map_err(d())?,
        token: row.try_get("lease_token").map_err(d())?,
    })
}

pub(super) async fn heartbeat(
    store: &PgStore,
    owner: &str,
    leases: &[Lease],
    until: DateTime<Utc>,
) -> Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
    let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
    let done = sqlx::query(HEARTBEAT)
        .bind(owner)
        .bind(ids)
        .bind(tokens)
        .bind(ts(until))
        .execute(&store.pool)
        .await
        .map_err(Error::db("heartbeat"))?;
    Ok(done.rows_affected())
}
