//! MySQL: group limits (issue 17 item 4, [`crate::limits`]): setting, clearing and listing
//! them, and the limited share of a claim.
//!
//! The claim ([`super::claim::claim_on`]) reads the paused and limited groups first, without
//! locks. When no group is limited it is today's claim. Otherwise, in the claim's transaction:
//! a plain read finds the limited groups (not paused) with a due action; their limit rows are
//! locked `FOR UPDATE` in name order (claimers of one limited group are serialised; claimers
//! of other groups never wait on them); each one's running actions are counted (READ
//! COMMITTED: a statement after the lock sees every claim committed before it); the ordinary
//! pick (limited groups left out) and each group's first `allowance` due actions are locked
//! (`SKIP LOCKED`) and the first `limit` in claim order kept; after the claim, the starts of
//! rate-limited groups are recorded. In a finish-and-claim round the running counts see the
//! round's own finishes (same transaction).

use super::claim::pick;
use super::{from_ms, ms, opt_text, text, MySqlStore};
use crate::error::{Error, Result};
use crate::limits::{
    allowance, first_in_claim_order, limit_of, starts_per_group, validate_group, GroupLimit,
    GroupLimitInfo, LimitState, StartLog,
};
use crate::store::{ClaimRequest, ClaimedAction};
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// A group's running actions plus those finished after the claim's `now` (binds: group, now,
/// group); the second count walks the finished index from `now` on, a handful of rows.
const OCCUPIED: &str = "SELECT CAST(
   (SELECT count(*) FROM dockhand_actions WHERE group_name = ? AND status = 'running')
 + (SELECT count(*) FROM dockhand_actions FORCE INDEX (dockhand_actions_finished)
    WHERE status IN ('complete', 'failed', 'canceled') AND finished_at > ?
      AND group_name = ?) AS SIGNED)";

fn limit_state(row: &MySqlRow) -> Result<LimitState> {
    let d = || Error::db("group limits");
    let group = text(row, "group_name").map_err(d())?;
    let count: Option<i32> = row.try_get("rate_count").map_err(d())?;
    let period: Option<i64> = row.try_get("rate_period_ms").map_err(d())?;
    let log = StartLog::decode(opt_text(row, "rate_log").map_err(d())?.as_deref());
    if log.is_none() {
        tracing::warn!(group = %group, "unreadable rate record: no start until it is set again");
    }
    let max_running: Option<i32> = row.try_get("max_running").map_err(d())?;
    Ok(LimitState {
        group,
        max_running: max_running.map(i64::from),
        rate: count.map(i64::from).zip(period),
        log,
    })
}

/// `IN (?, ?, …)` of `names`.
fn push_names(qb: &mut QueryBuilder<'_, MySql>, names: &[String]) {
    qb.push(" IN (");
    let mut sep = qb.separated(", ");
    for n in names {
        sep.push_bind(n.clone());
    }
    qb.push(")");
}

/// The ids to claim (at most `req.limit`, in claim order) and the limited groups they may
/// fall in, read under their row locks.
pub(super) async fn pick_limited(
    conn: &mut MySqlConnection,
    req: &ClaimRequest<'_>,
    paused: &[String],
    limited: &[String],
) -> Result<(Vec<i64>, Vec<LimitState>)> {
    let now = ms(req.now);
    let open: Vec<String> = limited
        .iter()
        .filter(|g| !paused.contains(g))
        .cloned()
        .collect();
    let mut due: Vec<String> = Vec::new();
    if !open.is_empty() {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "SELECT l.group_name FROM dockhand_group_limits l WHERE l.group_name",
        );
        push_names(&mut qb, &open);
        qb.push(
            " AND EXISTS (SELECT 1 FROM dockhand_actions a WHERE a.group_name = l.group_name
                 AND a.status = 'pending' AND a.scheduled_at <= ",
        )
        .push_bind(now)
        .push(")");
        for r in qb
            .build()
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db("claim (group limits)"))?
        {
            due.push(text(&r, "group_name").map_err(Error::db("claim (group limits)"))?);
        }
    }
    let mut states = Vec::new();
    if !due.is_empty() {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "SELECT group_name, max_running, rate_count, rate_period_ms, rate_log
             FROM dockhand_group_limits WHERE group_name",
        );
        push_names(&mut qb, &due);
        qb.push(" ORDER BY group_name FOR UPDATE");
        for r in qb
            .build()
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db("claim (group limits)"))?
        {
            states.push(limit_state(&r)?);
        }
    }
    let mut excluded = paused.to_vec();
    excluded.extend(limited.iter().cloned());
    let mut candidates = pick(&mut *conn, req, &excluded, None, req.limit).await?;
    for state in &states {
        let occupied: i64 = sqlx::query_scalar(OCCUPIED)
            .bind(&state.group)
            .bind(now)
            .bind(&state.group)
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::db("claim (group limits)"))?;
        let share = allowance(state, occupied, now).min(req.limit);
        if share > 0 {
            candidates.extend(pick(&mut *conn, req, &[], Some(&state.group), share).await?);
        }
    }
    Ok((first_in_claim_order(candidates, req.limit), states))
}

/// Adds the claim's starts to the record of each rate-limited group it started actions of.
pub(super) async fn record_starts(
    conn: &mut MySqlConnection,
    states: &[LimitState],
    claimed: &[ClaimedAction],
    now: i64,
) -> Result<()> {
    let groups: Vec<Option<String>> = claimed.iter().map(|c| c.group.clone()).collect();
    let starts = starts_per_group(states.iter().map(|s| s.group.as_str()), &groups);
    for (state, (_, k)) in states.iter().zip(starts) {
        let (Some((count, _)), Some(log)) = (state.rate, &state.log) else {
            continue;
        };
        if k == 0 {
            continue;
        }
        let mut log = log.clone();
        log.record(now, k, count);
        sqlx::query("UPDATE dockhand_group_limits SET rate_log = ? WHERE group_name = ?")
            .bind(log.encode())
            .bind(&state.group)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("claim (rate record)"))?;
    }
    Ok(())
}

pub(super) async fn set_group_limit(
    store: &MySqlStore,
    group: &str,
    limit: &GroupLimit,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    validate_group(group)?;
    limit.validate()?;
    // One statement; MySQL reports 1 affected row for an insert, 2 for an update (0 when
    // nothing changed, which cannot happen here: set_at changes).
    let done = sqlx::query(
        "INSERT INTO dockhand_group_limits
             (group_name, max_running, rate_count, rate_period_ms, set_at, set_by)
         VALUES (?, ?, ?, ?, ?, ?)
         ON DUPLICATE KEY UPDATE max_running = VALUES(max_running),
             rate_count = VALUES(rate_count), rate_period_ms = VALUES(rate_period_ms),
             set_at = VALUES(set_at), set_by = VALUES(set_by)",
    )
    .bind(group)
    .bind(
        limit
            .concurrency
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
    )
    .bind(
        limit
            .rate
            .map(|r| i32::try_from(r.count).unwrap_or(i32::MAX)),
    )
    .bind(limit.rate.map(|r| r.period_ms()))
    .bind(ms(now))
    .bind(actor)
    .execute(store.pool())
    .await
    .map_err(Error::db("set group limit"))?;
    store.notify();
    Ok(done.rows_affected() == 1)
}

pub(super) async fn clear_group_limit(store: &MySqlStore, group: &str) -> Result<bool> {
    let done = sqlx::query(
        "DELETE FROM dockhand_group_limits
         WHERE group_name = ? AND CAST(group_name AS BINARY) = CAST(? AS BINARY)",
    )
    .bind(group)
    .bind(group)
    .execute(store.pool())
    .await
    .map_err(Error::db("clear group limit"))?;
    if done.rows_affected() > 0 {
        store.notify();
    }
    Ok(done.rows_affected() > 0)
}

pub(super) async fn group_limits(
    store: &MySqlStore,
    now: DateTime<Utc>,
) -> Result<Vec<GroupLimitInfo>> {
    let rows = sqlx::query(
        "SELECT l.group_name, l.max_running, l.rate_count, l.rate_period_ms, l.rate_log,
                l.set_at, l.set_by,
                CAST((SELECT count(*) FROM dockhand_actions a
                      WHERE a.group_name = l.group_name AND a.status = 'running') AS SIGNED)
                    AS running
         FROM dockhand_group_limits l ORDER BY l.group_name",
    )
    .fetch_all(store.pool())
    .await
    .map_err(Error::db("group limits"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("group limits");
            let state = limit_state(r)?;
            Ok(GroupLimitInfo {
                limit: limit_of(&state)?,
                recent_starts: state.recent_starts(ms(now)),
                group: state.group,
                set_at: from_ms(r.try_get("set_at").map_err(d())?),
                set_by: text(r, "set_by").map_err(d())?,
                running: r.try_get("running").map_err(d())?,
            })
        })
        .collect()
}
