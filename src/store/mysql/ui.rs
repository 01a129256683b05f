//! MySQL / MariaDB: the operator views (keyset action search, capped counts, throughput, log
//! tail, schema version) and the bulk changes (cancel, retry, run now, delete) the dashboard
//! uses. Each sort walks its own index (migrations 0001 and 0005, all leading with `status`);
//! no query uses OFFSET. There is no `UPDATE/DELETE … RETURNING`: a bulk change selects its
//! ids `FOR UPDATE` first, in one transaction run inside [`retry_deadlocks`].

use super::args_match::push_args_contains;
use super::claim::{push_in, push_list};
use super::query::{LOG_FROM_ROW, LOG_FROM_ROW_BINDS};
use super::{from_ms, ms, opt_text, retry_deadlocks, text, MySqlStore};
use crate::action::ActionLog;
use crate::error::{Error, Result};
use crate::search::{ActionPage, ActionSearch, ActionSummary, HEAD_CHARS, INTERNAL_HOOK_PREFIX};
use crate::state::ActionStatus;
use crate::store::operator::job_owned_hooks;
use crate::store::operator::{self, bucket_window, check_bulk_ids, fill_buckets, key_columns};
use crate::store::{BulkOutcome, Capped, ThroughputBucket};
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

/// Appends the search's filters (not its cursor) as ` AND …` conditions.
fn push_filters(qb: &mut QueryBuilder<'_, MySql>, s: &ActionSearch) -> Result<()> {
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
    let col = operator::time_column(s.sort);
    if let Some(from) = s.from {
        qb.push(format!(" AND {col} >= ")).push_bind(ms(from));
    }
    if let Some(to) = s.to {
        qb.push(format!(" AND {col} < ")).push_bind(ms(to));
    }
    if s.exclude_internal {
        qb.push(format!(
            " AND LEFT(hook, {}) <> ",
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

/// Appends the keyset condition `(keys) > (cursor)` (or `<`) as a disjunction of prefix
/// equalities, `a > x OR (a = x AND b > y) OR (a = x AND b = y AND id > z)`, which the range
/// optimizer turns into disjoint intervals over every column of the sort's index (EXPLAIN:
/// the whole key length). The `a >= x AND (a > x OR …)` form bounds only the first column,
/// so a page deep inside one priority would re-read that priority's head.
fn push_keyset(
    qb: &mut QueryBuilder<'_, MySql>,
    cols: &[&str],
    keys: &[i64],
    up: bool,
) -> Result<()> {
    if cols.is_empty() || cols.len() != keys.len() {
        return Err(Error::invalid(
            "cursor",
            format!("{} keys for a sort of {}", keys.len(), cols.len()),
        ));
    }
    let op = if up { ">" } else { "<" };
    qb.push(" AND (");
    for i in 0..cols.len() {
        if i > 0 {
            qb.push(" OR ");
        }
        qb.push("(");
        for (c, k) in cols.iter().zip(keys).take(i) {
            qb.push(format!("{c} = ")).push_bind(*k).push(" AND ");
        }
        qb.push(format!("{} {op} ", cols[i])).push_bind(keys[i]);
        qb.push(")");
    }
    qb.push(")");
    Ok(())
}

pub(super) fn summary_from_row(row: &MySqlRow) -> Result<ActionSummary> {
    let d = || Error::db("decode action summary");
    let id: i64 = row.try_get("id").map_err(d())?;
    let status = text(row, "status").map_err(d())?;
    let opt_time = |c: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row.try_get::<Option<i64>, _>(c).map_err(d())?.map(from_ms))
    };
    Ok(ActionSummary {
        id,
        hook: text(row, "hook").map_err(d())?,
        group: opt_text(row, "group_name").map_err(d())?,
        status: status.parse::<ActionStatus>().map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: e.to_string(),
        })?,
        priority: row.try_get("priority").map_err(d())?,
        scheduled_at: from_ms(row.try_get("scheduled_at").map_err(d())?),
        attempt: row.try_get("attempt").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
        unique_key: opt_text(row, "unique_key").map_err(d())?,
        lease_owner: opt_text(row, "lease_owner").map_err(d())?,
        lease_until: opt_time("lease_until")?,
        finished_at: opt_time("finished_at")?,
        args_head: text(row, "args_head").map_err(d())?,
        error_head: opt_text(row, "error_head").map_err(d())?,
    })
}

/// The columns [`summary_from_row`] reads, args and error cut to their heads.
pub(super) fn summary_columns() -> String {
    format!(
        "id, hook, group_name, status, priority, scheduled_at, attempt, max_attempts,
         unique_key, lease_owner, lease_until, finished_at,
         LEFT(args, {HEAD_CHARS}) AS args_head,
         LEFT(last_error, {HEAD_CHARS}) AS error_head"
    )
}

pub(super) async fn search_actions(store: &MySqlStore, s: &ActionSearch) -> Result<ActionPage> {
    s.validate()?;
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(format!(
        "SELECT {} FROM dockhand_actions WHERE 1 = 1",
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
        .fetch_all(store.pool())
        .await
        .map_err(Error::db("search actions"))?;
    let rows = rows
        .iter()
        .map(summary_from_row)
        .collect::<Result<Vec<_>>>()?;
    Ok(ActionPage::assemble(s, rows))
}

pub(super) async fn count_actions(
    store: &MySqlStore,
    s: &ActionSearch,
    cap: i64,
) -> Result<Capped> {
    s.validate()?;
    let cap = cap.max(0);
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("SELECT COUNT(*) FROM (SELECT 1 FROM dockhand_actions WHERE 1 = 1");
    push_filters(&mut qb, s)?;
    qb.push(" LIMIT ").push_bind(cap + 1).push(") AS capped");
    let n: i64 = qb
        .build_query_scalar()
        .fetch_one(store.pool())
        .await
        .map_err(Error::db("count actions"))?;
    Ok(Capped {
        n: n.min(cap),
        capped: n > cap,
    })
}

pub(super) async fn throughput(
    store: &MySqlStore,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    bucket: chrono::Duration,
) -> Result<Vec<ThroughputBucket>> {
    let (first, count, width) = bucket_window(since, until, bucket)?;
    // COUNT, not SUM: SUM of an integer expression is DECIMAL here.
    let rows = sqlx::query(
        "SELECT CAST(finished_at DIV ? AS SIGNED) AS b,
                COUNT(CASE WHEN status = 'complete' THEN 1 END) AS completed,
                COUNT(CASE WHEN status = 'failed' THEN 1 END) AS failed
         FROM dockhand_actions
         WHERE status IN ('complete', 'failed') AND finished_at >= ? AND finished_at < ?
         GROUP BY b",
    )
    .bind(width)
    .bind(first * width)
    .bind((first + count) * width)
    .fetch_all(store.pool())
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

pub(super) async fn logs_tail(store: &MySqlStore, id: i64, limit: i64) -> Result<Vec<ActionLog>> {
    let sql = format!(
        "SELECT action_id, at, event, detail FROM (
             SELECT k, action_id, at, event, detail FROM ({LOG_FROM_ROW}
                 UNION ALL
                 SELECT k, action_id, at, event, detail FROM (
                     SELECT id AS k, action_id, at, event, detail FROM dockhand_action_logs
                     WHERE action_id = ? ORDER BY id DESC LIMIT ?
                 ) AS recent
             ) AS merged ORDER BY k DESC LIMIT ?
         ) AS tail ORDER BY k"
    );
    let mut q = sqlx::query(&sql);
    for _ in 0..=LOG_FROM_ROW_BINDS {
        q = q.bind(id);
    }
    let rows = q
        .bind(limit.max(0))
        .bind(limit.max(0))
        .fetch_all(store.pool())
        .await
        .map_err(Error::db("logs tail"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("decode log");
            Ok(ActionLog {
                action_id: r.try_get("action_id").map_err(d())?,
                at: from_ms(r.try_get("at").map_err(d())?),
                event: text(r, "event").map_err(d())?,
                detail: opt_text(r, "detail").map_err(d())?,
            })
        })
        .collect()
}

pub(super) async fn schema_version(store: &MySqlStore) -> Result<i64> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'",
    )
    .fetch_one(store.pool())
    .await
    .map_err(Error::db("schema version"))?;
    if exists == 0 {
        return Ok(0);
    }
    sqlx::query_scalar(
        "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM _sqlx_migrations WHERE success",
    )
    .fetch_one(store.pool())
    .await
    .map_err(Error::db("schema version"))
}

/// Logs `event` with `detail` for each of `ids`, in the caller's transaction.
async fn log_many(
    conn: &mut MySqlConnection,
    ids: &[i64],
    now: DateTime<Utc>,
    event: &str,
    detail: &str,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("INSERT INTO dockhand_action_logs (action_id, at, event, detail) ");
    qb.push_values(ids, |mut b, id| {
        b.push_bind(*id)
            .push_bind(ms(now))
            .push_bind(event.to_owned())
            .push_bind(detail.to_owned());
    });
    qb.build()
        .execute(conn)
        .await
        .map_err(Error::db("log bulk change"))?;
    Ok(())
}

/// The ids among `ids` matching `cond` (a condition on `dockhand_actions`), locked until the
/// transaction ends.
async fn lock_ids(
    conn: &mut MySqlConnection,
    ids: &[i64],
    cond: &str,
    op: &'static str,
) -> Result<Vec<i64>> {
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new("SELECT id FROM dockhand_actions WHERE id");
    push_in(&mut qb, ids);
    qb.push(format!(" AND {cond} ORDER BY id FOR UPDATE"));
    qb.build_query_scalar()
        .fetch_all(conn)
        .await
        .map_err(Error::db(op))
}

/// Runs `UPDATE dockhand_actions SET <set> WHERE id IN (ids)` (nothing for no ids), with
/// `now` bound to the one `?` of `set`.
async fn update_ids(
    conn: &mut MySqlConnection,
    set: &str,
    now: DateTime<Utc>,
    ids: &[i64],
    op: &'static str,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let (head, tail) = set.split_once('?').unwrap_or((set, ""));
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new("UPDATE dockhand_actions SET ");
    qb.push(head).push_bind(ms(now)).push(tail);
    qb.push(" WHERE id");
    push_in(&mut qb, ids);
    qb.build().execute(conn).await.map_err(Error::db(op))?;
    Ok(())
}

pub(super) async fn cancel_many(
    store: &MySqlStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    if ids.is_empty() {
        return Ok(BulkOutcome::default());
    }
    let changed = retry_deadlocks("cancel many", || async move {
        let mut tx = store.begin("cancel many").await?;
        let changed = lock_ids(
            &mut tx,
            ids,
            concat!(
                "status IN ('pending', 'running') AND hook NOT IN ",
                job_owned_hooks!()
            ),
            "cancel many",
        )
        .await?;
        update_ids(
            &mut tx,
            "status = 'canceled', finished_at = ?, lease_owner = NULL, lease_until = NULL,
             active_key = NULL",
            now,
            &changed,
            "cancel many",
        )
        .await?;
        log_many(&mut tx, &changed, now, "canceled", actor).await?;
        tx.commit().await.map_err(Error::db("cancel many"))?;
        Ok(changed)
    })
    .await?;
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn retry_many(
    store: &MySqlStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    if ids.is_empty() {
        return Ok(BulkOutcome::default());
    }
    let set = "status = 'pending', attempt = 0, scheduled_at = ?, finished_at = NULL,
               active_key = unique_key";
    let changed = retry_deadlocks("retry many", || async move {
        let mut tx = store.begin("retry many").await?;
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "SELECT id, unique_key IS NOT NULL FROM dockhand_actions WHERE id IN (",
        );
        push_list(&mut qb, ids);
        qb.push(") AND status IN ('failed', 'canceled') ORDER BY id FOR UPDATE");
        let rows: Vec<(i64, bool)> = qb
            .build_query_as()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("retry many"))?;
        let mut changed: Vec<i64> = rows.iter().filter(|r| !r.1).map(|r| r.0).collect();
        update_ids(&mut tx, set, now, &changed, "retry many").await?;
        // Keyed rows one at a time, in the order given: a key another active action holds (or
        // an earlier id of this list took back) fails that row's statement with a duplicate
        // in `active_key`, which InnoDB rolls back alone; the row is skipped.
        for &id in ids {
            if !rows.iter().any(|&(r, keyed)| r == id && keyed) || changed.contains(&id) {
                continue;
            }
            let done = sqlx::query(&format!(
                "UPDATE dockhand_actions SET {set}
                 WHERE id = ? AND status IN ('failed', 'canceled')"
            ))
            .bind(ms(now))
            .bind(id)
            .execute(&mut *tx)
            .await;
            match done {
                Ok(done) if done.rows_affected() == 1 => changed.push(id),
                Ok(_) => {}
                Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {}
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
        tx.commit().await.map_err(Error::db("retry many"))?;
        Ok(changed)
    })
    .await?;
    if !changed.is_empty() {
        store.notify();
    }
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn run_now(
    store: &MySqlStore,
    ids: &[i64],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    if ids.is_empty() {
        return Ok(BulkOutcome::default());
    }
    let changed = retry_deadlocks("run now", || async move {
        let mut tx = store.begin("run now").await?;
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("SELECT id FROM dockhand_actions WHERE id");
        push_in(&mut qb, ids);
        qb.push(" AND status = 'pending' AND scheduled_at > ")
            .push_bind(ms(now))
            .push(" ORDER BY id FOR UPDATE");
        let changed: Vec<i64> = qb
            .build_query_scalar()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("run now"))?;
        update_ids(&mut tx, "scheduled_at = ?", now, &changed, "run now").await?;
        log_many(&mut tx, &changed, now, "run_now", actor).await?;
        tx.commit().await.map_err(Error::db("run now"))?;
        Ok(changed)
    })
    .await?;
    if !changed.is_empty() {
        store.notify();
    }
    Ok(operator::outcome(ids, changed))
}

pub(super) async fn delete_actions(store: &MySqlStore, ids: &[i64]) -> Result<BulkOutcome> {
    check_bulk_ids(ids)?;
    if ids.is_empty() {
        return Ok(BulkOutcome::default());
    }
    let changed = retry_deadlocks("delete actions", || async move {
        let mut tx = store.begin("delete actions").await?;
        let changed = lock_ids(
            &mut tx,
            ids,
            concat!(
                "status <> 'running' AND NOT (status = 'pending' AND hook IN ",
                job_owned_hooks!(),
                ")"
            ),
            "delete actions",
        )
        .await?;
        if !changed.is_empty() {
            for (table, col) in [
                ("dockhand_actions", "id"),
                ("dockhand_action_logs", "action_id"),
            ] {
                let mut qb: QueryBuilder<MySql> =
                    QueryBuilder::new(format!("DELETE FROM {table} WHERE {col} IN ("));
                push_list(&mut qb, &changed);
                qb.push(")");
                qb.build()
                    .execute(&mut *tx)
                    .await
                    .map_err(Error::db("delete actions"))?;
            }
        }
        tx.commit().await.map_err(Error::db("delete actions"))?;
        Ok(changed)
    })
    .await?;
    Ok(operator::outcome(ids, changed))
}
