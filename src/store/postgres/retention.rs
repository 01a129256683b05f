//! Job and packet retention on PostgreSQL (Q11, B8): bounded batches of final jobs with their
//! events and leftover worklist rows, and packets nothing stored references.

use super::{ts, PgStore};
use crate::error::{Error, Result};
use crate::store::{JobPrune, PruneCutoffs};
use chrono::{DateTime, Utc};

pub(super) async fn prune_jobs(store: &PgStore, c: &PruneCutoffs) -> Result<JobPrune> {
    let op = "prune_jobs";
    let mut tx = store.begin(op).await?;
    // Final jobs past their cutoff, roots or children whose parent is gone, with no
    // undelivered event; oldest first. Row locks (SKIP LOCKED) keep two pruners apart and keep
    // a bridge that still holds a row out of the batch.
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT j.id FROM dockhand_jobs j
          WHERE j.finished_at IS NOT NULL AND j.finished_at < GREATEST($1, $2)
            AND ((j.status IN ('completed', 'completed_no_items', 'skipped', 'cancelled')
                  AND j.finished_at < $1)
                 OR (j.status = 'failed' AND j.finished_at < $2))
            AND (j.parent_id IS NULL
                 OR NOT EXISTS (SELECT 1 FROM dockhand_jobs p WHERE p.id = j.parent_id))
            AND NOT EXISTS (SELECT 1 FROM dockhand_job_events e
                            WHERE e.job_id = j.id AND e.delivered_at IS NULL)
          ORDER BY j.finished_at
          LIMIT $3
          FOR UPDATE SKIP LOCKED",
    )
    .bind(ts(c.finished_before))
    .bind(ts(c.failed_before))
    .bind(c.batch.max(1))
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    if ids.is_empty() {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(JobPrune::default());
    }
    let events = sqlx::query("DELETE FROM dockhand_job_events WHERE job_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("prune_jobs (events)"))?
        .rows_affected();
    let worklist_rows = sqlx::query("DELETE FROM dockhand_worklist WHERE parent_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("prune_jobs (worklist)"))?
        .rows_affected();
    let jobs =
        sqlx::query("DELETE FROM dockhand_jobs WHERE id = ANY($1) AND finished_at IS NOT NULL")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?
            .rows_affected();
    tx.commit().await.map_err(Error::db(op))?;
    Ok(JobPrune {
        jobs,
        events,
        worklist_rows,
    })
}

pub(super) async fn prune_packets(
    store: &PgStore,
    used_before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    // The refs every stored job and worklist row holds (a ref is `version:hash`), probed per
    // candidate as a hashed anti-join. A packet written again meanwhile has a newer `used_at`
    // and is left (the DELETE re-checks it on the row it locks).
    let done = sqlx::query(
        "WITH live AS (
             SELECT split_part(r.value, ':', 2) AS hash
               FROM dockhand_jobs j, jsonb_array_elements_text(j.input_refs) AS r(value)
             UNION
             SELECT split_part(item_ref, ':', 2) FROM dockhand_jobs WHERE item_ref IS NOT NULL
             UNION
             SELECT split_part(payload_ref, ':', 2) FROM dockhand_worklist),
         doomed AS (
             SELECT p.hash FROM dockhand_packets p
              WHERE p.used_at < $1 AND NOT EXISTS (SELECT 1 FROM live l WHERE l.hash = p.hash)
              ORDER BY p.used_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED)
         DELETE FROM dockhand_packets p USING doomed d
          WHERE p.hash = d.hash AND p.used_at < $1",
    )
    .bind(ts(used_before))
    .bind(limit.max(1))
    .execute(&store.pool)
    .await
    .map_err(Error::db("prune_packets"))?;
    Ok(done.rows_affected())
}
