//! SQLite: owner-guarded finishing, cancel and operator retry.
//!
//! Every finishing UPDATE is guarded by id + fencing token + status `running`; zero rows is
//! [`FinishResult::LeaseLost`] and only a `lease_lost` log row is written.

use super::{ms, SqliteStore};
use crate::error::{Error, Result};
use crate::store::{Finish, FinishResult, Lease};
use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

/// The owner guard every finishing UPDATE ends with (binds id, then token).
macro_rules! guarded {
    ($sql:literal) => {
        concat!(
            $sql,
            " WHERE id = ? AND lease_token = ? AND status = 'running'"
        )
    };
}

pub(super) async fn finish(
    store: &SqliteStore,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let mut tx = store.begin_write("finish").await?;
    let result = finish_on(&mut tx, lease, outcome, now).await?;
    tx.commit().await.map_err(Error::db("finish"))?;
    Ok(result)
}

/// Batched acknowledgements: every finish in one write transaction, each guarded on its own.
pub(super) async fn finish_many(
    store: &SqliteStore,
    items: &[(Lease, Finish)],
    now: DateTime<Utc>,
) -> Result<Vec<FinishResult>> {
    let mut tx = store.begin_write("finish_many").await?;
    let mut out = Vec::with_capacity(items.len());
    for (lease, outcome) in items {
        out.push(finish_on(&mut tx, *lease, outcome, now).await?);
    }
    tx.commit().await.map_err(Error::db("finish_many"))?;
    Ok(out)
}

/// One guarded finish on an open write transaction.
async fn finish_on(
    tx: &mut SqliteConnection,
    lease: Lease,
    outcome: &Finish,
    now: DateTime<Utc>,
) -> Result<FinishResult> {
    let now_ms = ms(now);
    let q = match outcome {
        Finish::Complete => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'complete', finished_at = ?,
             lease_owner = NULL, lease_until = NULL"
        ))
        .bind(now_ms),
        Finish::Fail { error } => sqlx::query(guarded!(
            "UPDATE dockhand_actions SET status = 'failed', finished_at = ?, last_error = ?,
             lease_owner = NULL, lease_until = NULL"
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
    let result = if done.rows_affected() == 1 {
        let (event, detail) = outcome.log_entry();
        log(tx, lease.id, now, event, detail).await?;
        FinishResult::Applied
    } else {
        let (event, detail) = outcome.lease_lost_entry(lease.token);
        log(tx, lease.id, now, event, Some(detail)).await?;
        FinishResult::LeaseLost
    };
    Ok(result)
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
    let done = sqlx::query(
        "UPDATE dockhand_actions SET status = 'canceled', finished_at = ?,
         lease_owner = NULL, lease_until = NULL
         WHERE id = ? AND status IN ('pending', 'running')",
    )
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
