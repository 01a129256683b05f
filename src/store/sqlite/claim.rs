//! SQLite: claiming due actions and heartbeating their leases.
//!
//! Claim SQL (Q3): one `UPDATE … WHERE id IN (SELECT … ORDER BY priority, scheduled_at, id
//! LIMIT n) RETURNING …` over the partial claim index, in autocommit mode (one statement is
//! atomic; SQLite's single writer serialises claimers). The hook filter and the routing
//! ([`crate::store::Routing`]) are filters on that ordered scan. A claim writes no `started`
//! log row: it records the attempt in the row (`claim_started_sql!`, migration 0020), and
//! the `dockhand_actions_log_restarted` trigger stores the previous attempt's entry on a
//! re-claim.
//! Limited groups (migration 0016) are left out of this pick; the statement also says whether
//! any exist, and while some do claims take the limited path of [`super::limits`].

use super::{from_ms, hot, limits, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::store::{ClaimRequest, ClaimedAction, Lease};
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

/// The claim statement (binds: 1 owner, 2 lease_until, 3 now, 4 limit, 5-7 the filters of
/// [`filter_json`]); a macro so [`super::round`] can put it in one query string with the
/// completions.
macro_rules! claim_sql {
    () => {
        concat!(
            "UPDATE dockhand_actions
 SET status = 'running', lease_owner = ?1, lease_token = lease_token + 1, lease_until = ?2,
     attempt = attempt + 1, ",
            claim_started_sql!(),
            "
 WHERE id IN (
     SELECT id FROM dockhand_actions
     WHERE status = 'pending' AND scheduled_at <= ?3
       AND (?5 IS NULL OR hook IN (SELECT value FROM json_each(?5)))
       AND (?6 IS NULL OR hook NOT IN (SELECT value FROM json_each(?6))
            OR group_name IN (SELECT value FROM json_each(?7)))
       AND (group_name IS NULL
            OR group_name NOT IN (SELECT group_name FROM dockhand_group_pauses
                                  UNION ALL SELECT group_name FROM dockhand_group_limits))
     ORDER BY priority, scheduled_at, id
     LIMIT ?4)
 RETURNING id, hook, args, group_name, scheduled_at, attempt, max_attempts, timeout_ms,
           lease_token, priority, EXISTS (SELECT 1 FROM dockhand_group_limits) AS limited"
        )
    };
}
pub(super) use claim_sql;

/// The columns every claim statement sets for the attempt's `started` log entry (migration
/// 0020; binds: 1 owner, 3 now): `started_at`, `started_by` and `started_after`, the
/// action's largest stored log id (0 if none), an index probe on
/// `dockhand_action_logs_action`. The log queries place the entry right after that id.
macro_rules! claim_started_sql {
    () => {
        "started_at = ?3, started_by = ?1, started_after = COALESCE((SELECT MAX(l.id)
     FROM dockhand_action_logs l WHERE l.action_id = dockhand_actions.id), 0)"
    };
}
pub(super) use claim_started_sql;

pub(super) const CLAIM: &str = claim_sql!();

pub(super) async fn claim(
    store: &SqliteStore,
    req: &ClaimRequest<'_>,
) -> Result<Vec<ClaimedAction>> {
    if req.limit <= 0 {
        return Ok(Vec::new());
    }
    if store.limits_seen() {
        return limits::claim_limited(store, req).await;
    }
    let writer = store.writer_handle();
    if writer.has_direct() {
        let args = hot::ClaimArgs::new(req)?;
        let claimed = writer
            .direct_inline_first(
                "claim",
                hot::inline_first(store),
                |conn| hot::claim(conn, &args),
                || {
                    let args = args.clone();
                    move |conn: &mut _| hot::claim(conn, &args)
                },
            )
            .await?;
        hot::claimed(store, req.limit, &claimed);
        return claimed_or_limited(store, req, claimed).await;
    }
    let [hooks, routed_hooks, routed_groups] = filter_json(req)?;
    let rows = sqlx::query(CLAIM)
        .bind(req.owner)
        .bind(ms(req.lease_until))
        .bind(ms(req.now))
        .bind(req.limit)
        .bind(hooks)
        .bind(routed_hooks)
        .bind(routed_groups)
        .fetch_all(&mut *store.write_conn("claim").await?)
        .await
        .map_err(Error::db("claim"))?;
    match limited_flag(&rows)? {
        Some(seen) => store.set_limits_seen(seen),
        // Nothing claimed: perhaps because every due action is in a limited group.
        None if limits::any(store).await? => return limits::claim_limited(store, req).await,
        None => {}
    }
    decode_claimed(rows)
}

/// A claim's actions, or, when it took none and group limits exist (perhaps every due action
/// is in a limited group), the limited path's.
async fn claimed_or_limited(
    store: &SqliteStore,
    req: &ClaimRequest<'_>,
    claimed: hot::Claimed,
) -> Result<Vec<ClaimedAction>> {
    match claimed.limited {
        Some(seen) => store.set_limits_seen(seen),
        None if limits::any(store).await? => return limits::claim_limited(store, req).await,
        None => {}
    }
    Ok(claimed.actions)
}

/// Whether group limits exist, as the claim statement's rows say (`None`: no rows). While
/// they do, claims take the limited path ([`limits`]).
pub(super) fn limited_flag(claimed: &[SqliteRow]) -> Result<Option<bool>> {
    claimed
        .first()
        .map(|r| r.try_get("limited").map_err(Error::db("claim")))
        .transpose()
}

/// The claim's filters as the JSON arrays [`CLAIM`] binds (5, 6, 7): the hooks it is
/// restricted to, the routed hooks and their groups (`None`: no such filter).
pub(super) fn filter_json(req: &ClaimRequest<'_>) -> Result<[Option<String>; 3]> {
    let json = |v: Option<&[String]>| {
        v.map(serde_json::to_string)
            .transpose()
            .map_err(|e| Error::invalid("hooks", e.to_string()))
    };
    Ok([
        json(req.hooks)?,
        json(req.routing.map(|r| r.hooks))?,
        json(req.routing.map(|r| r.groups))?,
    ])
}

/// Claimed rows (as [`CLAIM`] returns them) in claim order. RETURNING follows the update's
/// row order, not the pick's, so they are sorted by (priority, scheduled_at, id).
pub(super) fn decode_claimed(rows: Vec<SqliteRow>) -> Result<Vec<ClaimedAction>> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let d = || Error::db("claim");
        let priority: i32 = row.try_get("priority").map_err(d())?;
        let id: i64 = row.try_get("id").map_err(d())?;
        let args_text: String = row.try_get("args").map_err(d())?;
        let args = serde_json::from_str(&args_text).map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: format!("args: {e}"),
        })?;
        let action = ClaimedAction {
            id,
            hook: row.try_get("hook").map_err(d())?,
            args,
            group: row.try_get("group_name").map_err(d())?,
            scheduled_at: from_ms(row.try_get("scheduled_at").map_err(d())?),
            attempt: row.try_get("attempt").map_err(d())?,
            max_attempts: row.try_get("max_attempts").map_err(d())?,
            timeout_ms: row.try_get("timeout_ms").map_err(d())?,
            token: row.try_get("lease_token").map_err(d())?,
        };
        claimed.push((priority, action));
    }
    claimed.sort_by_key(|(priority, a)| (*priority, a.scheduled_at, a.id));
    Ok(claimed.into_iter().map(|(_, a)| a).collect())
}

pub(super) async fn heartbeat(
    store: &SqliteStore,
    owner: &str,
    leases: &[Lease],
    until: DateTime<Utc>,
) -> Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let pairs: Vec<[i64; 2]> = leases.iter().map(|l| [l.id, l.token]).collect();
    let pairs_json =
        serde_json::to_string(&pairs).map_err(|e| Error::invalid("leases", e.to_string()))?;
    let done = sqlx::query(
        "UPDATE dockhand_actions SET lease_until = ?1
         FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token
               FROM json_each(?3)) AS l
         WHERE dockhand_actions.id = l.id AND dockhand_actions.lease_token = l.token
           AND status = 'running' AND lease_owner = ?2",
    )
    .bind(ms(until))
    .bind(owner)
    .bind(pairs_json)
    .execute(&mut *store.write_conn("heartbeat").await?)
    .await
    .map_err(Error::db("heartbeat"))?;
    Ok(done.rows_affected())
}
