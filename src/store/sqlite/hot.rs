//! SQLite: the runner's hot path on the enqueue connection (see `direct`): a claim, a batch of
//! completions, and a round of both.
//!
//! Where a write runs ([`inline_first`]): after a claim that came back short (a shallow
//! queue, where an action's latency counts), inline, two thread wake-ups shorter (W3 p50
//! 0.37 → 0.25 ms, session 22), unless the file's write lock is taken; after a full one (a
//! deep queue, where throughput counts), on the connection's thread, which then works beside
//! the runtime's threads (W2 +35 % over sqlx; inline, SQLite's work ran on the runtime's
//! threads and W2 fell 25 %).
//!
//! The statements are those of `claim` and `finish` (one text per statement; only the driver
//! that runs them differs). Every function here runs on an open transaction or is a single
//! statement; the callers (`claim::claim`, `finish::finish_many`, `round::finish_and_claim`)
//! keep the decisions (limited groups, outcomes other than completions) and the sqlx path of
//! in-memory databases.

use super::claim::{claim_sql, claim_started_sql, filter_json};
use super::direct::{db_error, Connection};
use super::finish::{complete_set_sql, lost_completions};
use super::{from_ms, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::store::{ClaimRequest, ClaimedAction, Finish, FinishResult, Lease};
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

const CLAIM: &str = claim_sql!();
const COMPLETE_SET: &str = complete_set_sql!("?1", "?2");

/// The `lease_lost` log rows of completions that found their lease gone (binds: 1 the time,
/// 2 a JSON array of `[id, detail]`).
pub(super) const LOG_LOST: &str = "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
 SELECT a.id, ?1, 'lease_lost', json_extract(l.value, '$[1]')
 FROM json_each(?2) AS l
 JOIN dockhand_actions a ON a.id = json_extract(l.value, '$[0]')";

/// A claim's binds, owned (a claim that found the write lock taken runs on the connection's
/// thread).
#[derive(Debug, Clone)]
pub(super) struct ClaimArgs {
    owner: String,
    lease_until: i64,
    now: i64,
    limit: i64,
    filters: [Option<String>; 3],
}

impl ClaimArgs {
    pub(super) fn new(req: &ClaimRequest<'_>) -> Result<Self> {
        Ok(Self {
            owner: req.owner.to_owned(),
            lease_until: ms(req.lease_until),
            now: ms(req.now),
            limit: req.limit,
            filters: filter_json(req)?,
        })
    }
}

/// What a claim took: the actions in claim order, and whether group limits exist (`None`:
/// nothing was claimed, so the statement could not say).
#[derive(Debug, Default)]
pub(super) struct Claimed {
    pub(super) actions: Vec<ClaimedAction>,
    pub(super) limited: Option<bool>,
}

/// The claim statement of `claim` (Q3: one UPDATE over the ordered partial claim index).
pub(super) fn claim(conn: &Connection, a: &ClaimArgs) -> Result<Claimed> {
    let op = "claim";
    let mut st = conn.prepare_cached(CLAIM).map_err(db_error(op))?;
    let mut rows = st
        .query(rusqlite::params![
            a.owner,
            a.lease_until,
            a.now,
            a.limit,
            a.filters[0],
            a.filters[1],
            a.filters[2],
        ])
        .map_err(db_error(op))?;
    let mut claimed = Vec::new();
    let mut limited = None;
    while let Some(row) = rows.next().map_err(db_error(op))? {
        let get = |e| db_error(op)(e);
        limited = Some(row.get::<_, bool>("limited").map_err(get)?);
        let id: i64 = row.get("id").map_err(get)?;
        let args_text: String = row.get("args").map_err(get)?;
        let args = serde_json::from_str(&args_text).map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: format!("args: {e}"),
        })?;
        let priority: i32 = row.get("priority").map_err(get)?;
        let action = ClaimedAction {
            id,
            hook: row.get("hook").map_err(get)?,
            args,
            group: row.get("group_name").map_err(get)?,
            scheduled_at: from_ms(row.get("scheduled_at").map_err(get)?),
            attempt: row.get("attempt").map_err(get)?,
            max_attempts: row.get("max_attempts").map_err(get)?,
            timeout_ms: row.get("timeout_ms").map_err(get)?,
            token: row.get("lease_token").map_err(get)?,
        };
        claimed.push((priority, action));
    }
    // RETURNING follows the update's row order, not the pick's.
    claimed.sort_by_key(|(priority, a)| (*priority, a.scheduled_at, a.id));
    Ok(Claimed {
        actions: claimed.into_iter().map(|(_, a)| a).collect(),
        limited,
    })
}

/// Completions to write: the `[id, token]` pairs, and as the JSON the statement binds. Owned,
/// like [`ClaimArgs`].
#[derive(Debug, Clone)]
pub(super) struct Completions {
    leases: Vec<[i64; 2]>,
    pairs: String,
    now: i64,
}

impl Completions {
    /// `items`, all completions.
    pub(super) fn new(items: &[(Lease, Finish)], now: DateTime<Utc>) -> Result<Self> {
        let leases: Vec<[i64; 2]> = items.iter().map(|(l, _)| [l.id, l.token]).collect();
        Ok(Self {
            pairs: serde_json::to_string(&leases)
                .map_err(|e| Error::invalid("leases", e.to_string()))?,
            leases,
            now: ms(now),
        })
    }
}

/// The completions, each guarded by id + token + status, and a `lease_lost` log row for each
/// that was not applied; one result per item, in order.
pub(super) fn complete(conn: &Connection, c: &Completions) -> Result<Vec<FinishResult>> {
    let op = "finish_many";
    let applied = conn
        .prepare_cached(COMPLETE_SET)
        .and_then(|mut st| {
            st.query_map(rusqlite::params![c.now, c.pairs], |r| r.get::<_, i64>(0))?
                .collect::<rusqlite::Result<HashSet<i64>>>()
        })
        .map_err(db_error(op))?;
    let (results, lost) = lost_completions(c.leases.iter().copied(), &applied);
    if !lost.is_empty() {
        let lost_json =
            serde_json::to_string(&lost).map_err(|e| Error::invalid("leases", e.to_string()))?;
        conn.prepare_cached(LOG_LOST)
            .and_then(|mut st| st.execute(rusqlite::params![c.now, lost_json]))
            .map_err(db_error("finish_many (lease lost)"))?;
    }
    Ok(results)
}

/// [`complete`] then [`claim`], on one transaction (the caller's, inline; its own, on the
/// connection's thread).
pub(super) fn round(
    conn: &Connection,
    c: &Completions,
    a: &ClaimArgs,
) -> Result<(Vec<FinishResult>, Claimed)> {
    let finished = complete(conn, c)?;
    let claimed = claim(conn, a)?;
    Ok((finished, claimed))
}

/// Whether a hot-path write tries inline first: the last claim came back short (see the
/// module docs).
pub(super) fn inline_first(store: &SqliteStore) -> bool {
    store.queue_shallow.load(Ordering::Relaxed)
}

/// Records whether a claim that asked for `limit` actions came back short.
pub(super) fn claimed(store: &SqliteStore, limit: i64, claimed: &Claimed) {
    let short = (claimed.actions.len() as i64) < limit;
    store.queue_shallow.store(short, Ordering::Relaxed);
}

/// Runs `write` in a `BEGIN IMMEDIATE` transaction on the connection's thread (the inline
/// attempt opens its own; see `direct`).
pub(super) fn in_tx<R>(
    conn: &mut Connection,
    op: &'static str,
    write: impl FnOnce(&Connection) -> Result<R>,
) -> Result<R> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(db_error(op))?;
    let r = write(&tx)?;
    tx.commit().map_err(db_error(op))?;
    Ok(r)
}
