//! PostgreSQL: group limits (issue 17 item 4, [`crate::limits`]): setting, clearing and
//! listing them, and the limited claim.
//!
//! The ordinary claim statement ([`super::claim`]) leaves the groups of
//! `dockhand_group_limits` out of its pick and returns whether any exist. While some do, a
//! claim takes this path. A plain read finds the limited groups with due actions; when there
//! are none, the ordinary statement runs (no lock, one more round trip). Otherwise, in one
//! transaction: lock those groups' limit rows `FOR UPDATE` in name order (claimers of one
//! limited group are serialised; claimers of other groups never wait on them), count each
//! one's running actions (READ COMMITTED: a statement after the lock sees every claim
//! committed before it), take the ordinary pick and each group's first `allowance` due
//! actions (`FOR UPDATE SKIP LOCKED`), keep the first `limit` of them in claim order, claim
//! those, record the starts of rate-limited groups, commit.

use super::claim::decode_claimed;
use super::{ts, PgStore};
use crate::error::{Error, Result};
use crate::limits::{
    allowance, first_in_claim_order, limit_of, starts_per_group, validate_group, Candidate,
    GroupLimit, GroupLimitInfo, LimitState, StartLog,
};
use crate::store::{ClaimRequest, ClaimedAction};
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::sync::atomic::Ordering;

/// Every limit, whether its group is paused and whether it has a due pending action (bind 1:
/// now). Not locking.
const LIMITS: &str = "SELECT l.group_name,
        EXISTS (SELECT 1 FROM dockhand_group_pauses p WHERE p.group_name = l.group_name)
            AS paused,
        EXISTS (SELECT 1 FROM dockhand_actions a WHERE a.group_name = l.group_name
                AND a.status = 'pending' AND a.scheduled_at <= $1) AS due
 FROM dockhand_group_limits l";

/// The limit rows of the groups a claim may take from, locked in name order (bind 1: names).
const LOCK: &str = "SELECT group_name, max_running, rate_count, rate_period_ms, rate_log
 FROM dockhand_group_limits WHERE group_name = ANY($1::text[])
 ORDER BY group_name FOR UPDATE";

/// Per group: running actions plus those finished after the claim's `now` (binds: 1 names,
/// 2 now). `recent` walks the finished index from `now` on (a handful of rows, whatever the
/// group); materialised so that the group's filter is not pushed into it, where the group's
/// index would walk every finished action of the group instead.
const OCCUPIED: &str = "WITH recent AS MATERIALIZED (
     SELECT group_name FROM dockhand_actions
     WHERE status IN ('complete', 'failed', 'canceled') AND finished_at > $2)
 SELECT g.name,
   (SELECT count(*) FROM dockhand_actions WHERE group_name = g.name AND status = 'running')
 + (SELECT count(*) FROM recent r WHERE r.group_name = g.name) AS occupied
 FROM unnest($1::text[]) AS g(name)";

/// The ordinary pick (limited and paused groups left out by `dockhand_due_ids`, 0016), locked.
const PICK: &str = "SELECT id, priority, scheduled_at FROM dockhand_actions
 WHERE id = ANY(ARRAY(SELECT dockhand_due_ids($1, $2, $3::text[], $4::text[], $5::text[])))";

/// One limited group's pick (binds as [`PICK`], 2: its allowance, 6: the group).
const PICK_GROUP: &str = "SELECT id, priority, scheduled_at FROM dockhand_actions
 WHERE status = 'pending' AND scheduled_at <= $1 AND group_name = $6
   AND ($3::text[] IS NULL OR hook = ANY($3::text[]))
   AND ($4::text[] IS NULL OR hook <> ALL($4::text[]) OR group_name = ANY($5::text[]))
 ORDER BY priority, scheduled_at, id LIMIT $2
 FOR UPDATE SKIP LOCKED";

/// Claims the chosen ids (binds: 1 now, 2 ids, 3 owner, 4 lease_until).
const CLAIM_IDS: &str = "WITH claimed AS (
     UPDATE dockhand_actions a
     SET status = 'running', lease_owner = $3, lease_token = a.lease_token + 1,
         lease_until = $4, attempt = a.attempt + 1, started_at = $1, started_by = $3,
         started_after = COALESCE(
             (SELECT MAX(l.id) FROM dockhand_action_logs l WHERE l.action_id = a.id), 0)
     WHERE a.id = ANY($2::bigint[]) AND a.status = 'pending'
     RETURNING a.*)
 SELECT id, hook, args, group_name, scheduled_at, attempt, max_attempts, timeout_ms, lease_token
 FROM claimed
 ORDER BY priority, scheduled_at, id";

fn limit_state(row: &PgRow) -> Result<LimitState> {
    let d = || Error::db("group limits");
    let group: String = row.try_get("group_name").map_err(d())?;
    let count: Option<i32> = row.try_get("rate_count").map_err(d())?;
    let period: Option<i64> = row.try_get("rate_period_ms").map_err(d())?;
    let log: Option<String> = row.try_get("rate_log").map_err(d())?;
    let log = StartLog::decode(log.as_deref());
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

/// Whether any group has limits (after an empty ordinary claim or round).
pub(super) async fn any(store: &PgStore) -> Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM dockhand_group_limits)")
        .fetch_one(&store.pool)
        .await
        .map_err(Error::db("claim (group limits)"))
}

/// The claim while limits exist.
pub(super) async fn claim_limited(
    store: &PgStore,
    req: &ClaimRequest<'_>,
) -> Result<Vec<ClaimedAction>> {
    let now = ts(req.now);
    let rows = sqlx::query(LIMITS)
        .bind(now)
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("claim (group limits)"))?;
    store.set_limits_seen(!rows.is_empty());
    let mut groups = Vec::new();
    for row in &rows {
        let d = || Error::db("claim (group limits)");
        let paused: bool = row.try_get("paused").map_err(d())?;
        let due: bool = row.try_get("due").map_err(d())?;
        if due && !paused {
            groups.push(row.try_get::<String, _>("group_name").map_err(d())?);
        }
    }
    if groups.is_empty() {
        let rows = super::claim::claim_rows(store, req).await?;
        return rows.iter().map(decode_claimed).collect();
    }
    let mut tx = store.pool.begin().await.map_err(Error::db("claim"))?;
    let claimed = claim_on(&mut tx, req, &groups).await?;
    tx.commit().await.map_err(Error::db("claim"))?;
    Ok(claimed)
}

async fn claim_on(
    conn: &mut PgConnection,
    req: &ClaimRequest<'_>,
    groups: &[String],
) -> Result<Vec<ClaimedAction>> {
    let now = ts(req.now);
    let now_ms = now.timestamp_millis();
    let locked = sqlx::query(LOCK)
        .bind(groups)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim (group limits)"))?;
    let states = locked.iter().map(limit_state).collect::<Result<Vec<_>>>()?;
    let names: Vec<&str> = states.iter().map(|s| s.group.as_str()).collect();
    let occupied: Vec<(String, i64)> = sqlx::query_as(OCCUPIED)
        .bind(&names)
        .bind(now)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim (group limits)"))?;
    let pick = |sql: &'static str, n: i64, group: Option<&str>| {
        sqlx::query(sql)
            .bind(now)
            .bind(n)
            .bind(req.hooks)
            .bind(req.routing.map(|r| r.hooks))
            .bind(req.routing.map(|r| r.groups))
            .bind(group.map(str::to_owned))
    };
    let mut candidates = candidates_of(pick(PICK, req.limit, None).fetch_all(&mut *conn).await)?;
    for state in &states {
        let busy = occupied
            .iter()
            .find(|(g, _)| *g == state.group)
            .map_or(0, |(_, n)| *n);
        let share = allowance(state, busy, now_ms).min(req.limit);
        if share > 0 {
            let rows = pick(PICK_GROUP, share, Some(&state.group))
                .fetch_all(&mut *conn)
                .await;
            candidates.extend(candidates_of(rows)?);
        }
    }
    let ids = first_in_claim_order(candidates, req.limit);
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(CLAIM_IDS)
        .bind(now)
        .bind(&ids)
        .bind(req.owner)
        .bind(ts(req.lease_until))
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim"))?;
    let claimed = rows
        .iter()
        .map(decode_claimed)
        .collect::<Result<Vec<_>>>()?;
    record_starts(conn, &states, &claimed, now_ms).await?;
    Ok(claimed)
}

fn candidates_of(rows: std::result::Result<Vec<PgRow>, sqlx::Error>) -> Result<Vec<Candidate>> {
    let d = || Error::db("claim (pick)");
    rows.map_err(d())?
        .iter()
        .map(|r| {
            let at: DateTime<Utc> = r.try_get("scheduled_at").map_err(d())?;
            Ok(Candidate {
                id: r.try_get("id").map_err(d())?,
                priority: r.try_get("priority").map_err(d())?,
                scheduled_at: at.timestamp_micros(),
            })
        })
        .collect()
}

/// Adds the claim's starts to the record of each rate-limited group it started actions of.
async fn record_starts(
    conn: &mut PgConnection,
    states: &[LimitState],
    claimed: &[ClaimedAction],
    now_ms: i64,
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
        log.record(now_ms, k, count);
        sqlx::query("UPDATE dockhand_group_limits SET rate_log = $1 WHERE group_name = $2")
            .bind(log.encode())
            .bind(&state.group)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("claim (rate record)"))?;
    }
    Ok(())
}

pub(super) async fn set_group_limit(
    store: &PgStore,
    group: &str,
    limit: &GroupLimit,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    validate_group(group)?;
    limit.validate()?;
    // Raising a limit may release waiting actions: wake the runners of every process.
    let inserted: bool = sqlx::query_scalar(
        "WITH up AS (
             INSERT INTO dockhand_group_limits
                 (group_name, max_running, rate_count, rate_period_ms, set_at, set_by)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (group_name) DO UPDATE SET max_running = excluded.max_running,
                 rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms,
                 set_at = excluded.set_at, set_by = excluded.set_by
             RETURNING (xmax = 0) AS inserted)
         SELECT inserted FROM up, pg_notify($7, '') AS n",
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
    .bind(ts(now))
    .bind(actor)
    .bind(store.channel.as_str())
    .fetch_one(&store.pool)
    .await
    .map_err(Error::db("set group limit"))?;
    store.set_limits_seen(true);
    store.notify();
    Ok(inserted)
}

pub(super) async fn clear_group_limit(store: &PgStore, group: &str) -> Result<bool> {
    let done = sqlx::query(
        "WITH gone AS (DELETE FROM dockhand_group_limits WHERE group_name = $1 RETURNING 1)
         SELECT 1 FROM gone, pg_notify($2, '') AS n",
    )
    .bind(group)
    .bind(store.channel.as_str())
    .execute(&store.pool)
    .await
    .map_err(Error::db("clear group limit"))?;
    if done.rows_affected() > 0 {
        store.notify();
    }
    Ok(done.rows_affected() > 0)
}

pub(super) async fn group_limits(
    store: &PgStore,
    now: DateTime<Utc>,
) -> Result<Vec<GroupLimitInfo>> {
    let rows = sqlx::query(
        "SELECT l.group_name, l.max_running, l.rate_count, l.rate_period_ms, l.rate_log,
                l.set_at, l.set_by,
                (SELECT count(*) FROM dockhand_actions a
                 WHERE a.group_name = l.group_name AND a.status = 'running') AS running
         FROM dockhand_group_limits l ORDER BY l.group_name",
    )
    .fetch_all(&store.pool)
    .await
    .map_err(Error::db("group limits"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("group limits");
            let state = limit_state(r)?;
            Ok(GroupLimitInfo {
                limit: limit_of(&state)?,
                recent_starts: state.recent_starts(ts(now).timestamp_millis()),
                group: state.group,
                set_at: r.try_get("set_at").map_err(d())?,
                set_by: r.try_get("set_by").map_err(d())?,
                running: r.try_get("running").map_err(d())?,
            })
        })
        .collect()
}

impl PgStore {
    /// Records whether the last claim saw group limits.
    pub(super) fn set_limits_seen(&self, seen: bool) {
        self.limits_seen.store(seen, Ordering::Relaxed);
    }

    /// Whether claims take the limited path.
    pub(super) fn limits_seen(&self) -> bool {
        self.limits_seen.load(Ordering::Relaxed)
    }
}
