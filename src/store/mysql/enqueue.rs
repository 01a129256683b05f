//! MySQL: inserting actions (single, unique, bulk, inside a caller's transaction).
//!
//! Unique actions (Q6): the key goes into `active_key` (UNIQUE) as well as `unique_key`. An
//! enqueue first looks for the active holder of the key; when there is none it inserts, and a
//! duplicate-key error (an enqueuer racing on the same key committed first) makes it look again,
//! so a duplicate always resolves to the existing id and never surfaces as an error.
//!
//! Bulk inserts cannot trust `LAST_INSERT_ID()` beyond the first row (ids need not be
//! consecutive with `innodb_autoinc_lock_mode = 2`): each chunk is inserted with a marker in
//! `lease_owner` (NULL for every pending action otherwise), its ids are read back by that marker
//! in id order (a statement assigns increasing ids in VALUES order), and the marker is cleared
//! in the same transaction, so no other session ever sees it.

use super::{ms, retry_deadlocks, MySqlStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::Enqueued;
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder};

/// Bound parameters per bulk-inserted row; chunks stay under MySQL's 65,535-parameter limit.
const PARAMS_PER_ROW: usize = 10;
/// Rows per bulk INSERT statement at most.
const BULK_ROWS: usize = 2_000;
/// Args bytes per bulk INSERT statement at most (a chunk always takes at least one row), well
/// under the default `max_allowed_packet`.
const BULK_BYTES: usize = 4 * 1024 * 1024;

/// How often a unique enqueue looks for the holder again after losing an insert race whose
/// winner then finished.
const UNIQUE_ATTEMPTS: usize = 5;

/// MySQL's duplicate-key error number.
const ER_DUP_ENTRY: u16 = 1062;

const INSERT_ONE: &str = "INSERT INTO dockhand_actions
    (hook, args, group_name, priority, status, scheduled_at, max_attempts, timeout_ms,
     unique_key, active_key, created_at, schedule_id)
 VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)";

pub(super) async fn enqueue(
    store: &MySqlStore,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    retry_deadlocks("enqueue", || async move {
        let mut tx = store.begin("enqueue").await?;
        let r = enqueue_one(&mut tx, action, now).await?;
        tx.commit().await.map_err(Error::db("enqueue"))?;
        Ok(r)
    })
    .await
}

/// Inserts one action on an open transaction; a unique duplicate yields the active id.
pub(super) async fn enqueue_one(
    conn: &mut MySqlConnection,
    a: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let Some(key) = &a.unique_key else {
        let id = insert_one(conn, a, now).await?;
        return Ok(Enqueued { id, inserted: true });
    };
    for _ in 0..UNIQUE_ATTEMPTS {
        // READ COMMITTED: this sees every holder committed before the statement started.
        let existing: Option<i64> =
            sqlx::query_scalar("SELECT id FROM dockhand_actions WHERE active_key = ?")
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(Error::db("enqueue (find duplicate)"))?;
        if let Some(id) = existing {
            return Ok(Enqueued {
                id,
                inserted: false,
            });
        }
        match insert_one(conn, a, now).await {
            Ok(id) => return Ok(Enqueued { id, inserted: true }),
            // Another enqueuer committed the key first (only this statement was rolled back):
            // look for it again.
            Err(e) if is_duplicate(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Database {
        op: "enqueue (find duplicate)",
        source: sqlx::Error::RowNotFound,
    })
}

async fn insert_one(
    conn: &mut MySqlConnection,
    a: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<i64> {
    let done = sqlx::query(INSERT_ONE)
        .bind(&a.hook)
        .bind(&a.args_json)
        .bind(&a.group)
        .bind(a.priority)
        .bind(ms(a.scheduled_at))
        .bind(a.max_attempts)
        .bind(a.timeout_ms)
        .bind(&a.unique_key)
        .bind(a.unique_key.as_deref().map(str::as_bytes))
        .bind(ms(now))
        .bind(a.schedule_id)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("enqueue"))?;
    i64::try_from(done.last_insert_id()).map_err(|_| {
        Error::Config(format!(
            "enqueue: LAST_INSERT_ID {} out of range",
            done.last_insert_id()
        ))
    })
}

/// True for a duplicate-key error.
fn is_duplicate(e: &Error) -> bool {
    let Error::Database {
        source: sqlx::Error::Database(db),
        ..
    } = e
    else {
        return false;
    };
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .is_some_and(|m| m.number() == ER_DUP_ENTRY)
}

pub(super) async fn enqueue_bulk(
    store: &MySqlStore,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    retry_deadlocks("enqueue_bulk", || async move {
        let mut tx = store.begin("enqueue_bulk").await?;
        let r = bulk_on(&mut tx, actions, now).await?;
        tx.commit().await.map_err(Error::db("enqueue_bulk"))?;
        Ok(r)
    })
    .await
}

async fn bulk_on(
    conn: &mut MySqlConnection,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    let mut results: Vec<Option<Enqueued>> = vec![None; actions.len()];
    // Unique actions go one by one (each may resolve to an existing id); the rest in chunks.
    let plain: Vec<usize> = (0..actions.len())
        .filter(|&i| actions[i].unique_key.is_none())
        .collect();
    for (i, a) in actions.iter().enumerate() {
        if a.unique_key.is_some() {
            results[i] = Some(enqueue_one(conn, a, now).await?);
        }
    }
    for chunk in chunks(&plain, actions) {
        let ids = insert_chunk(conn, chunk, actions, now).await?;
        for (&i, id) in chunk.iter().zip(ids) {
            results[i] = Some(Enqueued { id, inserted: true });
        }
    }
    Ok(results.into_iter().flatten().collect())
}

/// Splits `plain` (indexes into `actions`) into chunks bounded by rows, parameters and bytes.
fn chunks<'a>(plain: &'a [usize], actions: &[PreparedAction]) -> Vec<&'a [usize]> {
    let max_rows = BULK_ROWS.min(65_000 / PARAMS_PER_ROW);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (n, &i) in plain.iter().enumerate() {
        let size = actions[i].args_json.len() + actions[i].hook.len() + 64;
        if n > start && (n - start >= max_rows || bytes + size > BULK_BYTES) {
            out.push(&plain[start..n]);
            start = n;
            bytes = 0;
        }
        bytes += size;
    }
    if start < plain.len() {
        out.push(&plain[start..]);
    }
    out
}

/// Inserts one chunk of plain actions and returns their ids in chunk order.
async fn insert_chunk(
    conn: &mut MySqlConnection,
    chunk: &[usize],
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<i64>> {
    let marker = format!("dockhand-bulk:{}", uuid::Uuid::new_v4().simple());
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "INSERT INTO dockhand_actions (hook, args, group_name, priority, status, scheduled_at,
         max_attempts, timeout_ms, created_at, schedule_id, lease_owner) ",
    );
    qb.push_values(chunk, |mut b, &i| {
        let a = &actions[i];
        b.push_bind(&a.hook)
            .push_bind(&a.args_json)
            .push_bind(&a.group)
            .push_bind(a.priority)
            .push("'pending'")
            .push_bind(ms(a.scheduled_at))
            .push_bind(a.max_attempts)
            .push_bind(a.timeout_ms)
            .push_bind(ms(now))
            .push_bind(a.schedule_id)
            .push_bind(&marker);
    });
    let done = qb
        .build()
        .execute(&mut *conn)
        .await
        .map_err(Error::db("enqueue_bulk"))?;
    let first = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM dockhand_actions WHERE id >= ? AND lease_owner = ? ORDER BY id",
    )
    .bind(first)
    .bind(&marker)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("enqueue_bulk (read ids)"))?;
    if ids.len() != chunk.len() {
        return Err(Error::Config(format!(
            "bulk insert read back {} ids for {} rows",
            ids.len(),
            chunk.len()
        )));
    }
    sqlx::query("UPDATE dockhand_actions SET lease_owner = NULL WHERE id >= ? AND lease_owner = ?")
        .bind(first)
        .bind(&marker)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("enqueue_bulk (clear marker)"))?;
    Ok(ids)
}

/// The group of `parent`'s chunk and finalize actions ([`crate::batch::action_group`]): its
/// pipeline's group, read in the caller's transaction.
pub(super) async fn batch_group(conn: &mut MySqlConnection, parent: i64) -> Result<String> {
    let row = sqlx::query("SELECT pipeline FROM dockhand_jobs WHERE id = ?")
        .bind(parent)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::db("batch_group"))?;
    let pipeline = match row {
        Some(r) => Some(super::jobs::text(&r, "pipeline")?),
        None => None,
    };
    Ok(crate::batch::action_group(pipeline.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(args_len: usize) -> PreparedAction {
        PreparedAction {
            hook: "h".into(),
            args_json: "x".repeat(args_len),
            group: None,
            priority: 10,
            scheduled_at: DateTime::<Utc>::MIN_UTC,
            max_attempts: 1,
            timeout_ms: None,
            unique_key: None,
            schedule_id: None,
        }
    }

    #[test]
    fn chunks_are_bounded_by_rows_and_bytes() {
        let actions: Vec<PreparedAction> = (0..5_001).map(|_| action(2)).collect();
        let plain: Vec<usize> = (0..actions.len()).collect();
        let sizes: Vec<usize> = chunks(&plain, &actions).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [2_000, 2_000, 1_001]);
        let big: Vec<PreparedAction> = (0..3).map(|_| action(BULK_BYTES)).collect();
        let plain: Vec<usize> = (0..big.len()).collect();
        let sizes: Vec<usize> = chunks(&plain, &big).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [1, 1, 1]);
        assert!(chunks(&[], &big).is_empty());
    }
}
