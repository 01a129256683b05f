//! SQLite: reading actions (query, get, logs, stats, next run) and unscheduling by filter.

use super::{from_ms, ms, SqliteStore};
use crate::action::{encode_args, Action, ActionFilter, ActionLog, ActionOrder, ActionQuery};
use crate::error::{Error, Result};
use crate::state::ActionStatus;
use crate::store::operator::job_owned_hooks;
use crate::store::QueueStats;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite};

const COLUMNS: &str = "id, hook, args, group_name, priority, status, scheduled_at, attempt,
    max_attempts, timeout_ms, unique_key, lease_owner, lease_token, lease_until, created_at,
    finished_at, last_error, schedule_id";

fn action_from_row(row: &SqliteRow) -> Result<Action> {
    let get = Error::db("decode action");
    let id: i64 = row.try_get("id").map_err(Error::db("decode action"))?;
    let corrupt = |m: String| Error::Corrupt {
        what: "action",
        id,
        message: m,
    };
    let args: String = row.try_get("args").map_err(Error::db("decode action"))?;
    let status: String = row.try_get("status").map_err(Error::db("decode action"))?;
    let opt_time = |c: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row
            .try_get::<Option<i64>, _>(c)
            .map_err(Error::db("decode action"))?
            .map(from_ms))
    };
    Ok(Action {
        id,
        hook: row.try_get("hook").map_err(Error::db("decode action"))?,
        args: serde_json::from_str(&args).map_err(|e| corrupt(format!("args: {e}")))?,
        group: row
            .try_get("group_name")
            .map_err(Error::db("decode action"))?,
        priority: row
            .try_get("priority")
            .map_err(Error::db("decode action"))?,
        status: status
            .parse::<ActionStatus>()
            .map_err(|e| corrupt(e.to_string()))?,
        scheduled_at: from_ms(
            row.try_get("scheduled_at")
                .map_err(Error::db("decode action"))?,
        ),
        attempt: row.try_get("attempt").map_err(Error::db("decode action"))?,
        max_attempts: row
            .try_get("max_attempts")
            .map_err(Error::db("decode action"))?,
        timeout_ms: row
            .try_get("timeout_ms")
            .map_err(Error::db("decode action"))?,
        unique_key: row
            .try_get("unique_key")
            .map_err(Error::db("decode action"))?,
        lease_owner: row
            .try_get("lease_owner")
            .map_err(Error::db("decode action"))?,
        lease_token: row
            .try_get("lease_token")
            .map_err(Error::db("decode action"))?,
        lease_until: opt_time("lease_until")?,
        created_at: from_ms(row.try_get("created_at").map_err(get)?),
        finished_at: opt_time("finished_at")?,
        last_error: row
            .try_get("last_error")
            .map_err(Error::db("decode action"))?,
        schedule_id: row
            .try_get("schedule_id")
            .map_err(Error::db("decode action"))?,
    })
}

/// Which actions a statement reads, for [`push_hook`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Reads {
    /// Only pending actions.
    Pending,
    /// Only running actions.
    Running,
    /// Pending and running actions.
    Active,
    /// Any status (or not the actions table).
    Any,
}

impl Reads {
    /// What a statement over `statuses` (none: any status) reads.
    pub(super) fn of(statuses: &[ActionStatus]) -> Self {
        let all = |f: fn(&ActionStatus) -> bool| !statuses.is_empty() && statuses.iter().all(f);
        if all(|s| *s == ActionStatus::Pending) {
            Self::Pending
        } else if all(|s| *s == ActionStatus::Running) {
            Self::Running
        } else if all(|s| matches!(s, ActionStatus::Pending | ActionStatus::Running)) {
            Self::Active
        } else {
            Self::Any
        }
    }
}

/// Appends ` AND hook = ?`, with the status condition of the partial index that serves it
/// (redundant with the statement's own, which is bound: SQLite uses a partial index only for a
/// query that names its condition). Pending actions by hook walk `dockhand_actions_hook_pending`
/// (migration 0019); running ones `dockhand_actions_lease` (running actions only, at most the
/// slots at work); both, the two of them (ids from each, then looked up by id).
pub(super) fn push_hook(qb: &mut QueryBuilder<'static, Sqlite>, hook: &str, reads: Reads) {
    match reads {
        Reads::Pending => {
            qb.push(" AND hook = ")
                .push_bind(hook.to_string())
                .push(" AND status = 'pending'");
        }
        Reads::Running => {
            qb.push(" AND hook = ")
                .push_bind(hook.to_string())
                .push(" AND status = 'running'");
        }
        Reads::Active => {
            qb.push(
                " AND id IN (SELECT id FROM dockhand_actions WHERE status = 'pending' AND hook = ",
            )
            .push_bind(hook.to_string())
            .push(" UNION ALL SELECT id FROM dockhand_actions WHERE status = 'running' AND hook = ")
            .push_bind(hook.to_string())
            .push(")");
        }
        Reads::Any => {
            qb.push(" AND hook = ").push_bind(hook.to_string());
        }
    }
}

/// Appends ` AND …` conditions for a hook/args/group filter.
fn push_filter(
    qb: &mut QueryBuilder<'static, Sqlite>,
    f: &ActionFilter,
    reads: Reads,
) -> Result<()> {
    if let Some(h) = &f.hook {
        push_hook(qb, h, reads);
    }
    if let Some(a) = &f.args {
        qb.push(" AND args = ").push_bind(encode_args(a)?);
    }
    if let Some(g) = &f.group {
        qb.push(" AND group_name = ").push_bind(g.clone());
    }
    Ok(())
}

pub(super) async fn query(store: &SqliteStore, q: &ActionQuery) -> Result<Vec<Action>> {
    let rows = query_sql(q)?
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("query"))?;
    rows.iter().map(action_from_row).collect()
}

/// The statement of [`query`].
pub(super) fn query_sql(q: &ActionQuery) -> Result<QueryBuilder<'static, Sqlite>> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT {COLUMNS} FROM dockhand_actions WHERE 1 = 1"
    ));
    push_filter(&mut qb, &q.filter, Reads::of(&q.statuses))?;
    if !q.statuses.is_empty() {
        qb.push(" AND status IN (");
        let mut sep = qb.separated(", ");
        for s in &q.statuses {
            sep.push_bind(s.as_str());
        }
        qb.push(")");
    }
    for (col, op, t) in [
        ("scheduled_at", ">=", q.scheduled_from),
        ("scheduled_at", "<", q.scheduled_to),
        ("created_at", ">=", q.created_from),
        ("created_at", "<", q.created_to),
    ] {
        if let Some(t) = t {
            qb.push(format!(" AND {col} {op} ")).push_bind(ms(t));
        }
    }
    match q.claimed {
        Some(true) => {
            qb.push(" AND lease_owner IS NOT NULL");
        }
        Some(false) => {
            qb.push(" AND lease_owner IS NULL");
        }
        None => {}
    }
    qb.push(match q.order {
        ActionOrder::ScheduledAsc => " ORDER BY scheduled_at, id",
        ActionOrder::ScheduledDesc => " ORDER BY scheduled_at DESC, id DESC",
        ActionOrder::IdAsc => " ORDER BY id",
        ActionOrder::IdDesc => " ORDER BY id DESC",
    });
    qb.push(" LIMIT ")
        .push_bind(q.limit.max(0))
        .push(" OFFSET ")
        .push_bind(q.offset.max(0));
    Ok(qb)
}

pub(super) async fn get(store: &SqliteStore, id: i64) -> Result<Option<Action>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM dockhand_actions WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(&store.reader)
    .await
    .map_err(Error::db("get"))?;
    row.as_ref().map(action_from_row).transpose()
}

/// An action's log entries that are read from its row, not stored: `created` at `created_at`
/// (first; migration 0017), the latest attempt's `started` at `started_at` by `started_by`
/// right after the stored rows it found (`started_after`, migration 0020), and for a
/// completed action `completed` at `finished_at`, placed before the first stored entry of its
/// attempt that is not older than it (a stale owner's refused finish). `created` and
/// `completed` are left out where an action from before 0017 has them stored, `started` where
/// one claimed before 0020 does (`started_by` is NULL). Columns `k` (sort key), `t` (tie
/// break), `action_id`, `at`, `event`, `detail`; `?1` is the action id. Stored rows sort by
/// [`STORED_LOG_KEY`], then id.
pub(super) const LOG_FROM_ROW: &str = "
    SELECT -1.0 AS k, 0 AS t, id AS action_id, created_at AS at, 'created' AS event,
           NULL AS detail
    FROM dockhand_actions
    WHERE id = ?1
      AND (SELECT event FROM dockhand_action_logs
           WHERE action_id = ?1 ORDER BY id LIMIT 1) IS NOT 'created'
    UNION ALL
    SELECT started_after + 0.25, 9.0e18, id, started_at, 'started', started_by
    FROM dockhand_actions
    WHERE id = ?1 AND started_by IS NOT NULL
    UNION ALL
    SELECT COALESCE((SELECT MIN(l.id) FROM dockhand_action_logs l
                     WHERE l.action_id = ?1 AND l.at >= a.finished_at AND l.sort_key IS NULL
                       AND l.id > COALESCE(a.started_after,
                                           (SELECT MAX(s.id) FROM dockhand_action_logs s
                                            WHERE s.action_id = ?1 AND s.event = 'started'),
                                           0)), 9.0e18) - 0.5,
           9.0e18, a.id, a.finished_at, 'completed', NULL
    FROM dockhand_actions a
    WHERE a.id = ?1 AND a.status = 'complete'
      AND NOT EXISTS (SELECT 1 FROM dockhand_action_logs l
                      WHERE l.action_id = ?1 AND l.event = 'completed')";

/// A stored log row's sort key: its id, or for an attempt's `started` entry stored when the
/// action was claimed again (migration 0020) the key the row-derived entry had.
pub(super) const STORED_LOG_KEY: &str = "COALESCE(sort_key, id)";

pub(super) async fn logs(store: &SqliteStore, id: i64) -> Result<Vec<ActionLog>> {
    let sql = format!(
        "SELECT action_id, at, event, detail FROM ({LOG_FROM_ROW}
             UNION ALL
             SELECT {STORED_LOG_KEY}, id, action_id, at, event, detail
             FROM dockhand_action_logs
             WHERE action_id = ?1
         ) AS merged ORDER BY k, t"
    );
    let rows = sqlx::query(&sql)
        .bind(id)
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("logs"))?;
    rows.iter()
        .map(|r| {
            Ok(ActionLog {
                action_id: r.try_get("action_id").map_err(Error::db("logs"))?,
                at: from_ms(r.try_get("at").map_err(Error::db("logs"))?),
                event: r.try_get("event").map_err(Error::db("logs"))?,
                detail: r.try_get("detail").map_err(Error::db("logs"))?,
            })
        })
        .collect()
}

pub(super) async fn stats(store: &SqliteStore, now: DateTime<Utc>) -> Result<QueueStats> {
    let rows = sqlx::query(
        "SELECT COALESCE(group_name, '') AS g, status, COUNT(*) AS n
         FROM dockhand_actions GROUP BY g, status",
    )
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db("stats"))?;
    let mut stats = QueueStats::default();
    for r in rows {
        let g: String = r.try_get("g").map_err(Error::db("stats"))?;
        let s: String = r.try_get("status").map_err(Error::db("stats"))?;
        let n: i64 = r.try_get("n").map_err(Error::db("stats"))?;
        *stats.by_status.entry(s.clone()).or_default() += n;
        *stats.by_group.entry(g).or_default().entry(s).or_default() += n;
    }
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, MIN(scheduled_at) AS oldest FROM dockhand_actions
         WHERE status = 'pending' AND scheduled_at <= ?",
    )
    .bind(ms(now))
    .fetch_one(&store.reader)
    .await
    .map_err(Error::db("stats"))?;
    stats.past_due = row.try_get("n").map_err(Error::db("stats"))?;
    let oldest: Option<i64> = row.try_get("oldest").map_err(Error::db("stats"))?;
    stats.oldest_due_lag_ms = oldest.map(|o| ms(now) - o);
    Ok(stats)
}

pub(super) async fn next_scheduled(
    store: &SqliteStore,
    f: &ActionFilter,
) -> Result<Option<DateTime<Utc>>> {
    let t: Option<i64> = next_scheduled_sql(f)?
        .build_query_scalar()
        .fetch_one(&store.reader)
        .await
        .map_err(Error::db("next_scheduled"))?;
    Ok(t.map(from_ms))
}

/// The statement of [`next_scheduled`].
pub(super) fn next_scheduled_sql(f: &ActionFilter) -> Result<QueryBuilder<'static, Sqlite>> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
        "SELECT MIN(t) FROM (SELECT MIN(scheduled_at) AS t FROM dockhand_actions
         WHERE status = 'pending'",
    );
    push_filter(&mut qb, f, Reads::Pending)?;
    qb.push(
        " UNION ALL SELECT MIN(next_run_at) AS t FROM dockhand_schedules
         WHERE enabled = 1 AND next_run_at IS NOT NULL",
    );
    push_filter(&mut qb, f, Reads::Any)?;
    qb.push(")");
    Ok(qb)
}

pub(super) async fn unschedule(
    store: &SqliteStore,
    f: &ActionFilter,
    now: DateTime<Utc>,
) -> Result<u64> {
    let mut tx = store.begin_write("unschedule").await?;
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
        "UPDATE dockhand_schedules SET enabled = 0, next_run_at = NULL, updated_at = ",
    );
    qb.push_bind(ms(now)).push(" WHERE 1 = 1");
    push_filter(&mut qb, f, Reads::Any)?;
    qb.build()
        .execute(&mut *tx)
        .await
        .map_err(Error::db("unschedule (schedules)"))?;
    let mut qb: QueryBuilder<Sqlite> =
        QueryBuilder::new("UPDATE dockhand_actions SET status = 'canceled', finished_at = ");
    qb.push_bind(ms(now)).push(concat!(
        " WHERE status = 'pending' AND hook NOT IN ",
        job_owned_hooks!()
    ));
    push_filter(&mut qb, f, Reads::Pending)?;
    qb.push(" RETURNING id");
    let ids: Vec<i64> = qb
        .build_query_scalar()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("unschedule"))?;
    let ids_json = serde_json::to_string(&ids).map_err(|e| Error::invalid("ids", e.to_string()))?;
    sqlx::query(
        "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
         SELECT value, ?, 'canceled', 'unschedule' FROM json_each(?)",
    )
    .bind(ms(now))
    .bind(ids_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("unschedule (log)"))?;
    tx.commit().await.map_err(Error::db("unschedule"))?;
    Ok(ids.len() as u64)
}

/// The time of the host the database file lives on (SQLite has no server clock), to ms.
pub(super) async fn database_now(store: &SqliteStore) -> Result<DateTime<Utc>> {
    let now: i64 = sqlx::query_scalar("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)")
        .fetch_one(&store.reader)
        .await
        .map_err(Error::db("read database clock"))?;
    Ok(from_ms(now))
}
