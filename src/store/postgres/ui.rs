//! PostgreSQL: the operator views (keyset action search, capped counts, throughput, log tail,
//! schema version) and the bulk changes (cancel, retry, run now, delete) the dashboard uses.
//! Each sort walks its own index (migration 0005); no query uses OFFSET. Cursor keys are Unix
//! milliseconds and bound back as `timestamptz` (stored times are whole milliseconds, see
//! [`ts`], so a key compares exactly); args containment is `jsonb @>`.

use super::query::{LOG_FROM_ROW, STORED_LOG_KEY};
use super::{listen, ts, PgStore};
use crate::action::ActionLog;
use crate::error::{Error, Result};
use crate::search::{
    ActionPage, ActionSearch, ActionSort, ActionSummary, HEAD_CHARS, INTERNAL_HOOK_PREFIX,
};
use crate::state::ActionStatus;
use crate::store::operator::job_owned_hooks;
use crate::store::operator::{
    self, bucket_window, check_bulk_ids, check_candidate_shape, fill_buckets, key_columns,
};
use crate::store::{BulkOutcome, Capped, ThroughputBucket};
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{Acquire, PgConnection, Postgres, QueryBuilder, Row};

/// Whether a key column holds a time (bound as `timestamptz`, not as an integer).
fn is_time(col: &str) -> bool {
    col.ends_with("_at") || col == "lease_until"
}

/// A cursor key of a time column as the time it stands for.
fn key_time(k: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(k)
        .ok_or_else(|| Error::invalid("cursor", format!("{k} is not a time in milliseconds")))
}

/// Binds cursor key `k` of column `col` with the column's type.
fn push_key(qb: &mut QueryBuilder<'_, Postgres>, col: &str, k: i64) -> Result<()> {
    if is_time(col) {
        qb.push_bind(key_time(k)?);
    } else {
        qb.push_bind(k);
    }
    Ok(())
}

/// Appends the search's filters (not its cursor) as ` AND …` conditions.
fn push_filters(qb: &mut QueryBuilder<'_, Postgres>, s: &ActionSearch) -> Result<()> {
    if let Some(st) = s.status {
        qb.push(" AND status = ").push_bind(st.as_str());
    }
    if let Some(h) = &s.hook {
        qb.push(" AND hook = ").push_bind(h.clone());
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
        qb.push(format!(" AND {col} >= ")).push_bind(ts(from));
    }
    if let Some(to) = s.to {
        qb.push(format!(" AND {col} < ")).push_bind(ts(to));
    }
    if s.exclude_internal {
        qb.push(format!(
            " AND left(hook, {}) <> ",
            INTERNAL_HOOK_PREFIX.len()
        ))
        .push_bind(INTERNAL_HOOK_PREFIX);
    }
    if let Some(max) = s.max_id {
        qb.push(" AND id <= ").push_bind(max);
    }
    if let Some(cand) = &s.args_contains {
        check_candidate_shape(cand)?;
        let text = serde_json::to_string(cand)
            .map_err(|e| Error::invalid("args_contains", e.to_string()))?;
        qb.push(" AND args @> ").push_bind(text).push("::jsonb");
    }
    Ok(())
}

/// Appends the keyset condition `(keys) > (cursor)` (or `<`) as a row comparison, which
/// PostgreSQL turns into an exact start key on the sort's index (`Index Cond: ROW(priority,
/// scheduled_at, id) > ROW($1, $2, $3)`); the expanded `a >= x AND (a > x OR …)` form only
/// bounds the first column, so a page deep in one priority would walk that priority's head.
fn push_keyset(
    qb: &mut QueryBuilder<'_, Postgres>,
    cols: &[&str],
    keys: &[i64],
    up: bool,
) -> Result<()> {
    if cols.len() != keys.len() {
        return Err(Error::invalid(
            "cursor",
            format!("{} keys for a sort of {}", keys.len(), cols.len()),
        ));
    }
    let op = if up { ">" } else { "<" };
    qb.push(format!(" AND ({}) {op} (", cols.join(", ")));
    for (i, (c, k)) in cols.iter().zip(keys).enumerate() {
        if i > 0 {
            qb.push(", ");
        }
        push_key(qb, c, *k)?;
    }
    qb.push(")");
    Ok(())
}

pub(super) fn summary_from_row(row: &PgRow) -> Result<ActionSummary> {
    let d = || Error::db("decode action summary");
    let id: i64 = row.try_get("id").map_err(d())?;
    let status: String = row.try_get("status").map_err(d())?;
    Ok(ActionSummary {
        id,
        hook: row.try_get("hook").map_err(d())?,
        group: row.try_get("group_name").map_err(d())?,
        status: status.parse::<ActionStatus>().map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: e.to_string(),
        })?,
        priority: row.try_get("priority").map_err(d())?,
        scheduled_at: row.try_get("scheduled_at").map_err(d())?,
        attempt: row.try_get("attempt").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        unique_key: row.try_get("unique_key").map_err(d())?,
        lease_owner: row.try_get("lease_owner").map_err(d())?,
        lease_until: row.try_get("lease_until").map_err(d())?,
        finished_at: row.try_get("finished_at").map_err(d())?,
        args_head: row.try_get("args_head").map_err(d())?,
        error_head: row.try_get("error_head").map_err(d())?,
    })
}

/// The columns [`summary_from_row`] reads, args and error cut to their heads.
pub(super) fn summary_columns() -> String {
    format!(
        "id, hook, group_name, status, priority, scheduled_at, attempt, max_attempts,
         unique_key, lease_owner, lease_until, finished_at,
         left(args::text, {HEAD_CHARS}) AS args_head,
         left(last_error, {HEAD_CHARS}) AS error_head"
    )
}

pub(super) async fn search_actions(store: &PgStore, s: &ActionSearch) -> Result<ActionPage> {
    s.validate()?;
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT {} FROM dockhand_actions WHERE TRUE",
        summary_columns()
    ));
    push_filters(&mut qb, s)?;
    let cols = key_columns(s.sort);
    // Walk up the keys for an ascending order paging forward, or a descending one paging back.
    let up = s.sort.descending() == s.before.is_some();
    if let Some(c) = s.after.as_ref().or(s.before.as_ref()) {
        push_keyset(&mut qb, cols, &c.keys, up)?;
    }
    let dir = if up { "ASC" } else { "DESC" };
    let order: Vec<String> = cols.iter().map(|c| format!("{c} {dir}")).collect();
    qb.push(format!(" ORDER BY {} LIMIT ", order.join(", ")))
        .push_bind(s.limit + 1);
    let rows = qb
        .build()
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("search actions"))?;
    let rows = rows
        .iter()
        .map(summary_from_row)
        .collect::<Result<Vec<_>>>()?;
    Ok(ActionPage::assemble(s, rows))
}

pub(super) async fn count_actions(store: &PgStore, s: &ActionSearch, cap: i64) -> Result<Capped> {
    s.validate()?;
    let cap = cap.max(0);
    let mut qb: QueryBuilder<Postgres> =
        QueryBuilder::new("SELECT COUNT(*) FROM (SELECT 1 FROM dockhand_actions WHERE TRUE");
    push_filters(&mut qb, s)?;
    qb.push(" LIMIT ").push_bind(cap + 1).push(") AS capped");
    let n: i64 = qb
        .build_query_scalar()
        .fetch_one(&store.pool)
        .await
        .map_err(Error::db("count actions"))?;
    Ok(Capped {
        n: n.min(cap),
        capped: n > cap,
    })
}

pub(super) async fn throughput(
    store: &PgStore,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    bucket: chrono::Duration,
) -> Result<Vec<ThroughputBucket>> {
    let (first, count, width) = bucket_window(since, until, bucket)?;
    // Stored times are whole milliseconds, so the epoch in ms is an exact numeric.
    let rows = sqlx::query(
        "SELECT floor(extract(epoch FROM finished_at) * 1000 / $1)::bigint AS b,
                count(*) FILTER (WHERE status = 'complete') AS completed,
                count(*) FILTER (WHERE status = 'failed') AS failed
         FROM dockhand_actions
         WHERE status IN ('complete', 'failed') AND finished_at >= $2 AND finished_at < $3
         GROUP BY 1",
    )
    .bind(width)
    .bind(key_time(first * width)?)
    .bind(key_time((first + count) * width)?)
    .fetch_all(&store.pool)
    .await
    .map_err(Error::db("throughput"))?;
    let rows = rows
        .iter()
        .map(|r| {
            let d = || Error::db("decode throughput");
            Ok((
                r.try_get("b").map_err(d())?,
                r.try_get("completed").map_err(d())?,
                r.try_get("failed").map_err(d())?,
            ))
        })
        .collect::<Result<Vec<(i64, i64, i64)>>>()?;
    Ok(fill_buckets(first, count, width, &rows))
}

pub(super) async fn logs_tail(store: &PgStore, id: i64, limit: i64) -> Result<Vec<ActionLog>> {
    let sql = format!(
        "SELECT action_id, at, event, detail FROM (
             SELECT k, t, action_id, at, event, detail FROM ({LOG_FROM_ROW}
                 UNION ALL
                 SELECT k, t, action_id, at, event, detail FROM (
                     SELECT {STORED_LOG_KEY} AS k, id::float8 AS t, action_id, at, event, detail
                     FROM dockhand_action_logs
                     WHERE action_id = $1 ORDER BY k DESC, t DESC LIMIT $2
                 ) AS recent
             ) AS merged ORDER BY k DESC, t DESC LIMIT $2
         ) AS tail ORDER BY k, t"
    );
    let rows = sqlx::query(&sql)
        .bind(id)
        .bind(limit.max(0))
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("logs tail"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("decode log");
            Ok(ActionLog {
                action_id: r.try_get("action_id").map_err(d())?,
                at: r.try_get("at").map_err(d())?,
                event: r.try_get("event").map_err(d())?,
                detail: r.try_get("detail").map_err(d())?,
            })
        })
        .collect()
}

/// The migrations table is looked up on the search path, so a store confined to a schema
/// (`PgStore::connect_in_schema`) reads its own.
pub(super) async fn schema_version(store: &PgStore) -> Result<i64> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&store.pool)
        .await
        .map_err(Error::db("schema version"))?;
    if !exists {
        return Ok(0);
    }
    sqlx::query_scalar(
        "SELECT COALESCE(MAX(version), 0)::bigint FROM _sqlx_migrations WHERE success",
    )
    .fetch_one(&store.pool)
    .await
    .map_err(Error::db("schema version"))
}

/// Logs `event` with `detail` for each of `ids`, in the caller's transaction.
async fn log_many(
    conn: &mut PgConnection,
    ids: &[i64],
    now: DateTime<Utc>,
    event: &str,
    detail: &str,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
         SELECT unnest($1::bigint[]), $2, $3, $4",
    )
    .bind(ids)
    .bind(ts(now))
    .bind(event)
    .bind(detail)
    .execute(conn)
    .await
    .map_err(Error::db("log bulk change"))?;
    Ok(())
}

pub(super) async fn cancel_many(
    store: &PgStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin("cancel many").await?;
    let changed: Vec<i64> = sqlx::query_scalar(concat!(
        "UPDATE dockhand_actions SET status = 'canceled', finished_at = $1,
         lease_owner = NULL, lease_until = NULL
         WHERE id = ANY($2) AND status IN ('pending', 'running') AND hook NOT IN ",
        job_owned_hooks!(),
        " RETURNING id"
    ))
    .bind(ts(now))
    .bind(ids)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("cancel many"))?;
    log_many(&mut tx, &changed, now, "canceled", actor).await?;
    tx.commit().await.map_err(Error::db("cancel many"))?;
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn retry_many(
    store: &PgStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin("retry many").await?;
    // Lock the candidates; the unkeyed ones go back in one statement.
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT id, unique_key FROM dockhand_actions
         WHERE id = ANY($1) AND status IN ('failed', 'canceled')
         ORDER BY id FOR UPDATE",
    )
    .bind(ids)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("retry many"))?;
    let plain: Vec<i64> = rows
        .iter()
        .filter(|(_, k)| k.is_none())
        .map(|(id, _)| *id)
        .collect();
    let mut changed: Vec<i64> = sqlx::query_scalar(
        "UPDATE dockhand_actions SET status = 'pending', attempt = 0, scheduled_at = $1,
         finished_at = NULL
         WHERE id = ANY($2) AND status IN ('failed', 'canceled')
         RETURNING id",
    )
    .bind(ts(now))
    .bind(&plain)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("retry many"))?;
    // Keyed rows one at a time, in the order given, each under a savepoint: a key another
    // active action holds (or an earlier id of this list took back) skips that row. NOT EXISTS
    // skips the visible holders; the savepoint keeps a concurrent enqueue's unique violation
    // from aborting the whole transaction.
    for &id in ids {
        if !rows.iter().any(|(r, k)| *r == id && k.is_some()) || changed.contains(&id) {
            continue;
        }
        let mut sp = tx.begin().await.map_err(Error::db("retry many"))?;
        let done = sqlx::query(
            "UPDATE dockhand_actions AS a SET status = 'pending', attempt = 0,
             scheduled_at = $1, finished_at = NULL
             WHERE id = $2 AND status IN ('failed', 'canceled')
               AND NOT EXISTS (SELECT 1 FROM dockhand_actions b
                   WHERE b.unique_key = a.unique_key AND b.status IN ('pending', 'running'))",
        )
        .bind(ts(now))
        .bind(id)
        .execute(&mut *sp)
        .await;
        match done {
            Ok(done) => {
                sp.commit().await.map_err(Error::db("retry many"))?;
                if done.rows_affected() == 1 {
                    changed.push(id);
                }
            }
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                sp.rollback().await.map_err(Error::db("retry many"))?;
            }
            Err(e) => return Err(Error::db("retry many")(e)),
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
    if !changed.is_empty() {
        listen::notify(&mut tx, Some(&store.channel)).await?;
    }
    tx.commit().await.map_err(Error::db("retry many"))?;
    if !changed.is_empty() {
        store.notify();
    }
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn run_now(
    store: &PgStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin("run now").await?;
    let changed: Vec<i64> = sqlx::query_scalar(
        "UPDATE dockhand_actions SET scheduled_at = $1
         WHERE id = ANY($2) AND status = 'pending' AND scheduled_at > $1
         RETURNING id",
    )
    .bind(ts(now))
    .bind(ids)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("run now"))?;
    log_many(&mut tx, &changed, now, "run_now", actor).await?;
    if !changed.is_empty() {
        listen::notify(&mut tx, Some(&store.channel)).await?;
    }
    tx.commit().await.map_err(Error::db("run now"))?;
    if !changed.is_empty() {
        store.notify();
    }
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn delete_actions(store: &PgStore, ids: &[i64]) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    let mut tx = store.begin("delete actions").await?;
    let changed: Vec<i64> = sqlx::query_scalar(concat!(
        "DELETE FROM dockhand_actions WHERE id = ANY($1) AND status <> 'running'
           AND NOT (status = 'pending' AND hook IN ",
        job_owned_hooks!(),
        ") RETURNING id"
    ))
    .bind(ids)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("delete actions"))?;
    sqlx::query("DELETE FROM dockhand_action_logs WHERE action_id = ANY($1)")
        .bind(&changed)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("delete actions (logs)"))?;
    tx.commit().await.map_err(Error::db("delete actions"))?;
    Ok(operator::outcome(ids, changed))
}
