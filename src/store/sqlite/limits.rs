//! SQLite: group limits (issue 17 item 4, [`crate::limits`]): setting, clearing and listing
//! them, and the limited claim.
//!
//! The ordinary claim statement ([`super::claim`]) leaves the groups of
//! `dockhand_group_limits` out of its pick and returns whether any exist. While some do, a
//! claim takes this path, in one `BEGIN IMMEDIATE` transaction (SQLite's single writer
//! serialises every claimer, so no row lock is needed): read the limits, count each due
//! limited group's running actions, take the ordinary pick and each limited group's first
//! `allowance` due actions, keep the first `limit` of them in claim order, claim those, and
//! record the starts of rate-limited groups. Times are milliseconds, as stored.

use super::claim::{claim_started_sql, decode_claimed, filter_json};
use super::{from_ms, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::limits::{
    allowance, first_in_claim_order, limit_of, starts_per_group, validate_group, Candidate,
    GroupLimit, GroupLimitInfo, LimitState, StartLog,
};
use crate::store::{ClaimRequest, ClaimedAction};
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

/// The claim filters of [`super::claim`] (binds: 1 now, 2 hooks, 3 routed hooks, 4 their
/// groups; JSON arrays or NULL).
macro_rules! pick_filter {
    () => {
        "status = 'pending' AND scheduled_at <= ?1
       AND (?2 IS NULL OR hook IN (SELECT value FROM json_each(?2)))
       AND (?3 IS NULL OR hook NOT IN (SELECT value FROM json_each(?3))
            OR group_name IN (SELECT value FROM json_each(?4)))"
    };
}

/// The ordinary pick: paused and limited groups left out (bind 5: limit).
const PICK: &str = concat!(
    "SELECT id, priority, scheduled_at FROM dockhand_actions WHERE ",
    pick_filter!(),
    " AND (group_name IS NULL OR group_name NOT IN
           (SELECT group_name FROM dockhand_group_pauses
            UNION ALL SELECT group_name FROM dockhand_group_limits))
     ORDER BY priority, scheduled_at, id LIMIT ?5"
);

/// One limited group's pick (binds 5: its allowance, 6: the group).
const PICK_GROUP: &str = concat!(
    "SELECT id, priority, scheduled_at FROM dockhand_actions WHERE ",
    pick_filter!(),
    " AND group_name = ?6 ORDER BY priority, scheduled_at, id LIMIT ?5"
);

/// Every limit, whether its group is paused and whether it has a due pending action (bind 1:
/// now).
const LIMITS: &str = "SELECT l.group_name, l.max_running, l.rate_count, l.rate_period_ms,
        l.rate_log,
        l.group_name IN (SELECT group_name FROM dockhand_group_pauses) AS paused,
        EXISTS (SELECT 1 FROM dockhand_actions a WHERE a.group_name = l.group_name
                AND a.status = 'pending' AND a.scheduled_at <= ?1) AS due
 FROM dockhand_group_limits l ORDER BY l.group_name";

/// A group's running actions plus those finished after the claim's `now` (binds: 1 group,
/// 2 now); the second count walks the finished index from `now` on, a handful of rows.
const OCCUPIED: &str = "SELECT
   (SELECT count(*) FROM dockhand_actions WHERE group_name = ?1 AND status = 'running')
 + (SELECT count(*) FROM dockhand_actions INDEXED BY dockhand_actions_finished_by_status
    WHERE status IN ('complete', 'failed', 'canceled') AND finished_at > ?2
      AND group_name = ?1)";

/// Claims the chosen ids (binds: 1 owner, 2 lease_until, 3 now, 4 ids as JSON), recording
/// each attempt's `started` entry in its row as every claim does.
const CLAIM_IDS: &str = concat!(
    "UPDATE dockhand_actions
 SET status = 'running', lease_owner = ?1, lease_token = lease_token + 1, lease_until = ?2,
     attempt = attempt + 1, ",
    claim_started_sql!(),
    "
 WHERE status = 'pending' AND id IN (SELECT value FROM json_each(?4))
 RETURNING id, hook, args, group_name, scheduled_at, attempt, max_attempts, timeout_ms,
           lease_token, priority"
);

fn limit_state(row: &SqliteRow) -> Result<LimitState> {
    let d = || Error::db("group limits");
    let group: String = row.try_get("group_name").map_err(d())?;
    let count: Option<i64> = row.try_get("rate_count").map_err(d())?;
    let period: Option<i64> = row.try_get("rate_period_ms").map_err(d())?;
    let log: Option<String> = row.try_get("rate_log").map_err(d())?;
    let log = StartLog::decode(log.as_deref());
    if log.is_none() {
        tracing::warn!(group = %group, "unreadable rate record: no start until it is set again");
    }
    Ok(LimitState {
        group,
        max_running: row.try_get("max_running").map_err(d())?,
        rate: count.zip(period),
        log,
    })
}

/// Whether any group has limits (the reader; after an empty ordinary claim).
pub(super) async fn any(store: &SqliteStore) -> Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM dockhand_group_limits)")
        .fetch_one(&store.reader)
        .await
        .map_err(Error::db("claim (group limits)"))
}

/// The claim while limits exist: one write transaction.
pub(super) async fn claim_limited(
    store: &SqliteStore,
    req: &ClaimRequest<'_>,
) -> Result<Vec<ClaimedAction>> {
    let mut tx = store.begin_write("claim").await?;
    let (claimed, limited) = claim_on(&mut tx, req).await?;
    tx.commit().await.map_err(Error::db("claim"))?;
    store.set_limits_seen(limited);
    Ok(claimed)
}

/// The limited claim in the caller's write transaction; also whether any limits exist.
async fn claim_on(
    conn: &mut SqliteConnection,
    req: &ClaimRequest<'_>,
) -> Result<(Vec<ClaimedAction>, bool)> {
    let now = ms(req.now);
    let rows = sqlx::query(LIMITS)
        .bind(now)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim (group limits)"))?;
    let limited = !rows.is_empty();
    let mut states = Vec::new();
    for row in &rows {
        let d = || Error::db("claim (group limits)");
        let paused: bool = row.try_get("paused").map_err(d())?;
        let due: bool = row.try_get("due").map_err(d())?;
        if due && !paused {
            states.push(limit_state(row)?);
        }
    }
    let [hooks, routed_hooks, routed_groups] = filter_json(req)?;
    let pick = |sql: &'static str, n: i64, group: Option<&str>| {
        sqlx::query(sql)
            .bind(now)
            .bind(hooks.clone())
            .bind(routed_hooks.clone())
            .bind(routed_groups.clone())
            .bind(n)
            .bind(group.map(str::to_owned))
    };
    let mut candidates = candidates_of(pick(PICK, req.limit, None).fetch_all(&mut *conn).await)?;
    for state in &states {
        let occupied: i64 = sqlx::query_scalar(OCCUPIED)
            .bind(&state.group)
            .bind(now)
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::db("claim (group limits)"))?;
        let share = allowance(state, occupied, now).min(req.limit);
        if share > 0 {
            let rows = pick(PICK_GROUP, share, Some(&state.group))
                .fetch_all(&mut *conn)
                .await;
            candidates.extend(candidates_of(rows)?);
        }
    }
    let ids = first_in_claim_order(candidates, req.limit);
    if ids.is_empty() {
        return Ok((Vec::new(), limited));
    }
    let ids_json = serde_json::to_string(&ids).map_err(|e| Error::invalid("ids", e.to_string()))?;
    let rows = sqlx::query(CLAIM_IDS)
        .bind(req.owner)
        .bind(ms(req.lease_until))
        .bind(now)
        .bind(ids_json)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim"))?;
    let claimed = decode_claimed(rows)?;
    record_starts(conn, &states, &claimed, now).await?;
    Ok((claimed, limited))
}

fn candidates_of(rows: std::result::Result<Vec<SqliteRow>, sqlx::Error>) -> Result<Vec<Candidate>> {
    let d = || Error::db("claim (pick)");
    rows.map_err(d())?
        .iter()
        .map(|r| {
            Ok(Candidate {
                id: r.try_get("id").map_err(d())?,
                priority: r.try_get("priority").map_err(d())?,
                scheduled_at: r.try_get("scheduled_at").map_err(d())?,
            })
        })
        .collect()
}

/// Adds the claim's starts to the record of each rate-limited group it started actions of.
async fn record_starts(
    conn: &mut SqliteConnection,
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
        sqlx::query("UPDATE dockhand_group_limits SET rate_log = ?1 WHERE group_name = ?2")
            .bind(log.encode())
            .bind(&state.group)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("claim (rate record)"))?;
    }
    Ok(())
}

pub(super) async fn set_group_limit(
    store: &SqliteStore,
    group: &str,
    limit: &GroupLimit,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    validate_group(group)?;
    limit.validate()?;
    let mut tx = store.begin_write("set group limit").await?;
    let existed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM dockhand_group_limits WHERE group_name = ?)",
    )
    .bind(group)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db("set group limit"))?;
    sqlx::query(
        "INSERT INTO dockhand_group_limits
             (group_name, max_running, rate_count, rate_period_ms, set_at, set_by)
         VALUES (?, ?, ?, ?, ?, ?)
         ON CONFLICT (group_name) DO UPDATE SET max_running = excluded.max_running,
             rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms,
             set_at = excluded.set_at, set_by = excluded.set_by",
    )
    .bind(group)
    .bind(limit.concurrency.map(i64::from))
    .bind(limit.rate.map(|r| i64::from(r.count)))
    .bind(limit.rate.map(|r| r.period_ms()))
    .bind(ms(now))
    .bind(actor)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("set group limit"))?;
    tx.commit().await.map_err(Error::db("set group limit"))?;
    store.set_limits_seen(true);
    store.notify();
    Ok(!existed)
}

pub(super) async fn clear_group_limit(store: &SqliteStore, group: &str) -> Result<bool> {
    let done = sqlx::query("DELETE FROM dockhand_group_limits WHERE group_name = ?")
        .bind(group)
        .execute(&mut *store.write_conn("clear group limit").await?)
        .await
        .map_err(Error::db("clear group limit"))?;
    if done.rows_affected() > 0 {
        store.notify();
    }
    Ok(done.rows_affected() > 0)
}

pub(super) async fn group_limits(
    store: &SqliteStore,
    now: DateTime<Utc>,
) -> Result<Vec<GroupLimitInfo>> {
    let rows = sqlx::query(
        "SELECT l.group_name, l.max_running, l.rate_count, l.rate_period_ms, l.rate_log,
                l.set_at, l.set_by,
                (SELECT count(*) FROM dockhand_actions a
                 WHERE a.group_name = l.group_name AND a.status = 'running') AS running
         FROM dockhand_group_limits l ORDER BY l.group_name",
    )
    .fetch_all(&store.reader)
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
                set_by: r.try_get("set_by").map_err(d())?,
                running: r.try_get("running").map_err(d())?,
            })
        })
        .collect()
}

impl SqliteStore {
    /// Records whether the last claim saw group limits.
    pub(super) fn set_limits_seen(&self, seen: bool) {
        self.limits_seen
            .store(seen, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether claims take the limited path.
    pub(super) fn limits_seen(&self) -> bool {
        self.limits_seen.load(std::sync::atomic::Ordering::Relaxed)
    }
}
