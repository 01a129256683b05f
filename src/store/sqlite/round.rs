//! SQLite: a runner's round, its completions and its next claim in one write transaction
//! and one query string (both statements cross to sqlx's SQLite worker thread as one command).
//! One commit instead of two: a commit writes every page it touched to the WAL, and the
//! completions and the claim touch the same index pages (docs/BENCHMARKS.md), so per-action
//! cost falls with rows per commit. A round with other outcomes than completions takes the
//! two calls of the trait's default, and so does every round while group limits exist (the
//! limited claim of [`super::limits`] then runs after the finishes' commit).

use super::claim::{claim_sql, claim_started_sql, decode_claimed, filter_json, limited_flag};
use super::finish::{complete_pairs, complete_set_sql, log_lost_completions};
use super::{hot, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::store::{ClaimRequest, Finish, FinishAndClaim, Lease, Store};
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Column, Row};
use std::collections::HashSet;

/// The completions (binds 3 and 8), then the claim (binds 1-7).
const ROUND: &str = concat!(complete_set_sql!("?3", "?8"), ";\n", claim_sql!());

pub(super) async fn finish_and_claim(
    store: &SqliteStore,
    items: &[(Lease, Finish)],
    req: &ClaimRequest<'_>,
    now: DateTime<Utc>,
) -> Result<FinishAndClaim> {
    let completes = complete_pairs(items);
    if completes.len() != items.len()
        || completes.is_empty()
        || req.limit <= 0
        || store.limits_seen()
    {
        let finished = store.finish_many(items, now).await?;
        let claimed = store.claim(req).await;
        return Ok(FinishAndClaim { finished, claimed });
    }
    let writer = store.writer_handle();
    if writer.has_direct() {
        let done = hot::Completions::new(items, now)?;
        let args = hot::ClaimArgs::new(req)?;
        let (finished, claimed) = writer
            .direct_inline_first(
                "finish_and_claim",
                hot::inline_first(store),
                |conn| hot::round(conn, &done, &args),
                || {
                    let (done, args) = (done.clone(), args.clone());
                    move |conn: &mut _| {
                        hot::in_tx(conn, "finish_and_claim", |tx| hot::round(tx, &done, &args))
                    }
                },
            )
            .await?;
        hot::claimed(store, req.limit, &claimed);
        // Nothing claimed: the runner's next claim takes the limited path if limits exist.
        let limited = match claimed.limited {
            Some(seen) => seen,
            None => super::limits::any(store).await?,
        };
        store.set_limits_seen(limited);
        return Ok(FinishAndClaim {
            finished,
            claimed: Ok(claimed.actions),
        });
    }
    let pairs =
        serde_json::to_string(&completes).map_err(|e| Error::invalid("leases", e.to_string()))?;
    let [hooks, routed_hooks, routed_groups] = filter_json(req)?;
    let mut tx = store.begin_write("finish_and_claim").await?;
    let rows = sqlx::query(ROUND)
        .bind(req.owner)
        .bind(ms(req.lease_until))
        .bind(ms(req.now))
        .bind(req.limit)
        .bind(hooks)
        .bind(routed_hooks)
        .bind(routed_groups)
        .bind(pairs)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db("finish_and_claim"))?;
    let mut done: HashSet<i64> = HashSet::new();
    let mut claimed_rows: Vec<SqliteRow> = Vec::with_capacity(rows.len());
    for row in rows {
        if row.columns().first().map(|c| c.name()) == Some("done_id") {
            done.insert(row.try_get(0).map_err(Error::db("finish_and_claim"))?);
        } else {
            claimed_rows.push(row);
        }
    }
    let finished = log_lost_completions(&mut tx, items, &done, now).await?;
    tx.commit().await.map_err(Error::db("finish_and_claim"))?;
    match limited_flag(&claimed_rows)? {
        Some(seen) => store.set_limits_seen(seen),
        // Nothing claimed: the runner's next claim takes the limited path if limits exist.
        None => store.set_limits_seen(super::limits::any(store).await?),
    }
    Ok(FinishAndClaim {
        finished,
        claimed: decode_claimed(claimed_rows),
    })
}
