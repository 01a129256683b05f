//! MySQL: reading actions (query, get, logs, stats, next run) and unscheduling by filter.
//!
//! Args filters compare the canonical JSON text (`encode_args` sorts object keys), like SQLite.

use super::claim::push_in;
use super::{from_ms, ms, opt_text, retry_deadlocks, text, MySqlStore};
use crate::action::{encode_args, Action, ActionFilter, ActionLog, ActionOrder, ActionQuery};
use crate::error::{Error, Result};
use crate::state::ActionStatus;
use crate::store::operator::job_owned_hooks;
use crate::store::QueueStats;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, QueryBuilder, Row};

const COLUMNS: &str = "id, hook, args, group_name, priority, status, scheduled_at, attempt,
    max_attempts, timeout_ms, unique_key, lease_owner, lease_token, lease_until, created_at,
    finished_at, last_error, schedule_id";

/// Ids per `IN (…)` list when unscheduling.
const ID_CHUNK: usize = 10_000;

fn action_from_row(row: &MySqlRow) -> Result<Action> {
    let d = || Error::db("decode action");
    let id: i64 = row.try_get("id").map_err(d())?;
    let corrupt = |m: String| Error::Corrupt {
        what: "action",
        id,
        message: m,
    };
    let args = text(row, "args").map_err(d())?;
    let status = text(row, "status").map_err(d())?;
    let opt_time = |c: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row.try_get::<Option<i64>, _>(c).map_err(d())?.map(from_ms))
    };
    Ok(Action {
        id,
        hook: text(row, "hook").map_err(d())?,
        args: serde_json::from_str(&args).map_err(|e| corrupt(format!("args: {e}")))?,
        group: opt_text(row, "group_name").map_err(d())?,
        priority: row.try_get("priority").map_err(d())?,
        status: status
            .parse::<ActionStatus>()
            .map_err(|e| corrupt(e.to_string()))?,
        scheduled_at: from_ms(row.try_get("scheduled_at").map_err(d())?),
        attempt: row.try_get("attempt").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        timeout_ms: row.try_get("timeout_ms").map_err(d())?,
        unique_key: opt_text(row, "unique_key").map_err(d())?,
        lease_owner: opt_text(row, "lease_owner").map_err(d())?,
        lease_token: row.try_get("lease_token").map_err(d())?,
        lease_until: opt_time("lease_until")?,
        created_at: from_ms(row.try_get("created_at").map_err(d())?),
        finished_at: opt_time("finished_at")?,
        last_error: opt_text(row, "last_error").map_err(d())?,
        schedule_id: row.try_get("schedule_id").map_err(d())?,
    })
}

/// Appends ` AND …` conditions for a hook/args/group filter.
fn push_filter(qb: &mut QueryBuilder<'_, MySql>, f: &ActionFilter) -> Result<()> {
    if let Some(h) = &f.hook {
        qb.push(" AND hook = ").push_bind(h.clone());
    }
    if let Some(a) = &f.args {
        qb.push(" AND args = ").push_bind(encode_args(a)?);
    }
    if let Some(g) = &f.group {
        qb.push(" AND group_name = ").push_bind(g.clone());
    }
    Ok(())
}

pub(super) async fn query(store: &MySqlStore, q: &ActionQuery) -> Result<Vec<Action>> {
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(format!(
        "SELECT {COLUMNS} FROM dockhand_actions WHERE 1 = 1"
    ));
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
    let rows = qb
        .build()
        .fetch_all(store.pool())
        .await
        .map_err(Error::db("query"))?;
    rows.iter().map(action_from_row).collect()
}

pub(super) async fn get(store: &MySqlStore, id: i64) -> Result<Option<Action>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM dockhand_actions WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(store.pool())
    .await
    .map_err(Error::db("get"))?;
    row.as_ref().map(action_from_row).transpose()
}

/// An action's log entries that are read from its row, not stored (migration 0017): `created`
/// at `created_at` (first), and for a completed action `completed` at `finished_at`, placed
/// before the first stored entry after its attempt's `started` row that is not older than it
/// (a stale owner's refused finish). Each is left out where an action from
/// before 0017 has it stored. Columns `k` (sort key: stored rows sort by id), `action_id`,
/// `at`, `event`, `detail`; binds the action id [`LOG_FROM_ROW_BINDS`] times.
pub(super) const LOG_FROM_ROW: &str = "
    SELECT -1.0E0 AS k, id AS action_id, created_at AS at, 'created' AS event, NULL AS detail
    FROM dockhand_actions
    WHERE id = ?
      AND NOT ((SELECT event FROM dockhand_action_logs
                WHERE action_id = ? ORDER BY id LIMIT 1) <=> 'created')
    UNION ALL
    SELECT COALESCE((SELECT MIN(l.id) FROM dockhand_action_logs l
                     WHERE l.action_id = ? AND l.at >= a.finished_at
                       AND l.id > COALESCE((SELECT MAX(s.id) FROM dockhand_action_logs s
                                            WHERE s.action_id = ? AND s.event = 'started'),
                                           0)), 9.0E18) - 0.5E0,
           a.id, a.finished_at, 'completed', NULL
    FROM dockhand_actions a
    WHERE a.id = ? AND a.status = 'complete'
      AND NOT EXISTS (SELECT 1 FROM dockhand_action_logs l
                      WHERE l.action_id = ? AND l.event = 'completed')";
/// How many times [`LOG_FROM_ROW`] binds the action id.
pub(super) const LOG_FROM_ROW_BINDS: usize = 6;

pub(super) async fn logs(store: &MySqlStore, id: i64) -> Result<Vec<ActionLog>> {
    let sql = format!(
        "SELECT action_id, at, event, detail FROM ({LOG_FROM_ROW}
             UNION ALL
             SELECT id, action_id, at, event, detail FROM dockhand_action_logs
             WHERE action_id = ?
         ) AS merged ORDER BY k"
    );
    let mut q = sqlx::query(&sql);
    for _ in 0..=LOG_FROM_ROW_BINDS {
        q = q.bind(id);
    }
    let rows = q.fetch_all(store.pool()).await.map_err(Error::db("logs"))?;
    rows.iter()
        .map(|r| {
            Ok(ActionLog {
                action_id: r.try_get("action_id").map_err(Error::db("logs"))?,
                at: from_ms(r.try_get("at").map_err(Error::db("logs"))?),
                event: text(r, "event").map_err(Error::db("logs"))?,
                detail: opt_text(r, "detail").map_err(Error::db("logs"))?,
            })
        })
        .collect()
}

pub(super) async fn stats(store: &MySqlStore, now: DateTime<Utc>) -> Result<QueueStats> {
    let rows = sqlx::query(
        "SELECT COALESCE(group_name, '') AS g, status, COUNT(*) AS n
         FROM dockhand_actions GROUP BY g, status",
    )
    .fetch_all(store.pool())
    .await
    .map_err(Error::db("stats"))?;
    let mut stats = QueueStats::default();
    for r in rows {
        let g = text(&r, "g").map_err(Error::db("stats"))?;
        let s = text(&r, "status").map_err(Error::db("stats"))?;
        let n: i64 = r.try_get("n").map_err(Error::db("stats"))?;
        *stats.by_status.entry(s.clone()).or_default() += n;
        *stats.by_group.entry(g).or_default().entry(s).or_default() += n;
    }
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, MIN(scheduled_at) AS oldest FROM dockhand_actions
         WHERE status = 'pending' AND scheduled_at <= ?",
    )
    .bind(ms(now))
    .fetch_one(store.pool())
    .await
    .map_err(Error::db("stats"))?;
    stats.past_due = row.try_get("n").map_err(Error::db("stats"))?;
    let oldest: Option<i64> = row.try_get("oldest").map_err(Error::db("stats"))?;
    stats.oldest_due_lag_ms = oldest.map(|o| ms(now) - o);
    Ok(stats)
}

pub(super) async fn next_scheduled(
    store: &MySqlStore,
    f: &ActionFilter,
) -> Result<Option<DateTime<Utc>>> {
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "SELECT MIN(t) FROM (SELECT MIN(scheduled_at) AS t FROM dockhand_actions
         WHERE status = 'pending'",
    );
    push_filter(&mut qb, f)?;
    qb.push(
        " UNION ALL SELECT MIN(next_run_at) AS t FROM dockhand_schedules
         WHERE enabled = TRUE AND next_run_at IS NOT NULL",
    );
    push_filter(&mut qb, f)?;
    qb.push(") AS due");
    let t: Option<i64> = qb
        .build_query_scalar()
        .fetch_one(store.pool())
        .await
        .map_err(Error::db("next_scheduled"))?;
    Ok(t.map(from_ms))
}

pub(super) async fn unschedule(
    store: &MySqlStore,
    f: &ActionFilter,
    now: DateTime<Utc>,
) -> Result<u64> {
    retry_deadlocks("unschedule", || async move {
        let mut tx = store.begin("unschedule").await?;
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "UPDATE dockhand_schedules SET enabled = FALSE, next_run_at = NULL, updated_at = ",
        );
        qb.push_bind(ms(now)).push(" WHERE 1 = 1");
        push_filter(&mut qb, f)?;
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("unschedule (schedules)"))?;
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(concat!(
            "SELECT id FROM dockhand_actions WHERE status = 'pending' AND hook NOT IN ",
            job_owned_hooks!()
        ));
        push_filter(&mut qb, f)?;
        qb.push(" ORDER BY id FOR UPDATE");
        let ids: Vec<i64> = qb
            .build_query_scalar()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("unschedule"))?;
        for chunk in ids.chunks(ID_CHUNK) {
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
                "UPDATE dockhand_actions SET status = 'canceled', active_key = NULL, finished_at = ",
            );
            qb.push_bind(ms(now))
                .push(" WHERE status = 'pending' AND id");
            push_in(&mut qb, chunk);
            qb.build()
                .execute(&mut *tx)
                .await
                .map_err(Error::db("unschedule"))?;
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
                "INSERT INTO dockhand_action_logs (action_id, at, event, detail) ",
            );
            qb.push_values(chunk, |mut b, id| {
                b.push_bind(*id)
                    .push_bind(ms(now))
                    .push("'canceled'")
                    .push("'unschedule'");
            });
            qb.build()
                .execute(&mut *tx)
                .await
                .map_err(Error::db("unschedule (log)"))?;
        }
        tx.commit().await.map_err(Error::db("unschedule"))?;
        Ok(ids.len() as u64)
    })
    .await
}

/// The server's clock (`NOW(3)` as Unix milliseconds, independent of the session time zone).
pub(super) async fn database_now(store: &MySqlStore) -> Result<DateTime<Utc>> {
    let now: i64 = sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)")
        .fetch_one(store.pool())
        .await
        .map_err(Error::db("read database clock"))?;
    Ok(from_ms(now))
}
