//! Job and packet retention on SQLite (Q11, B8): bounded batches of final jobs with their
//! events and leftover worklist rows, and packets nothing stored references.

use super::{ms, SqliteStore};
use crate::error::{Error, Result};
use crate::store::{JobPrune, PruneCutoffs};
use chrono::{DateTime, Utc};

/// Final jobs past their cutoff, roots or children whose parent is gone, with no undelivered
/// event; oldest first.
/// `INDEXED BY`: otherwise SQLite picks the status index for the `OR` and sorts every final
/// job by finish time for each batch (10 s per batch at 1,000,000 jobs; 8 ms with the index).
const CANDIDATES: &str = "SELECT j.id FROM dockhand_jobs j INDEXED BY dockhand_jobs_finished
     WHERE j.finished_at IS NOT NULL AND j.finished_at < max(?1, ?2)
       AND ((j.status IN ('completed', 'completed_no_items', 'skipped', 'cancelled')
             AND j.finished_at < ?1)
            OR (j.status = 'failed' AND j.finished_at < ?2))
       AND (j.parent_id IS NULL
            OR NOT EXISTS (SELECT 1 FROM dockhand_jobs p WHERE p.id = j.parent_id))
       AND NOT EXISTS (SELECT 1 FROM dockhand_job_events e
                       WHERE e.job_id = j.id AND e.delivered_at IS NULL)
     ORDER BY j.finished_at
     LIMIT ?3";

pub(super) async fn prune_jobs(store: &SqliteStore, c: &PruneCutoffs) -> Result<JobPrune> {
    let op = "prune_jobs";
    let mut tx = store.begin_write(op).await?;
    let ids: Vec<i64> = sqlx::query_scalar(CANDIDATES)
        .bind(ms(c.finished_before))
        .bind(ms(c.failed_before))
        .bind(c.batch.max(1))
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    if ids.is_empty() {
        tx.rollback().await.map_err(Error::db(op))?;
        return Ok(JobPrune::default());
    }
    let ids_json = serde_json::to_string(&ids).map_err(|e| Error::invalid("ids", e.to_string()))?;
    let events = sqlx::query(
        "DELETE FROM dockhand_job_events WHERE job_id IN (SELECT value FROM json_each(?))",
    )
    .bind(&ids_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("prune_jobs (events)"))?
    .rows_affected();
    let worklist_rows = sqlx::query(
        "DELETE FROM dockhand_worklist WHERE parent_id IN (SELECT value FROM json_each(?))",
    )
    .bind(&ids_json)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("prune_jobs (worklist)"))?
    .rows_affected();
    let jobs = sqlx::query(
        "DELETE FROM dockhand_jobs WHERE id IN (SELECT value FROM json_each(?))
           AND finished_at IS NOT NULL",
    )
    .bind(&ids_json)
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
    store: &SqliteStore,
    used_before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let op = "prune_packets";
    let mut tx = store.begin_write(op).await?;
    // The refs every stored job and worklist row holds, built once (MATERIALIZED) and probed
    // per candidate; a ref is `version:hash`.
    let done = sqlx::query(
        "WITH live(hash) AS MATERIALIZED (
             SELECT substr(r.value, instr(r.value, ':') + 1)
               FROM dockhand_jobs j, json_each(j.input_refs) r
             UNION
             SELECT substr(item_ref, instr(item_ref, ':') + 1) FROM dockhand_jobs
              WHERE item_ref IS NOT NULL
             UNION
             SELECT substr(payload_ref, instr(payload_ref, ':') + 1) FROM dockhand_worklist)
         DELETE FROM dockhand_packets WHERE hash IN (
             SELECT p.hash FROM dockhand_packets p
              WHERE p.used_at < ?1 AND p.hash NOT IN (SELECT hash FROM live)
              ORDER BY p.used_at
              LIMIT ?2)",
    )
    .bind(ms(used_before))
    .bind(limit.max(1))
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(done.rows_affected())
}
