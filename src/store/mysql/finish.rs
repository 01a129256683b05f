//! MySQL: owner-guarded finishing, cancel and operator retry.
//!
//! Every finishing UPDATE is guarded by id + fencing token + status `running`; zero rows is
//! [`FinishResult::LeaseLost`] and only a `lease_lost` log row is written. Every UPDATE that
//! moves an action out of pending/running clears `active_key`, freeing its unique key (Q6);
//! putting one back to pending restores it from `unique_key`. A step action that ends failed
//! enqueues its job's finish action in the same transaction (`jobs::finish`).
//!
//! Batched acknowledgements lock their rows first (`SELECT … FOR UPDATE`, in id order), decide
//! each guard on the locked rows, then write every completion in one UPDATE, every release in
//! another, the rest row by row, and all log rows in one multi-row insert.

use super::claim::push_in;
use super::enqueue::enqueue_one;
use super::{ms, opt_text, retry_deadlocks, text, MySqlStore};
use crate::error::{Error, Result};
use crate::jobs::finish::{followup, FailedAction};
use crate::jobs::STEP_HOOK;
use crate::store::operator::job_owned_hooks;
use crate::store::{Finish, FinishResult, Lease};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use std::collections::{HashMap, HashSet};

/// The owner guard every finishing UPDATE ends with (binds id, then token).
macro_rules! guarded {
    ($sql:literal) => {
        concat!(
            $sql,
            " WHERE id = ? AND lease_token = ? AND status = 'running'"
        )
    };
}

/// Leases per batched-acknowledgement statement (a few parameters each).
pub(super) const FINISH_CHUNK: usize = 5_000;

pub(super) async fn finish(
    store: &MySqlStore,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let result = retry_deadlocks("finish", || async move {
        let mut tx = store.begin("finish").await?;
        let result = finish_on(&mut tx, lease, outcome, now).await?;
        tx.commit().await.map_err(Error::db("finish"))?;
        Ok(result)
    })
    .await?;
    if matches!(
        (result, outcome),
        (FinishResult::Applied, Finish::Fail { .. })
    ) {
        // A failed step action enqueued its job's finish action.
        store.wake.notify();
    }
    Ok(result)
}

/// One guarded finish on an open transaction.
pub(super) async fn finish_on(
    tx: &mut MySqlConnection,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let done = update_one(tx, lease, outcome, now).await?;
    let result = if done == 1 {
        if let Some((event, detail)) = outcome.stored_log_entry() {
            log(tx, lease.id, now, event, detail).await?;
        }
        if matches!(outcome, Finish::Fail { .. }) {
            enqueue_followups(tx, &[lease.id], now).await?;
        }
        FinishResult::Applied
    } else {
        let (event, detail) = outcome.lease_lost_entry(lease.token);
        log(tx, lease.id, now, event, Some(detail)).await?;
        FinishResult::LeaseLost
    };
    Ok(result)
}

/// Enqueues the finish action each of `ids` (actions this transaction has just failed, their
/// rows locked) leaves behind when it is a step action ([`crate::jobs::finish`]).
pub(super) async fn enqueue_followups(
    tx: &mut MySqlConnection,
    ids: &[i64],
    now: DateTime<Utc>,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "SELECT id, hook, args, group_name, priority, attempt, max_attempts
         FROM dockhand_actions WHERE hook = ",
    );
    qb.push_bind(STEP_HOOK).push(" AND id");
    push_in(&mut qb, ids);
    qb.push(" ORDER BY id");
    let rows = qb
        .build()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("failed step actions"))?;
    for row in rows {
        let d = || Error::db("decode failed action");
        let id: i64 = row.try_get("id").map_err(d())?;
        let args_text = text(&row, "args").map_err(d())?;
        let args = serde_json::from_str(&args_text).map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: format!("args: {e}"),
        })?;
        let failed = FailedAction {
            hook: text(&row, "hook").map_err(d())?,
            args,
            group: opt_text(&row, "group_name").map_err(d())?,
            priority: row.try_get("priority").map_err(d())?,
            attempt: row.try_get("attempt").map_err(d())?,
            max_attempts: row.try_get("max_attempts").map_err(d())?,
        };
        if let Some(action) = followup(&failed, now) {
            enqueue_one(tx, &action, now).await?;
        }
    }
    Ok(())
}

/// The guarded UPDATE of one finish; returns the rows it matched (0 or 1).
async fn update_one(
    tx: &mut MySqlConnection,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<u64> {
    let now_ms = ms(now);
    let q = match outcome {
        Finish::Complete => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'complete', finished_at = ?,
             lease_owner = NULL, lease_until = NULL, active_key = NULL"
        ))
        .bind(now_ms),
        Finish::Fail { error } => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'failed', finished_at = ?, last_error = ?,
             lease_owner = NULL, lease_until = NULL, active_key = NULL"
        ))
        .bind(now_ms)
        .bind(error),
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
    Ok(done.rows_affected())
}

/// Batched acknowledgements: every finish in one transaction, each guarded on its own.
pub(super) async fn finish_many(
    store: &MySqlStore,
    items: &[(Lease, Finish)],
    now: DateTime<Utc>,
) -> Result<Vec<FinishResult>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let out = retry_deadlocks("finish_many", || async move {
        let mut tx = store.begin("finish_many").await?;
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(FINISH_CHUNK) {
            out.extend(finish_chunk(&mut tx, chunk, now).await?);
        }
        tx.commit().await.map_err(Error::db("finish_many"))?;
        Ok(out)
    })
    .await?;
    if items
        .iter()
        .zip(&out)
        .any(|((_, o), r)| matches!((r, o), (FinishResult::Applied, Finish::Fail { .. })))
    {
        store.wake.notify();
    }
    Ok(out)
}

pub(super) async fn finish_chunk(
    tx: &mut MySqlConnection,
    items: &[(Lease, Finish)],
    now: DateTime<Utc>,
) -> Result<Vec<FinishResult>> {
    // Lock every row involved (id order) and read what the guards test.
    let mut ids: Vec<i64> = items.iter().map(|(l, _)| l.id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("SELECT id, lease_token, status FROM dockhand_actions WHERE id");
    push_in(&mut qb, &ids);
    qb.push(" ORDER BY id FOR UPDATE");
    let rows = qb
        .build()
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("finish_many"))?;
    let mut held: HashMap<i64, (i64, bool)> = HashMap::with_capacity(rows.len());
    for row in rows {
        let d = || Error::db("finish_many");
        held.insert(
            row.try_get("id").map_err(d())?,
            (
                row.try_get("lease_token").map_err(d())?,
                text(&row, "status").map_err(d())? == "running",
            ),
        );
    }
    let mut done: HashSet<i64> = HashSet::new();
    let (mut completes, mut releases) = (Vec::new(), Vec::new());
    let mut results = Vec::with_capacity(items.len());
    let mut logs: Vec<(i64, &'static str, Option<String>)> = Vec::with_capacity(items.len());
    for (lease, outcome) in items {
        let applies = held.get(&lease.id) == Some(&(lease.token, true)) && done.insert(lease.id);
        if applies {
            match outcome {
                Finish::Complete => completes.push(lease.id),
                Finish::Release => releases.push(lease.id),
                other => {
                    if update_one(tx, *lease, other, now).await? != 1 {
                        return Err(lost_lock(lease.id));
                    }
                    if matches!(other, Finish::Fail { .. }) {
                        enqueue_followups(tx, &[lease.id], now).await?;
                    }
                }
            }
            if let Some((event, detail)) = outcome.stored_log_entry() {
                logs.push((lease.id, event, detail));
            }
            results.push(FinishResult::Applied);
        } else {
            if held.contains_key(&lease.id) {
                let (event, detail) = outcome.lease_lost_entry(lease.token);
                logs.push((lease.id, event, Some(detail)));
            }
            results.push(FinishResult::LeaseLost);
        }
    }
    for (ids, set) in [
        (
            &completes,
            "status = 'complete', finished_at = ?, lease_owner = NULL, lease_until = NULL, \
             active_key = NULL",
        ),
        (
            &releases,
            "status = 'pending', attempt = attempt - 1, lease_owner = NULL, lease_until = NULL",
        ),
    ] {
        if ids.is_empty() {
            continue;
        }
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new("UPDATE dockhand_actions SET ");
        match set.split_once('?') {
            Some((head, tail)) => {
                qb.push(head).push_bind(ms(now)).push(tail);
            }
            None => {
                qb.push(set);
            }
        }
        qb.push(" WHERE status = 'running' AND id");
        push_in(&mut qb, ids);
        let n = qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_many"))?
            .rows_affected();
        if n != ids.len() as u64 {
            return Err(lost_lock(ids[0]));
        }
    }
    if !logs.is_empty() {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("INSERT INTO dockhand_action_logs (action_id, at, event, detail) ");
        qb.push_values(&logs, |mut b, (id, event, detail)| {
            b.push_bind(*id)
                .push_bind(ms(now))
                .push_bind(*event)
                .push_bind(detail.as_deref());
        });
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("finish_many (log)"))?;
    }
    Ok(results)
}

/// A row locked by this transaction changed under it: impossible unless the lock was lost.
fn lost_lock(id: i64) -> Error {
    Error::Config(format!(
        "finish_many: action {id} changed while locked; nothing was written"
    ))
}

pub(super) async fn log(
    conn: &mut MySqlConnection,
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

pub(super) async fn cancel(store: &MySqlStore, id: i64, now: DateTime<Utc>) -> Result<bool> {
    retry_deadlocks("cancel", || async move {
        let mut tx = store.begin("cancel").await?;
        let done = sqlx::query(concat!(
            "UPDATE dockhand_actions SET status = 'canceled', finished_at = ?,
             lease_owner = NULL, lease_until = NULL, active_key = NULL
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
    })
    .await
}

pub(super) async fn retry(store: &MySqlStore, id: i64, now: DateTime<Utc>) -> Result<bool> {
    retry_deadlocks("retry", || async move {
        let mut tx = store.begin("retry").await?;
        let done = sqlx::query(
            "UPDATE dockhand_actions SET status = 'pending', attempt = 0, scheduled_at = ?,
             finished_at = NULL, active_key = unique_key
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
    })
    .await
}
