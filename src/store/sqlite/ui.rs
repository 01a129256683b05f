//! SQLite: the operator views (keyset action search, capped counts, throughput, log tail,
//! schema version) and the bulk changes (cancel, retry, run now, delete) the dashboard uses.
//! Each sort walks its own index (migration 0005); no query uses OFFSET.

use super::args_match::push_args_contains;
use super::query::{push_hook, Reads, LOG_FROM_ROW, STORED_LOG_KEY};
use super::{from_ms, ms, SqliteStore};
use crate::action::ActionLog;
use crate::error::{Error, Result};
use crate::search::{
    ActionPage, ActionSearch, ActionSort, ActionSummary, HEAD_CHARS, INTERNAL_HOOK_PREFIX,
};
use crate::state::ActionStatus;
use crate::store::operator::job_owned_hooks;
use crate::store::operator::{self, bucket_window, check_bulk_ids, fill_buckets, key_columns};
use crate::store::{BulkOutcome, Capped, ThroughputBucket};
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

/// Appends the search's filters (not its cursor) as ` AND …` conditions.
fn push_filters(qb: &mut QueryBuilder<'static, Sqlite>, s: &ActionSearch) -> Result<()> {
    if let Some(st) = s.status {
        qb.push(" AND status = ").push_bind(st.as_str());
    }
    if let Some(h) = &s.hook {
        push_hook(qb, h, Reads::of(s.status.as_slice()));
    }
    match &s.group {
        Some(Some(g)) => {
            qb.push(" AND group_name = ").push_bind(g.clone());
        }
        Some(None) => {
            qb.push(" AND group_name IS NULL");
        }
        None => {}
    }
    if let Some((lo, hi)) = s.priority {
        qb.push(" AND priority BETWEEN ")
            .push_bind(lo)
            .push(" AND ")
            .push_bind(hi);
    }
    if s.sort == ActionSort::FinishedDesc {
        // Names the partial index's condition, so the planner may use it.
        qb.push(" AND finished_at IS NOT NULL");
    }
    let col = operator::time_column(s.sort);
    if let Some(from) = s.from {
        qb.push(format!(" AND {col} >= ")).push_bind(ms(from));
    }
    if let Some(to) = s.to {
        qb.push(format!(" AND {col} < ")).push_bind(ms(to));
    }
    if s.exclude_internal {
        qb.push(format!(
            " AND substr(hook, 1, {}) <> ",
            INTERNAL_HOOK_PREFIX.len()
        ))
        .push_bind(INTERNAL_HOOK_PREFIX);
    }
    if let Some(max) = s.max_id {
        qb.push(" AND id <= ").push_bind(max);
    }
    if let Some(cand) = &s.args_contains {
        push_args_contains(qb, cand)?;
    }
    Ok(())
}

/// Appends the keyset condition `(keys) > (cursor)` (or `<`) as a row-value comparison, which
/// SQLite turns into a range on the sort's index starting exactly at the cursor (an expanded
/// `a > x OR (a = x AND …)` form would only bound the first column).
fn push_keyset(qb: &mut QueryBuilder<'_, Sqlite>, cols: &[&str], keys: &[i64], up: bool) {
    let op = if up { ">" } else { "<" };
    qb.push(format!(" AND ({}) {op} (", cols.join(", ")));
    let mut sep = qb.separated(", ");
    for k in keys {
        sep.push_bind(*k);
    }
    qb.push(")");
}

pub(super) fn summary_from_row(row: &SqliteRow) -> Result<ActionSummary> {
    let id: i64 = row
        .try_get("id")
        .map_err(Error::db("decode action summary"))?;
    let status: String = row
        .try_get("status")
        .map_err(Error::db("decode action summary"))?;
    let opt_time = |c: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row
            .try_get::<Option<i64>, _>(c)
            .map_err(Error::db("decode action summary"))?
            .map(from_ms))
    };
    Ok(ActionSummary {
        id,
        hook: row
            .try_get("hook")
            .map_err(Error::db("decode action summary"))?,
        group: row
            .try_get("group_name")
            .map_err(Error::db("decode action summary"))?,
        status: status.parse::<ActionStatus>().map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: e.to_string(),
        })?,
        priority: row
            .try_get("priority")
            .map_err(Error::db("decode action summary"))?,
        scheduled_at: from_ms(
            row.try_get("scheduled_at")
                .map_err(Error::db("decode action summary"))?,
        ),
        attempt: row
            .try_get("attempt")
            .map_err(Error::db("decode action summary"))?,
        max_attempts: row
            .try_get("max_attempts")
            .map_err(Error::db("decode action summary"))?,
        unique_key: row
            .try_get("unique_key")
            .map_err(Error::db("decode action summary"))?,
        lease_owner: row
            .try_get("lease_owner")
            .map_err(Error::db("decode action summary"))?,
        lease_until: opt_time("lease_until")?,
        finished_at: opt_time("finished_at")?,
        args_head: row
            .try_get("args_head")
            .map_err(Error::db("decode action summary"))?,
        error_head: row
            .try_get("error_head")
            .map_err(Error::db("decode action summary"))?,
    })
}

/// The columns [`summary_from_row`] reads, args and error cut to their heads.
pub(super) fn summary_columns() -> String {
    format!(
        "id, hook, group_name, status, priority, scheduled_at, attempt, max_attempts,
         unique_key, lease_owner, lease_until, finished_at,
         substr(args, 1, {HEAD_CHARS}) AS args_head,
         substr(last_error, 1, {HEAD_CHARS}) AS error_head"
    )
}

pub(super) async fn search_actions(store: &SqliteStore, s: &ActionSearch) -> Result<ActionPage> {
    s.validate()?;
    let rows = search_sql(s)?
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("search actions"))?;
    let rows = rows
        .iter()
        .map(summary_from_row)
        .collect::<Result<Vec<_>>>()?;
    Ok(ActionPage::assemble(s, rows))
}

/// The statement of [`search_actions`] (one page and one row more).
pub(super) fn search_sql(s: &ActionSearch) -> Result<QueryBuilder<'static, Sqlite>> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT {} FROM dockhand_actions WHERE 1 = 1",
        summary_columns()
    ));
    push_filters(&mut qb, s)?;
    let cols = key_columns(s.sort);
    // Walk up the keys for an ascending order paging forward, or a descending one paging back.
    let up = s.sort.descending() == s.before.is_some();
    if let Some(c) = s.after.as_ref().or(s.before.as_ref()) {
        push_keyset(&mut qb, cols, &c.keys, up);
    }
    let dir = if up { "ASC" } else { "DESC" };
    let order: Vec<String> = cols.iter().map(|c| format!("{c} {dir}")).collect();
    qb.push(format!(" ORDER BY {} LIMIT ", order.join(", ")))
        .push_bind(s.limit + 1);
    Ok(qb)
}

pub(super) async fn count_actions(
    store: &SqliteStore,
    s: &ActionSearch,
    cap: i64,
) -> Result<Capped> {
    s.validate()?;
    let cap = cap.max(0);
    let mut qb: QueryBuilder<Sqlite> =
        QueryBuilder::new("SELECT COUNT(*) FROM (SELECT 1 FROM dockhand_actions WHERE 1 = 1");
    push_filters(&mut qb, s)?;
    qb.push(" LIMIT ").push_bind(cap + 1).push(")");
    let n: i64 = qb
        .build_query_scalar()
        .fetch_one(&store.reader)
        .await
        .map_err(Error::db("count actions"))?;
    Ok(Capped {
        n: n.min(cap),
        capped: n > cap,
    })
}

pub(super) async fn throughput(
    store: &SqliteStore,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    bucket: chrono::Duration,
) -> Result<Vec<ThroughputBucket>> {
    let (first, count, width) = bucket_window(since, until, bucket)?;
    let rows = sqlx::query(
        "SELECT finished_at / ?1 AS b,
                SUM(status = 'complete') AS completed, SUM(status = 'failed') AS failed
         FROM dockhand_actions
         WHERE status IN ('complete', 'failed') AND finished_at >= ?2 AND finished_at < ?3
         GROUP BY b",
    )
    .bind(width)
    .bind(first * width)
    .bind((first + count) * width)
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db("throughput"))?;
    let rows = rows
        .iter()
        .map(|r| {
            Ok((
                r.try_get("b").map_err(Error::db("decode throughput"))?,
                r.try_get("completed")
                    .map_err(Error::db("decode throughput"))?,
                r.try_get("failed")
                    .map_err(Error::db("decode throughput"))?,
            ))
        })
        .collect::<Result<Vec<(i64, i64, i64)>>>()?;
    Ok(fill_buckets(first, count, width, &rows))
}

pub(super) async fn logs_tail(store: &SqliteStore, id: i64, limit: i64) -> Result<Vec<ActionLog>> {
    let sql = format!(
        "SELECT action_id, at, event, detail FROM (
             SELECT k, t, action_id, at, event, detail FROM ({LOG_FROM_ROW}
                 UNION ALL
                 SELECT k, t, action_id, at, event, detail FROM (
                     SELECT {STORED_LOG_KEY} AS k, id AS t, action_id, at, event, detail
                     FROM dockhand_action_logs
                     WHERE action_id = ?1 ORDER BY k DESC, t DESC LIMIT ?2
                 ) AS recent
             ) AS merged ORDER BY k DESC, t DESC LIMIT ?2
         ) AS tail ORDER BY k, t"
    );
    let rows = sqlx::query(&sql)
        .bind(id)
        .bind(limit.max(0))
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("logs tail"))?;
    rows.iter()
        .map(|r| {
            Ok(ActionLog {
                action_id: r.try_get("action_id").map_err(Error::db("decode log"))?,
                at: from_ms(r.try_get("at").map_err(Error::db("decode log"))?),
                event: r.try_get("event").map_err(Error::db("decode log"))?,
                detail: r.try_get("detail").map_err(Error::db("decode log"))?,
            })
        })
        .collect()
}

pub(super) async fn schema_version(store: &SqliteStore) -> Result<i64> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_one(&store.reader)
    .await
    .map_err(Error::db("schema version"))?;
    if exists == 0 {
        return Ok(0);
    }
    sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations WHERE success")
        .fetch_one(&store.reader)
        .await
        .map_err(Error::db("schema version"))
}

fn ids_json(ids: &[i64]) -> Result<String> {
    serde_json::to_string(ids).map_err(|e| Error::invalid("ids", e.to_string()))
}

/// Logs `event` with `detail` for each of `ids`, in the caller's transaction.
async fn log_many(
    conn: &mut SqliteConnection,
    ids: &[i64],
    now: DateTime<Utc>,
    event: &str,
    detail: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
         SELECT value, ?, ?, ? FROM json_each(?)",
    )
    .bind(ms(now))
    .bind(event)
    .bind(detail)
    .bind(ids_json(ids)?)
    .execute(conn)
    .await
    .map_err(Error::db("log bulk change"))?;
    Ok(())
}

pub(super) async fn cancel_many(
    store: &SqliteStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin_write("cancel many").await?;
    let changed: Vec<i64> = sqlx::query_scalar(concat!(
        "UPDATE dockhand_actions SET status = 'canceled', finished_at = ?,
         lease_owner = NULL, lease_until = NULL
         WHERE id IN (SELECT value FROM json_each(?)) AND status IN ('pending', 'running')
           AND hook NOT IN ",
        job_owned_hooks!(),
        " RETURNING id"
    ))
    .bind(ms(now))
    .bind(ids_json(ids)?)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("cancel many"))?;
    log_many(&mut tx, &changed, now, "canceled", actor).await?;
    tx.commit().await.map_err(Error::db("cancel many"))?;
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn retry_many(
    store: &SqliteStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin_write("retry many").await?;
    // One row at a time, so a unique key another active action holds (or an earlier id of
    // this list took back) skips that row instead of failing the statement.
    let mut changed = Vec::new();
    for &id in ids {
        let done = sqlx::query(
            "UPDATE dockhand_actions AS a SET status = 'pending', attempt = 0, scheduled_at = ?,
             finished_at = NULL
             WHERE id = ? AND status IN ('failed', 'canceled')
               AND (unique_key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM dockhand_actions b WHERE b.unique_key = a.unique_key
                   AND b.status IN ('pending', 'running')))",
        )
        .bind(ms(now))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(|e| crate::store::unique_violation_as(e, "retry many", id))?;
        if done.rows_affected() == 1 {
            changed.push(id);
        }
    }
    log_many(
        &mut tx,
        &changed,
        now,
        "requeued",
        &format!("operator retry ({actor})"),
    )
    .await?;
    tx.commit().await.map_err(Error::db("retry many"))?;
    if !changed.is_empty() {
        store.notify();
    }
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn run_now(
    store: &SqliteStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin_write("run now").await?;
    let changed: Vec<i64> = sqlx::query_scalar(
        "UPDATE dockhand_actions SET scheduled_at = ?1
         WHERE id IN (SELECT value FROM json_each(?2)) AND status = 'pending'
           AND scheduled_at > ?1
         RETURNING id",
    )
    .bind(ms(now))
    .bind(ids_json(ids)?)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("run now"))?;
    log_many(&mut tx, &changed, now, "run_now", actor).await?;
    tx.commit().await.map_err(Error::db("run now"))?;
    if !changed.is_empty() {
        store.notify();
    }
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn delete_actions(store: &SqliteStore, ids: &[i64]) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin_write("delete actions").await?;
    let changed: Vec<i64> = sqlx::query_scalar(concat!(
        "DELETE FROM dockhand_actions
             WHERE id IN (SELECT value FROM json_each(?)) AND status <> 'running'
               AND NOT (status = 'pending' AND hook IN ",
        job_owned_hooks!(),
        ") RETURNING id"
    ))
    .bind(ids_json(ids)?)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("delete actions"))?;
    sqlx::query(
        "DELETE FROM dockhand_action_logs WHERE action_id IN (SELECT value FROM json_each(?))",
    )
    .bind(ids_json(&changed)?)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("delete actions (logs)"))?;
    tx.commit().await.map_err(Error::db("delete actions"))?;
    Ok(operator::outcome(ids, changed))
}
