//! SQLite: owner-guarded finishing, cancel and operator retry.
//!
//! Every finishing UPDATE is guarded by id + fencing token + status `running`; zero rows is
//! [`FinishResult::LeaseLost`] and only a `lease_lost` log row is written. A step action that
//! ends failed enqueues its job's finish action in the same transaction (`jobs::finish`). A
//! completion writes no log row: its `completed` entry is read from the row's `finished_at`
//! (migration 0017).

use super::enqueue::enqueue_one;
use super::{hot, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::jobs::finish::{followup, FailedAction};
use crate::store::operator::job_owned_hooks;
use crate::store::{Finish, FinishResult, Lease};
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};
use std::collections::HashSet;

/// The owner guard every finishing UPDATE ends with (binds id, then token).
macro_rules! guarded {
    ($sql:literal) => {
        concat!(
            $sql,
            " WHERE id = ? AND lease_token = ? AND status = 'running'"
        )
    };
}

/// The columns a write that fails actions returns, for [`enqueue_followup`].
macro_rules! returning_failed {
    () => {
        " RETURNING id, hook, args, group_name, priority, attempt, max_attempts"
    };
}
pub(super) use returning_failed;

pub(super) async fn finish(
    store: &SqliteStore,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let mut tx = store.begin_write("finish").await?;
    let result = finish_on(&mut tx, lease, outcome, now).await?;
    tx.commit().await.map_err(Error::db("finish"))?;
    if matches!(
        (result, outcome),
        (FinishResult::Applied, Finish::Fail { .. })
    ) {
        // A failed step action enqueued its job's finish action.
        store.wake.notify();
    }
    Ok(result)
}

/// The set-based completion (binds: `$now` the finish time, `$pairs` a JSON array of
/// `[id, token]`), each row guarded by id + token + status; returns the ids it completed as
/// `done_id` (and their tokens as `done_token`). Their `completed` log entries are read from the rows (migration 0017).
macro_rules! complete_set_sql {
    ($now:literal, $pairs:literal) => {
        concat!(
            "UPDATE dockhand_actions SET status = 'complete', finished_at = ",
            $now,
            ", lease_owner = NULL, lease_until = NULL
 FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token
       FROM json_each(",
            $pairs,
            ")) AS l
 WHERE dockhand_actions.id = l.id AND dockhand_actions.lease_token = l.token
   AND status = 'running'
 RETURNING dockhand_actions.id AS done_id, dockhand_actions.lease_token AS done_token"
        )
    };
}
pub(super) use complete_set_sql;

/// Batched acknowledgements, each guarded on its own. All completions (the common case): one
/// autocommit statement. Otherwise one write transaction: the completions set-based, the other
/// outcomes one by one.
pub(super) async fn finish_many(
    store: &SqliteStore,
    items: &[(Lease, Finish)],
    now: DateTime<Utc>,
) -> Result<Vec<FinishResult>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let completes = complete_pairs(items);
    if completes.len() == items.len() {
        let writer = store.writer_handle();
        if writer.has_direct() {
            let done = hot::Completions::new(items, now)?;
            return writer
                .direct_inline_first(
                    "finish_many",
                    hot::inline_first(store),
                    |conn| hot::complete(conn, &done),
                    || {
                        let done = done.clone();
                        move |conn: &mut _| {
                            hot::in_tx(conn, "finish_many", |tx| hot::complete(tx, &done))
                        }
                    },
                )
                .await;
        }
        let mut conn = store.write_conn("finish_many").await?;
        let applied = complete_set(&mut conn, &completes, now).await?;
        return log_lost_completions(&mut conn, items, &applied, now).await;
    }
    let mut tx = store.begin_write("finish_many").await?;
    let applied = complete_set(&mut tx, &completes, now).await?;
    let mut out = Vec::with_capacity(items.len());
    for (lease, outcome) in items {
        let result = match outcome {
            Finish::Complete if applied.contains(&lease.id) => FinishResult::Applied,
            Finish::Complete => {
                let (event, detail) = outcome.lease_lost_entry(lease.token);
                log(&mut tx, lease.id, now, event, Some(detail)).await?;
                FinishResult::LeaseLost
            }
            _ => finish_on(&mut tx, *lease, outcome, now).await?,
        };
        out.push(result);
    }
    tx.commit().await.map_err(Error::db("finish_many"))?;
    if items
        .iter()
        .zip(&out)
        .any(|((_, o), r)| matches!((r, o), (FinishResult::Applied, Finish::Fail { .. })))
    {
        store.wake.notify();
    }
    Ok(out)
}

/// The `[id, token]` pairs of the completions among `items`.
pub(super) fn complete_pairs(items: &[(Lease, Finish)]) -> Vec<[i64; 2]> {
    items
        .iter()
        .filter(|(_, o)| matches!(o, Finish::Complete))
        .map(|(l, _)| [l.id, l.token])
        .collect()
}

/// The results of completions-only `items` given the ids that were applied; a `lease_lost`
/// log row for each of the others (one statement, only when there are any).
pub(super) async fn log_lost_completions(
    conn: &mut SqliteConnection,
    items: &[(Lease, Finish)],
    applied: &HashSet<i64>,
    now: DateTime<Utc>,
) -> Result<Vec<FinishResult>> {
    let (results, lost) = lost_completions(items.iter().map(|(l, _)| [l.id, l.token]), applied);
    if !lost.is_empty() {
        let lost_json =
            serde_json::to_string(&lost).map_err(|e| Error::invalid("leases", e.to_string()))?;
        sqlx::query(hot::LOG_LOST)
            .bind(ms(now))
            .bind(lost_json)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("finish_many (lease lost)"))?;
    }
    Ok(results)
}

/// The results of completions (`[id, token]` pairs, in order) given the ids that were
/// applied, and the `lease_lost` entries (`[id, detail]`) of the others. The entries are
/// written only for completions that found their lease gone, so only those are formatted.
pub(super) fn lost_completions(
    pairs: impl Iterator<Item = [i64; 2]>,
    applied: &HashSet<i64>,
) -> (Vec<FinishResult>, Vec<(i64, String)>) {
    let mut lost = Vec::new();
    let results = pairs
        .map(|[id, token]| {
            if applied.contains(&id) {
                FinishResult::Applied
            } else {
                lost.push((id, Finish::Complete.lease_lost_entry(token).1));
                FinishResult::LeaseLost
            }
        })
        .collect();
    (results, lost)
}

/// Completes every `[id, token]` pair still running under that token and returns the ids
/// that were.
async fn complete_set(
    conn: &mut SqliteConnection,
    pairs: &[[i64; 2]],
    now: DateTime<Utc>,
) -> Result<HashSet<i64>> {
    if pairs.is_empty() {
        return Ok(Default::default());
    }
    let pairs_json =
        serde_json::to_string(pairs).map_err(|e| Error::invalid("leases", e.to_string()))?;
    let ids: Vec<i64> = sqlx::query_scalar(complete_set_sql!("?1", "?2"))
        .bind(ms(now))
        .bind(pairs_json)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("finish_many"))?;
    Ok(ids.into_iter().collect())
}

/// One guarded finish on an open write transaction. A failure of a step action enqueues its
/// job's finish action on the same transaction ([`crate::jobs::finish`]).
pub(super) async fn finish_on(
    tx: &mut SqliteConnection,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let now_ms = ms(now);
    let q = match outcome {
        Finish::Fail { error } => return fail_on(tx, lease, error, now).await,
        Finish::Complete => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'complete', finished_at = ?,
             lease_owner = NULL, lease_until = NULL"
        ))
        .bind(now_ms),
        Finish::Retry { at, error } => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'pending', scheduled_at = ?, last_error = ?,
             lease_owner = NULL, lease_until = NULL"
        ))
        .bind(ms(*at))
        .bind(error),
        Finish::Snooze { at } => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'pending', scheduled_at = ?,
             attempt = attempt - 1, lease_owner = NULL, lease_until = NULL"
        ))
        .bind(ms(*at)),
        Finish::Release => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'pending', attempt = attempt - 1,
             lease_owner = NULL, lease_until = NULL"
        )),
    };
    let done = q
        .bind(lease.id)
        .bind(lease.token)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("finish"))?;
    let result = if done.rows_affected() == 1 {
        // A completion's `completed` entry is read from the row (migration 0017).
        if let Some((event, detail)) = outcome.stored_log_entry() {
            log(tx, lease.id, now, event, detail).await?;
        }
        FinishResult::Applied
    } else {
        let (event, detail) = outcome.lease_lost_entry(lease.token);
        log(tx, lease.id, now, event, Some(detail)).await?;
        FinishResult::LeaseLost
    };
    Ok(result)
}

/// The guarded failure: marks the action failed and, when it is a step action, enqueues its
/// job's finish action on the same transaction.
async fn fail_on(
    tx: &mut SqliteConnection,
    lease: Lease,
    error: &str,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let row = sqlx::query(concat!(
        guarded!(
            "UPDATE dockhand_actions SET status = 'failed', finished_at = ?, last_error = ?,
             lease_owner = NULL, lease_until = NULL"
        ),
        returning_failed!()
    ))
    .bind(ms(now))
    .bind(error)
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Error::db("finish"))?;
    let outcome = Finish::Fail {
        error: error.to_string(),
    };
    let Some(row) = row else {
        let (event, detail) = outcome.lease_lost_entry(lease.token);
        log(tx, lease.id, now, event, Some(detail)).await?;
        return Ok(FinishResult::LeaseLost);
    };
    let (event, detail) = outcome.log_entry();
    log(tx, lease.id, now, event, detail).await?;
    enqueue_followup(tx, &row, now).await?;
    Ok(FinishResult::Applied)
}

/// Enqueues the finish action a failed step action leaves behind (nothing for other
/// actions). `row` holds the columns of `returning_failed!()`.
pub(super) async fn enqueue_followup(
    tx: &mut SqliteConnection,
    row: &sqlx::sqlite::SqliteRow,
    now: DateTime<Utc>,
) -> Result<()> {
    let d = || Error::db("decode failed action");
    let id: i64 = row.try_get("id").map_err(d())?;
    let args_text: String = row.try_get("args").map_err(d())?;
    let args = serde_json::from_str(&args_text).map_err(|e| Error::Corrupt {
        what: "action",
        id,
        message: format!("args: {e}"),
    })?;
    let failed = FailedAction {
        hook: row.try_get("hook").map_err(d())?,
        args,
        group: row.try_get("group_name").map_err(d())?,
        priority: row.try_get("priority").map_err(d())?,
        attempt: row.try_get("attempt").map_err(d())?,
        max_attempts: row.try_get("max_attempts").map_err(d())?,
    };
    if let Some(action) = followup(&failed, now) {
        enqueue_one(tx, &action, now).await?;
    }
    Ok(())
}

pub(super) async fn log(
    conn: &mut SqliteConnection,
    id: i64,
    now: DateTime<Utc>,
    event: &str,
    detail: Option<String>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO dockhand_action_logs (action_id, at, event, detail)
         SELECT id, ?, ?, ? FROM dockhand_actions WHERE id = ?",
    )
    .bind(ms(now))
    .bind(event)
    .bind(detail)
    .bind(id)
    .execute(&mut *conn)
    .await
    .map_err(Error::db("log"))?;
    Ok(())
}

pub(super) async fn cancel(store: &SqliteStore, id: i64, now: DateTime<Utc>) -> Result<bool> {
    let mut tx = store.begin_write("cancel").await?;
    let done = sqlx::query(concat!(
        "UPDATE dockhand_actions SET status = 'canceled', finished_at = ?,
         lease_owner = NULL, lease_until = NULL
         WHERE id = ? AND status IN ('pending', 'running') AND hook NOT IN ",
        job_owned_hooks!()
    ))
    .bind(ms(now))
    .bind(id)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("cancel"))?;
    let changed = done.rows_affected() == 1;
    if changed {
        log(&mut tx, id, now, "canceled", None).await?;
    }
    tx.commit().await.map_err(Error::db("cancel"))?;
    Ok(changed)
}

pub(super) async fn retry(store: &SqliteStore, id: i64, now: DateTime<Utc>) -> Result<bool> {
    let mut tx = store.begin_write("retry").await?;
    let done = sqlx::query(
        "UPDATE dockhand_actions SET status = 'pending', attempt = 0, scheduled_at = ?,
         finished_at = NULL
         WHERE id = ? AND status IN ('failed', 'canceled')",
    )
    .bind(ms(now))
    .bind(id)
    .execute(&mut *tx)
    .await
    .map_err(|e| crate::store::unique_violation_as(e, "retry", id))?;
    let changed = done.rows_affected() == 1;
    if changed {
        log(&mut tx, id, now, "requeued", Some("operator retry".into())).await?;
    }
    tx.commit().await.map_err(Error::db("retry"))?;
    Ok(changed)
}
