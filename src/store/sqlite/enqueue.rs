//! SQLite: inserting actions (single, unique, bulk, inside a caller's transaction). An
//! action's `created` log entry is its row's `created_at` (no log row is written; see
//! [`crate::action::ActionLog`]).
//! Single enqueues from concurrent callers are group-committed. A file database's enqueues
//! run on its enqueue connection (rusqlite, a thread of its own; see `direct`); an in-memory
//! one's, and an enqueue inside a caller's or the store's own transaction, through sqlx.

use super::direct::{db_error, Connection as DirectConn};
use super::writer::Writer;
use super::{hot, ms, SqliteStore};
use crate::action::PreparedAction;
use crate::error::{Error, Result};
use crate::store::Enqueued;
use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, TransactionBehavior};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use std::sync::Arc;

const INSERT_ONE: &str = "INSERT INTO dockhand_actions
    (hook, args, group_name, priority, status, scheduled_at, max_attempts, timeout_ms,
     unique_key, created_at, schedule_id)
 VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)
 ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
 DO NOTHING";

/// Bound parameters per inserted row; chunks stay under SQLite's 32,766-parameter limit.
const PARAMS_PER_ROW: usize = 10;
const MAX_PARAMS: usize = 32_000;

/// The largest batch of single enqueues written inline (see `direct`).
const INLINE_BATCH: usize = 64;

/// How often a single enqueue re-tries when its duplicate finished between the insert and the
/// look-up (possible only with a writer in another process).
const DUPLICATE_RACE_TRIES: usize = 8;

/// One enqueue, group-committed with concurrent callers' (see [`crate::store::group_commit`]):
/// alone or with the others queued meanwhile, one write transaction, on a file database run
/// inline on the caller's thread (see `direct`). Returns once the transaction carrying it has
/// committed.
pub(super) async fn enqueue(
    store: &SqliteStore,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let writer = store.writer_handle();
    store
        .enqueues
        .submit((action.clone(), now), move |batch| {
            let writer = writer.clone();
            async move { write_batch(&writer, batch).await }
        })
        .await
}

/// Writes queued single enqueues: one alone, several in one transaction (falling back to one
/// at a time if that fails, so one bad row cannot fail its neighbours). A file database writes
/// them on its enqueue connection (see `direct`), one job for the whole batch.
async fn write_batch(
    writer: &Writer,
    batch: Vec<(PreparedAction, DateTime<Utc>)>,
) -> Vec<Result<Enqueued>> {
    let n = batch.len();
    if writer.has_direct() {
        // A batch this small is written in tens of microseconds: inline, unless the file's
        // write lock is taken (see `direct`).
        let rows = Arc::new(batch);
        let on_thread = || {
            let rows = Arc::clone(&rows);
            move |conn: &mut DirectConn| Ok(direct_batch(conn, &rows))
        };
        let written = writer
            .direct_inline_first(
                "enqueue",
                n <= INLINE_BATCH,
                |conn| {
                    rows.iter()
                        .map(|(a, now)| direct_one(conn, a, *now).map(Ok))
                        .collect()
                },
                on_thread,
            )
            .await;
        return match written {
            Ok(results) => results,
            // The store was closed (or the connection's thread is gone): nothing was written.
            Err(e) => std::iter::once(Err(e))
                .chain((1..n).map(|_| {
                    Err(Error::Database {
                        op: "enqueue",
                        source: sqlx::Error::PoolClosed,
                    })
                }))
                .collect(),
        };
    }
    if n > 1 {
        let rows: Vec<(&PreparedAction, DateTime<Utc>)> =
            batch.iter().map(|(a, now)| (a, *now)).collect();
        let together = async {
            let mut tx = writer.begin("enqueue").await?;
            let ids = enqueue_rows(&mut tx, &rows).await?;
            tx.commit().await.map_err(Error::db("enqueue"))?;
            Ok::<_, Error>(ids)
        };
        match together.await {
            Ok(ids) => return ids.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::debug!(error = %e, size = n, "group-committed enqueue failed; writing one by one");
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    for (action, now) in batch.iter() {
        out.push(enqueue_alone(writer, action, *now).await);
    }
    out
}

/// [`write_batch`] on the enqueue connection's thread.
fn direct_batch(
    conn: &mut DirectConn,
    batch: &[(PreparedAction, DateTime<Utc>)],
) -> Vec<Result<Enqueued>> {
    if batch.len() > 1 {
        let together = (|| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db_error("enqueue"))?;
            let ids = batch
                .iter()
                .map(|(a, now)| direct_one(&tx, a, *now))
                .collect::<Result<Vec<_>>>()?;
            tx.commit().map_err(db_error("enqueue"))?;
            Ok::<_, Error>(ids)
        })();
        match together {
            Ok(ids) => return ids.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::debug!(error = %e, size = batch.len(), "group-committed enqueue failed; writing one by one");
            }
        }
    }
    batch
        .iter()
        .map(|(a, now)| direct_alone(conn, a, *now))
        .collect()
}

/// One enqueue in autocommit mode: the insert is the only statement on the success path.
async fn enqueue_alone(
    writer: &Writer,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let mut conn = writer.conn("enqueue").await?;
    for _ in 0..DUPLICATE_RACE_TRIES {
        if let Some(id) = insert(&mut conn, action, now).await? {
            return Ok(Enqueued { id, inserted: true });
        }
        if let Some(id) = active_duplicate(&mut conn, action).await? {
            return Ok(Enqueued {
                id,
                inserted: false,
            });
        }
    }
    Err(duplicate_kept_finishing(action))
}

/// [`enqueue_alone`] on the enqueue connection.
fn direct_alone(
    conn: &DirectConn,
    action: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    for _ in 0..DUPLICATE_RACE_TRIES {
        if let Some(id) = direct_insert(conn, action, now)? {
            return Ok(Enqueued { id, inserted: true });
        }
        if let Some(id) = direct_duplicate(conn, action)? {
            return Ok(Enqueued {
                id,
                inserted: false,
            });
        }
    }
    Err(duplicate_kept_finishing(action))
}

fn duplicate_kept_finishing(action: &PreparedAction) -> Error {
    Error::Config(format!(
        "enqueue of `{}`: its unique duplicate kept finishing between insert and look-up",
        action.hook
    ))
}

fn conflict_without_duplicate(action: &PreparedAction) -> Error {
    Error::Config(format!(
        "enqueue of `{}`: unique conflict without an active duplicate",
        action.hook
    ))
}

/// Inserts one action on an open write transaction; a unique duplicate yields the active id.
pub(super) async fn enqueue_one(
    conn: &mut SqliteConnection,
    a: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    if let Some(id) = insert(conn, a, now).await? {
        return Ok(Enqueued { id, inserted: true });
    }
    // Inside the same write transaction, so the conflicting row is still active.
    match active_duplicate(conn, a).await? {
        Some(id) => Ok(Enqueued {
            id,
            inserted: false,
        }),
        None => Err(conflict_without_duplicate(a)),
    }
}

/// [`enqueue_one`] on the enqueue connection, inside its open transaction.
fn direct_one(conn: &DirectConn, a: &PreparedAction, now: DateTime<Utc>) -> Result<Enqueued> {
    if let Some(id) = direct_insert(conn, a, now)? {
        return Ok(Enqueued { id, inserted: true });
    }
    match direct_duplicate(conn, a)? {
        Some(id) => Ok(Enqueued {
            id,
            inserted: false,
        }),
        None => Err(conflict_without_duplicate(a)),
    }
}

/// The insert; `None` when a unique duplicate is active. The id is the connection's last
/// inserted rowid rather than a `RETURNING` row: sqlx hands a returned row from its worker
/// thread as a message of its own, one more thread wake-up per enqueue.
async fn insert(
    conn: &mut SqliteConnection,
    a: &PreparedAction,
    now: DateTime<Utc>,
) -> Result<Option<i64>> {
    let done = sqlx::query(INSERT_ONE)
        .bind(&a.hook)
        .bind(&a.args_json)
        .bind(&a.group)
        .bind(a.priority)
        .bind(ms(a.scheduled_at))
        .bind(a.max_attempts)
        .bind(a.timeout_ms)
        .bind(&a.unique_key)
        .bind(ms(now))
        .bind(a.schedule_id)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("enqueue"))?;
    Ok((done.rows_affected() == 1).then(|| done.last_insert_rowid()))
}

/// [`insert`] on the enqueue connection (its prepared statement is cached).
fn direct_insert(conn: &DirectConn, a: &PreparedAction, now: DateTime<Utc>) -> Result<Option<i64>> {
    let inserted = conn
        .prepare_cached(INSERT_ONE)
        .and_then(|mut st| {
            st.execute(rusqlite::params![
                a.hook,
                a.args_json,
                a.group,
                a.priority,
                ms(a.scheduled_at),
                a.max_attempts,
                a.timeout_ms,
                a.unique_key,
                ms(now),
                a.schedule_id,
            ])
        })
        .map_err(db_error("enqueue"))?;
    Ok((inserted == 1).then(|| conn.last_insert_rowid()))
}

const ACTIVE_DUPLICATE: &str = "SELECT id FROM dockhand_actions
     WHERE unique_key = ? AND status IN ('pending', 'running')";

/// The active (pending or running) action holding `a`'s unique key.
async fn active_duplicate(conn: &mut SqliteConnection, a: &PreparedAction) -> Result<Option<i64>> {
    sqlx::query_scalar(ACTIVE_DUPLICATE)
        .bind(&a.unique_key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::db("enqueue (find duplicate)"))
}

/// [`active_duplicate`] on the enqueue connection.
fn direct_duplicate(conn: &DirectConn, a: &PreparedAction) -> Result<Option<i64>> {
    conn.prepare_cached(ACTIVE_DUPLICATE)
        .and_then(|mut st| {
            st.query_row([&a.unique_key], |row| row.get::<_, i64>(0))
                .optional()
        })
        .map_err(db_error("enqueue (find duplicate)"))
}

/// Many enqueues in one transaction; results in input order. A file database writes them on
/// its enqueue connection's thread (see `direct`) in cached multi-row statements bound in
/// place (one cached single-row insert per action was slower than sqlx's multi-row
/// statements: W1b 280k → 200k rows/s).
pub(super) async fn enqueue_bulk(
    store: &SqliteStore,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    let writer = store.writer_handle();
    if writer.has_direct() {
        let actions = actions.to_vec();
        return writer
            .direct("enqueue_bulk", move |conn| {
                hot::in_tx(conn, "enqueue_bulk", |tx| direct_rows(tx, &actions, now))
            })
            .await;
    }
    let rows: Vec<(&PreparedAction, DateTime<Utc>)> = actions.iter().map(|a| (a, now)).collect();
    let mut tx = store.begin_write("enqueue_bulk").await?;
    let results = enqueue_rows(&mut tx, &rows).await?;
    tx.commit().await.map_err(Error::db("enqueue_bulk"))?;
    Ok(results)
}

/// Inserts `rows` (each with its enqueue time) on an open write transaction; results in input
/// order. Unique actions go one by one (each may resolve to an existing id); the rest in
/// multi-row statements.
async fn enqueue_rows(
    tx: &mut SqliteConnection,
    rows: &[(&PreparedAction, DateTime<Utc>)],
) -> Result<Vec<Enqueued>> {
    let mut results: Vec<Option<Enqueued>> = vec![None; rows.len()];
    let plain: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].0.unique_key.is_none())
        .collect();
    for (i, (a, now)) in rows.iter().enumerate() {
        if a.unique_key.is_some() {
            results[i] = Some(enqueue_one(tx, a, *now).await?);
        }
    }
    for chunk in plain.chunks(MAX_PARAMS / PARAMS_PER_ROW) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO dockhand_actions (hook, args, group_name, priority, status, scheduled_at,
             max_attempts, timeout_ms, created_at, schedule_id) ",
        );
        qb.push_values(chunk, |mut b, &i| {
            let (a, now) = rows[i];
            b.push_bind(&a.hook)
                .push_bind(&a.args_json)
                .push_bind(&a.group)
                .push_bind(a.priority)
                .push_bind("pending")
                .push_bind(ms(a.scheduled_at))
                .push_bind(a.max_attempts)
                .push_bind(a.timeout_ms)
                .push_bind(ms(now))
                .push_bind(a.schedule_id);
        });
        // No `RETURNING`: sqlx hands each returned row from its worker thread to the caller
        // as a message of its own (a wake-up per row, ~15 % of a 1,000-row bulk enqueue in
        // `perf`). The ids are the statement's: `AUTOINCREMENT` gives each new row an id above
        // every id the table ever held, so the chunk's `n` rows lie in (old maximum, last].
        // If the `n` ids up to `last` are all present, that interval is exactly `n` wide:
        // they are this chunk's, one per VALUES row in order (as `RETURNING` was read).
        let done = qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("enqueue_bulk"))?;
        let (n, last) = (chunk.len() as i64, done.last_insert_rowid());
        let present: i64 = sqlx::query_scalar(IDS_PRESENT)
            .bind(last - n + 1)
            .bind(last)
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db("enqueue_bulk (ids)"))?;
        let ids = bulk_ids(n, done.rows_affected(), last, present)?;
        for (&i, id) in chunk.iter().zip(ids) {
            results[i] = Some(Enqueued { id, inserted: true });
        }
    }
    Ok(results.into_iter().flatten().collect())
}

/// How many of the ids `?1..=?2` exist (binds: the first and the last).
const IDS_PRESENT: &str = "SELECT count(*) FROM dockhand_actions WHERE id BETWEEN ? AND ?";

/// The ids of a multi-row insert of `n` rows that reported `inserted` rows and `last` as its
/// last rowid, given that `present` of the `n` ids up to `last` exist. `AUTOINCREMENT` gives
/// each new row an id above every id the table ever held, so the rows lie in (old maximum,
/// last]; if the `n` ids up to `last` are all present, that interval is exactly `n` wide: they
/// are this statement's, one per VALUES row in order.
fn bulk_ids(
    n: i64,
    inserted: u64,
    last: i64,
    present: i64,
) -> Result<std::ops::RangeInclusive<i64>> {
    let first = last - n + 1;
    if inserted != n as u64 || present != n {
        return Err(Error::Config(format!(
            "bulk insert of {n} rows: {inserted} inserted, {present} of the ids {first}..={last} \
             present (not one consecutive range)"
        )));
    }
    Ok(first..=last)
}

/// Rows per multi-row insert on the enqueue connection; a full chunk's statement is prepared
/// once and cached.
const DIRECT_BULK_ROWS: usize = 500;

/// The full chunk's multi-row insert, built once.
fn full_chunk_sql() -> &'static str {
    static FULL_CHUNK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FULL_CHUNK.get_or_init(|| bulk_insert_sql(DIRECT_BULK_ROWS))
}

/// Prepares the bulk path's statements (the full chunk's insert, ~1 ms to prepare, and its id
/// check) into the enqueue connection's statement cache after the schema is migrated, so the
/// first `enqueue_bulk` does not pay for them. Best effort: nothing to do without an enqueue
/// connection, and a failure only leaves the first bulk call to prepare them (logged).
pub(super) async fn warm_bulk_statements(store: &SqliteStore) {
    let writer = store.writer_handle();
    if !writer.has_direct() {
        return;
    }
    let op = "migrate (prepare the bulk insert)";
    let warmed = writer
        .direct(op, move |conn| {
            for sql in [full_chunk_sql(), IDS_PRESENT] {
                conn.prepare_cached(sql).map_err(db_error(op))?;
            }
            Ok(())
        })
        .await;
    if let Err(e) = warmed {
        tracing::debug!(error = %e, "the bulk insert was not prepared ahead");
    }
}

/// The multi-row insert of `rows` plain actions (9 binds a row).
fn bulk_insert_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO dockhand_actions (hook, args, group_name, priority, status, scheduled_at,
         max_attempts, timeout_ms, created_at, schedule_id) VALUES ",
    );
    for r in 0..rows {
        if r > 0 {
            sql.push(',');
        }
        sql.push_str("(?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)");
    }
    sql
}

/// [`enqueue_rows`] on the enqueue connection, inside its open transaction: unique actions one
/// by one, the rest in cached multi-row statements bound in place.
fn direct_rows(
    conn: &DirectConn,
    actions: &[PreparedAction],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    let op = "enqueue_bulk";
    let mut results: Vec<Option<Enqueued>> = vec![None; actions.len()];
    let mut plain = Vec::with_capacity(actions.len());
    for (i, a) in actions.iter().enumerate() {
        if a.unique_key.is_some() {
            results[i] = Some(direct_one(conn, a, now)?);
        } else {
            plain.push(i);
        }
    }
    let now = ms(now);
    for chunk in plain.chunks(DIRECT_BULK_ROWS) {
        let partial;
        let sql = if chunk.len() == DIRECT_BULK_ROWS {
            full_chunk_sql()
        } else {
            partial = bulk_insert_sql(chunk.len());
            &partial
        };
        let inserted = conn
            .prepare_cached(sql)
            .and_then(|mut st| {
                let mut k = 0;
                let mut bind = |v: &dyn rusqlite::ToSql| {
                    k += 1;
                    st.raw_bind_parameter(k, v)
                };
                for &i in chunk {
                    let a = &actions[i];
                    bind(&a.hook)?;
                    bind(&a.args_json)?;
                    bind(&a.group)?;
                    bind(&a.priority)?;
                    bind(&ms(a.scheduled_at))?;
                    bind(&a.max_attempts)?;
                    bind(&a.timeout_ms)?;
                    bind(&now)?;
                    bind(&a.schedule_id)?;
                }
                st.raw_execute()
            })
            .map_err(db_error(op))?;
        let (n, last) = (chunk.len() as i64, conn.last_insert_rowid());
        let present: i64 = conn
            .prepare_cached(IDS_PRESENT)
            .and_then(|mut st| st.query_row([last - n + 1, last], |r| r.get(0)))
            .map_err(db_error("enqueue_bulk (ids)"))?;
        let ids = bulk_ids(n, inserted as u64, last, present)?;
        for (&i, id) in chunk.iter().zip(ids) {
            results[i] = Some(Enqueued { id, inserted: true });
        }
    }
    Ok(results.into_iter().flatten().collect())
}

/// The group of `parent`'s chunk and finalize actions ([`crate::batch::action_group`]): its
/// pipeline's group, read in the caller's transaction.
pub(super) async fn batch_group(conn: &mut SqliteConnection, parent: i64) -> Result<String> {
    let pipeline: Option<String> =
        sqlx::query_scalar("SELECT pipeline FROM dockhand_jobs WHERE id = ?")
            .bind(parent)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db("batch_group"))?;
    Ok(crate::batch::action_group(pipeline.as_deref()))
}
