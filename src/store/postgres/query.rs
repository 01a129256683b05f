//! PostgreSQL: reading actions (query, get, logs, stats, next run) and unscheduling by filter.
//!
//! Args filters compare `args = $n::jsonb`, i.e. semantic JSON equality.

use super::{ts, PgStore};
use crate::action::{encode_args, Action, ActionFilter, ActionLog, ActionOrder, ActionQuery};
use crate::error::{Error, Result};
use crate::state::ActionStatus;
use crate::store::operator::job_owned_hooks;
use crate::store::QueueStats;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Postgres, QueryBuilder, Row};

const COLUMNS: &str = "id, hook, args, group_name, priority, status, scheduled_at, attempt,
    max_attempts, timeout_ms, unique_key, lease_owner, lease_token, lease_until, created_at,
    finished_at, last_error, schedule_id";

fn action_from_row(row: &PgRow) -> Result<Action> {
    let d = || Error::db("decode action");
    let id: i64 = row.try_get("id").map_err(d())?;
    let args: Json<Value> = row.try_get("args").map_err(d())?;
    let status: String = row.try_get("status").map_err(d())?;
    Ok(Action {
        id,
        hook: row.try_get("hook").map_err(d())?,
        args: args.0,
        group: row.try_get("group_name").map_err(d())?,
        priority: row.try_get("priority").map_err(d())?,
        status: status.parse::<ActionStatus>().map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: e.to_string(),
        })?,
        scheduled_at: row.try_get("scheduled_at").map_err(d())?,
        attempt: row.try_get("attempt").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        timeout_ms: row.try_get("timeout_ms").map_err(d())?,
        unique_key: row.try_get("unique_key").map_err(d())?,
        lease_owner: row.try_get("lease_owner").map_err(d())?,
        lease_token: row.try_get("lease_token").map_err(d())?,
        lease_until: row.try_get("lease_until").map_err(d())?,
        created_at: row.try_get("created_at").map_err(d())?,
        finished_at: row.try_get("finished_at").map_err(d())?,
        last_error: row.try_get("last_error").map_err(d())?,
        schedule_id: row.try_get("schedule_id").map_err(d())?,
    })
}

/// Appends ` AND …` conditions for a hook/args/group filter.
fn push_filter(qb: &mut QueryBuilder<'_, Postgres>, f: &ActionFilter) -> Result<()> {
    if let Some(h) = &f.hook {
        qb.push(" AND hook = ").push_bind(h.clone());
    }
    if let Some(a) = &f.args {
        qb.push(" AND args = ")
            .push_bind(encode_args(a)?)
            .push("::jsonb");
    }
    if let Some(g) = &f.group {
        qb.push(" AND group_name = ").push_bind(g.clone());
    }
    Ok(())
}

pub(super) async fn query(store: &PgStore, q: &ActionQuery) -> Result<Vec<Action>> {
    let mut qb: QueryBuilder<Postgres> =
        QueryBuilder::new(format!("SELECT {COLUMNS} FROM dockhand_actions WHERE TRUE"));
    push_filter(&mut qb, &q.filter)?;
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
            qb.push(format!(" AND {col} {op} ")).push_bind(ts(t));
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
    let rows = qb
        .build()
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("query"))?;
    rows.iter().map(action_from_row).collect()
}

pub(super) async fn get(store: &PgStore, id: i64) -> Result<Option<Action>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM dockhand_actions WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&store.pool)
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
/// break), `action_id`, `at`, `event`, `detail`; `$1` is the action id. Stored rows sort by
/// [`STORED_LOG_KEY`], then id.
pub(super) const LOG_FROM_ROW: &str = "
    SELECT -1::float8 AS k, 0::float8 AS t, id AS action_id, created_at AS at,
           'created'::text AS event, NULL::text AS detail
    FROM dockhand_actions
    WHERE id = $1
      AND (SELECT event FROM dockhand_action_logs
           WHERE action_id = $1 ORDER BY id LIMIT 1) IS DISTINCT FROM 'created'
    UNION ALL
    SELECT started_after::float8 + 0.25, 9.0e18::float8, id, started_at, 'started', started_by
    FROM dockhand_actions
    WHERE id = $1 AND started_by IS NOT NULL
    UNION ALL
    SELECT COALESCE((SELECT MIN(l.id)::float8 FROM dockhand_action_logs l
                     WHERE l.action_id = $1 AND l.at >= a.finished_at AND l.sort_key IS NULL
                       AND l.id > COALESCE(a.started_after,
                                           (SELECT MAX(s.id) FROM dockhand_action_logs s
                                            WHERE s.action_id = $1 AND s.event = 'started'),
                                           0)), 9.0e18::float8) - 0.5,
           9.0e18::float8, a.id, a.finished_at, 'completed', NULL::text
    FROM dockhand_actions a
    WHERE a.id = $1 AND a.status = 'complete'
      AND NOT EXISTS (SELECT 1 FROM dockhand_action_logs l
                      WHERE l.action_id = $1 AND l.event = 'completed')";

/// A stored log row's sort key: its id, or for an attempt's `started` entry stored when the
/// action was claimed again (migration 0020) the key the row-derived entry had.
pub(super) const STORED_LOG_KEY: &str = "COALESCE(sort_key, id::float8)";

pub(super) async fn logs(store: &PgStore, id: i64) -> Result<Vec<ActionLog>> {
    let sql = format!(
        "SELECT action_id, at, event, detail FROM ({LOG_FROM_ROW}
             UNION ALL
             SELECT {STORED_LOG_KEY}, id::float8, action_id, at, event, detail
             FROM dockhand_action_logs
             WHERE action_id = $1
         ) AS merged ORDER BY k, t"
    );
    let rows = sqlx::query(&sql)
        .bind(id)
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("logs"))?;
    rows.iter()
        .map(|r| {
            Ok(ActionLog {
                action_id: r.try_get("action_id").map_err(Error::db("logs"))?,
                at: r.try_get("at").map_err(Error::db("logs"))?,
                event: r.try_get("event").map_err(Error::db("logs"))?,
                detail: r.try_get("detail").map_err(Error::db("logs"))?,
            })
        })
        .collect()
}

pub(super) async fn stats(store: &PgStore, now: DateTime<Utc>) -> Result<QueueStats> {
    let rows = sqlx::query(
        "SELECT COALESCE(group_name, '') AS g, status, COUNT(*) AS n
         FROM dockhand_actions GROUP BY 1, 2",
    )
    .fetch_all(&store.pool)
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
    let now = ts(now);
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, MIN(scheduled_at) AS oldest FROM dockhand_actions
         WHERE status = 'pending' AND scheduled_at <= $1",
    )
    .bind(now)
    .fetch_one(&store.pool)
    .await
    .map_err(Error::db("stats"))?;
    stats.past_due = row.try_get("n").map_err(Error::db("stats"))?;
    let oldest: Option<DateTime<Utc>> = row.try_get("oldest").map_err(Error::db("stats"))?;
    stats.oldest_due_lag_ms = oldest.map(|o| (now - o).num_milliseconds());
    Ok(stats)
}

pub(super) async fn next_scheduled(
    store: &PgStore,
    f: &ActionFilter,
) -> Result<Option<DateTime<Utc>>> {
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT MIN(t) FROM (SELECT MIN(scheduled_at) AS t FROM dockhand_actions
         WHERE status = 'pending'",
    );
    push_filter(&mut qb, f)?;
    qb.push(
        " UNION ALL SELECT MIN(next_run_at) AS t FROM dockhand_schedules
         WHERE enabled AND next_run_at IS NOT NULL",
    );
    push_filter(&mut qb, f)?;
    qb.push(") AS due");
    qb.build_query_scalar()
        .fetch_one(&store.pool)
        .await
        .map_err(Error::db("next_scheduled"))
}

pub(super) async fn unschedule(
    store: &PgStore,
    f: &ActionFilter,
    now: DateTime<Utc>,
) -> Result<u64> {
    let mut tx = store.begin("unschedule").await?;
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(
        "UPDATE dockhand_schedules SET enabled = FALSE, next_run_at = NULL, updated_at = ",
    );
    qb.push_bind(ts(now)).push(" WHERE TRUE");
    push_filter(&mut qb, f)?;
    qb.build()
        .execute(&mut *tx)
        .await
        .map_err(Error::db("unschedule (schedules)"))?;
    let mut qb: QueryBuilder<Postgres> =
        QueryBuilder::new("UPDATE dockhand_actions SET status = 'canceled', finished_at = ");
    qb.push_bind(ts(now)).push(concat!(
        " WHERE status = 'pending' AND hook NOT IN ",
        job_owned_hooks!()
    ));
    push_filter(&mut qb, f)?;
    qb.push(" RETURNING id");
    let ids: Vec<i64> = qb
        .build_query_scalar()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("unschedule"))?;
    sqlx::query(
        "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
         SELECT unnest($1::bigint[]), $2, 'canceled', 'unschedule'",
    )
    .bind(&ids)
    .bind(ts(now))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("unschedule (log)"))?;
    tx.commit().await.map_err(Error::db("unschedule"))?;
    Ok(ids.len() as u64)
}

/// The server's clock (`clock_timestamp()`, not the transaction start), to ms.
pub(super) async fn database_now(store: &PgStore) -> Result<DateTime<Utc>> {
    sqlx::query_scalar("SELECT date_trunc('milliseconds', clock_timestamp())")
        .fetch_one(&store.pool)
        .await
        .map_err(Error::db("read database clock"))
}
