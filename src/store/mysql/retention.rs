//! Job and packet retention on MySQL/MariaDB (Q11, B8): bounded batches of final jobs with
//! their events and leftover worklist rows, and packets nothing stored references.

use super::claim::push_list;
use super::jobs::text;
use super::{ms, retry_deadlocks, MySqlStore};
use crate::error::{Error, Result};
use crate::store::{JobPrune, PruneCutoffs};
use chrono::{DateTime, Utc};
use sqlx::{MySql, QueryBuilder};

pub(super) async fn prune_jobs(store: &MySqlStore, c: &PruneCutoffs) -> Result<JobPrune> {
    let op = "prune_jobs";
    retry_deadlocks(op, || async move {
        let mut tx = store.begin(op).await?;
        // Final jobs past their cutoff, roots or children whose parent is gone, with no
        // undelivered event; oldest first, locked so two pruners take different batches.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT j.id FROM dockhand_jobs j FORCE INDEX (dockhand_jobs_finished)
              WHERE j.finished_at IS NOT NULL AND j.finished_at < GREATEST(?, ?)
                AND ((j.status IN ('completed', 'completed_no_items', 'skipped', 'cancelled')
                      AND j.finished_at < ?)
                     OR (j.status = 'failed' AND j.finished_at < ?))
                AND (j.parent_id IS NULL
                     OR NOT EXISTS (SELECT 1 FROM dockhand_jobs p WHERE p.id = j.parent_id))
                AND NOT EXISTS (SELECT 1 FROM dockhand_job_events e
                                WHERE e.job_id = j.id AND e.delivered_at IS NULL)
              ORDER BY j.finished_at
              LIMIT ?
              FOR UPDATE SKIP LOCKED",
        )
        .bind(ms(c.finished_before))
        .bind(ms(c.failed_before))
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
        let delete = |sql: &str| {
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(sql);
            push_list(&mut qb, &ids);
            qb.push(")");
            qb
        };
        let events = delete("DELETE FROM dockhand_job_events WHERE job_id IN (")
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("prune_jobs (events)"))?
            .rows_affected();
        let worklist_rows = delete("DELETE FROM dockhand_worklist WHERE parent_id IN (")
            .build()
            .execute(&mut *tx)
            .await
            .map_err(Error::db("prune_jobs (worklist)"))?
            .rows_affected();
        let jobs = delete("DELETE FROM dockhand_jobs WHERE finished_at IS NOT NULL AND id IN (")
            .build()
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
    })
    .await
}

pub(super) async fn prune_packets(
    store: &MySqlStore,
    used_before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let op = "prune_packets";
    retry_deadlocks(op, || async move {
        let mut tx = store.begin(op).await?;
        // Candidates not referenced by any stored job or worklist row (a ref is
        // `version:hash`), locked: a start writing one of them again waits for this
        // transaction and then inserts it anew.
        let rows = sqlx::query(
            "SELECT p.hash FROM dockhand_packets p
              WHERE p.used_at < ?
                AND p.hash NOT IN (
                    SELECT SUBSTRING_INDEX(r.ref, ':', -1)
                      FROM dockhand_jobs j,
                           JSON_TABLE(j.input_refs, '$[*]' COLUMNS (ref VARCHAR(255) PATH '$')) r
                     WHERE r.ref IS NOT NULL
                    UNION
                    SELECT SUBSTRING_INDEX(item_ref, ':', -1) FROM dockhand_jobs
                     WHERE item_ref IS NOT NULL
                    UNION
                    SELECT SUBSTRING_INDEX(payload_ref, ':', -1) FROM dockhand_worklist)
              ORDER BY p.used_at
              LIMIT ?
              FOR UPDATE SKIP LOCKED",
        )
        .bind(ms(used_before))
        .bind(limit.max(1))
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::db(op))?;
        let hashes = rows
            .iter()
            .map(|r| text(r, "hash"))
            .collect::<Result<Vec<String>>>()?;
        if hashes.is_empty() {
            tx.rollback().await.map_err(Error::db(op))?;
            return Ok(0);
        }
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("DELETE FROM dockhand_packets WHERE used_at < ");
        qb.push_bind(ms(used_before));
        qb.push(" AND hash IN (");
        let mut sep = qb.separated(", ");
        for h in &hashes {
            sep.push_bind(h.as_str());
        }
        qb.push(")");
        let done = qb.build().execute(&mut *tx).await.map_err(Error::db(op))?;
        tx.commit().await.map_err(Error::db(op))?;
        Ok(done.rows_affected())
    })
    .await
}
