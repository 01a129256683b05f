//! PostgreSQL: recovery reads (R2, R3) and the invariant audit of `dockhand check` (DESIGN §11).
//!
//! Both are read-only. What drives a job is found by the unique keys of its actions: the step
//! actions `j:{id}:{step}`, the chunk actions `b:{id}:{offset}` and the finalize action
//! `f:{id}`. The audit runs in one read-only `REPEATABLE READ` transaction, so every check sees
//! the same snapshot (and the counters and the child rows they count are written together).

use super::PgStore;
use crate::batch::{JobLiveness, Violation};
use crate::error::{Error, Result};
use crate::jobs::STEP_HOOK;
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

/// Page size when `limit` is 0.
const DEFAULT_LIMIT: i64 = 100;

/// Longest item id shown in a claim violation's subject, in characters.
const ITEM_SHOWN: usize = 60;

/// True when a pending or running action drives job `j`.
const HAS_ACTION: &str = "EXISTS (SELECT 1 FROM dockhand_actions a
    WHERE a.status IN ('pending', 'running')
      AND (a.unique_key LIKE 'j:' || j.id::text || ':%'
           OR a.unique_key LIKE 'b:' || j.id::text || ':%'
           OR a.unique_key = 'f:' || j.id::text))";

/// The statuses a job never leaves, as stored (bound as `text[]`).
fn final_statuses() -> Vec<&'static str> {
    JobStatus::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(JobStatus::as_str)
        .collect()
}

/// Stale pending/processing jobs and what drives them; see [`crate::Store::job_liveness`].
pub(super) async fn job_liveness(
    store: &PgStore,
    older_than: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<JobLiveness>> {
    let rows = sqlx::query(&format!(
        "SELECT j.id, j.pipeline, j.status, j.step_index, j.updated_at,
                {HAS_ACTION} AS has_action,
                j.batch_state IS NOT NULL AS is_batch_parent,
                COALESCE(j.batch_state = 'fenced', FALSE) AS fenced,
                (j.children_total - j.children_terminal)::int8 AS active_children,
                EXISTS (SELECT 1 FROM dockhand_actions a
                        WHERE a.hook = $3 AND a.status = 'failed'
                          AND a.unique_key = 'j:' || j.id::text || ':' || j.step_index::text)
                    AS step_failed
         FROM dockhand_jobs j
         WHERE j.status IN ('pending', 'processing') AND j.updated_at < $1
         ORDER BY j.id LIMIT $2"
    ))
    .bind(super::ts(older_than))
    .bind(if limit <= 0 { DEFAULT_LIMIT } else { limit })
    .bind(STEP_HOOK)
    .fetch_all(&store.pool)
    .await
    .map_err(Error::db("job_liveness"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("decode job liveness");
            let job_id: i64 = r.try_get("id").map_err(d())?;
            let status: String = r.try_get("status").map_err(d())?;
            Ok(JobLiveness {
                job_id,
                pipeline: r.try_get("pipeline").map_err(d())?,
                status: status.parse::<JobStatus>().map_err(|e| Error::Corrupt {
                    what: "job",
                    id: job_id,
                    message: e.to_string(),
                })?,
                step_index: r.try_get("step_index").map_err(d())?,
                updated_at: r.try_get("updated_at").map_err(d())?,
                has_action: r.try_get("has_action").map_err(d())?,
                is_batch_parent: r.try_get("is_batch_parent").map_err(d())?,
                fenced: r.try_get("fenced").map_err(d())?,
                active_children: r.try_get("active_children").map_err(d())?,
                step_failed: r.try_get("step_failed").map_err(d())?,
            })
        })
        .collect()
}

/// Every broken invariant; see [`crate::Store::audit`].
pub(super) async fn audit(
    store: &PgStore,
    now: DateTime<Utc>,
    grace: chrono::Duration,
) -> Result<Vec<Violation>> {
    let op = "audit";
    // One snapshot for every check, and nothing written.
    let mut tx = store.begin(op).await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let mut found = Vec::new();
    claims_of_final_jobs(&mut tx, &mut found).await?;
    stranded_jobs(&mut tx, &mut found).await?;
    expired_leases(&mut tx, now, grace, &mut found).await?;
    counter_mismatches(&mut tx, &mut found).await?;
    tx.commit().await.map_err(Error::db(op))?;
    Ok(found)
}

/// (1) Claims still `claimed` by a job that is final (the bridge settles them in its commit).
async fn claims_of_final_jobs(conn: &mut PgConnection, found: &mut Vec<Violation>) -> Result<()> {
    let op = "audit (claims)";
    let rows = sqlx::query(
        "SELECT c.scope, c.source_type, c.item_id, c.job_id, j.status
         FROM dockhand_item_claims c JOIN dockhand_jobs j ON j.id = c.job_id
         WHERE c.status = 'claimed' AND j.status = ANY($1)
         ORDER BY c.id",
    )
    .bind(final_statuses())
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    for r in &rows {
        let item: String = r.try_get("item_id").map_err(Error::db(op))?;
        let scope: String = r.try_get("scope").map_err(Error::db(op))?;
        let source: String = r.try_get("source_type").map_err(Error::db(op))?;
        let job: i64 = r.try_get("job_id").map_err(Error::db(op))?;
        let status: String = r.try_get("status").map_err(Error::db(op))?;
        let shown: String = item.chars().take(ITEM_SHOWN).collect();
        found.push(Violation {
            invariant: "claim_held_by_final_job",
            subject: format!("claim {scope}/{source}/{shown}"),
            detail: format!("still claimed by job {job}, which is {status}"),
        });
    }
    Ok(())
}

/// (2) Processing jobs nothing will move, and (3) fenced parents with every child terminal that
/// are not final and have no action (no finalize pending).
async fn stranded_jobs(conn: &mut PgConnection, found: &mut Vec<Violation>) -> Result<()> {
    let op = "audit (jobs)";
    let rows = sqlx::query(&format!(
        "SELECT j.id, j.status, j.step_index, j.batch_state, j.children_total
         FROM dockhand_jobs j
         WHERE NOT {HAS_ACTION} AND j.children_total = j.children_terminal
           AND (j.status = 'processing'
                OR (j.batch_state = 'fenced' AND NOT (j.status = ANY($1))))
         ORDER BY j.id"
    ))
    .bind(final_statuses())
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut fenced = Vec::new();
    for r in &rows {
        let id: i64 = r.try_get("id").map_err(Error::db(op))?;
        let status: String = r.try_get("status").map_err(Error::db(op))?;
        let step: i32 = r.try_get("step_index").map_err(Error::db(op))?;
        let state: Option<String> = r.try_get("batch_state").map_err(Error::db(op))?;
        let children: i32 = r.try_get("children_total").map_err(Error::db(op))?;
        if status == "processing" {
            found.push(Violation {
                invariant: "processing_job_without_path",
                subject: format!("job {id}"),
                detail: format!(
                    "processing at step {step} with no pending or running action and no \
                     active child"
                ),
            });
        }
        if state.as_deref() == Some("fenced") {
            fenced.push(Violation {
                invariant: "fenced_parent_not_final",
                subject: format!("job {id}"),
                detail: format!(
                    "{status}, fenced with all {children} children terminal, but no finalize \
                     action is pending"
                ),
            });
        }
    }
    found.append(&mut fenced);
    Ok(())
}

/// (4) Running actions whose lease expired longer than `grace` ago (the reaper is behind), or
/// that have none.
async fn expired_leases(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    grace: chrono::Duration,
    found: &mut Vec<Violation>,
) -> Result<()> {
    let op = "audit (leases)";
    let cutoff = now.checked_sub_signed(grace).unwrap_or(now);
    let rows = sqlx::query(
        "SELECT id, hook, lease_owner, lease_until FROM dockhand_actions
         WHERE status = 'running' AND (lease_until IS NULL OR lease_until < $1)
         ORDER BY id",
    )
    .bind(super::ts(cutoff))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    for r in &rows {
        let id: i64 = r.try_get("id").map_err(Error::db(op))?;
        let hook: String = r.try_get("hook").map_err(Error::db(op))?;
        let owner: Option<String> = r.try_get("lease_owner").map_err(Error::db(op))?;
        let until: Option<DateTime<Utc>> = r.try_get("lease_until").map_err(Error::db(op))?;
        let lease = match until {
            Some(t) => format!("a lease that expired at {}", t.to_rfc3339()),
            None => "no lease".to_string(),
        };
        found.push(Violation {
            invariant: "running_without_live_lease",
            subject: format!("action {id}"),
            detail: format!(
                "running `{hook}` held by {} with {lease}",
                owner.as_deref().unwrap_or("nobody")
            ),
        });
    }
    Ok(())
}

/// (5) Batch parents whose counters differ from the counts of their child rows by status group.
async fn counter_mismatches(conn: &mut PgConnection, found: &mut Vec<Violation>) -> Result<()> {
    let op = "audit (counters)";
    let rows = sqlx::query(
        "SELECT p.id,
                p.children_total::int8 AS total, c.total AS rows_total,
                p.children_terminal::int8 AS terminal, c.terminal AS rows_terminal,
                p.children_completed::int8 AS completed, c.completed AS rows_completed,
                p.children_failed::int8 AS failed, c.failed AS rows_failed,
                p.children_skipped::int8 AS skipped, c.skipped AS rows_skipped
         FROM dockhand_jobs p CROSS JOIN LATERAL (
            SELECT count(*) AS total,
                   count(*) FILTER (WHERE status = ANY($1)) AS terminal,
                   count(*) FILTER (WHERE status = 'completed') AS completed,
                   count(*) FILTER (WHERE status IN ('failed', 'cancelled')) AS failed,
                   count(*) FILTER (WHERE status IN ('skipped', 'completed_no_items')) AS skipped
            FROM dockhand_jobs WHERE parent_id = p.id) c
         WHERE p.batch_state IS NOT NULL
           AND (p.children_total <> c.total OR p.children_terminal <> c.terminal
                OR p.children_completed <> c.completed OR p.children_failed <> c.failed
                OR p.children_skipped <> c.skipped)
         ORDER BY p.id",
    )
    .bind(final_statuses())
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    for r in &rows {
        let id: i64 = r.try_get("id").map_err(Error::db(op))?;
        let mut parts = Vec::new();
        for name in ["total", "terminal", "completed", "failed", "skipped"] {
            let counter: i64 = r.try_get(name).map_err(Error::db(op))?;
            let counted: i64 = r
                .try_get(format!("rows_{name}").as_str())
                .map_err(Error::db(op))?;
            if counter != counted {
                parts.push(format!(
                    "children_{name} = {counter} but {counted} child rows"
                ));
            }
        }
        found.push(Violation {
            invariant: "parent_counters_mismatch",
            subject: format!("job {id}"),
            detail: parts.join("; "),
        });
    }
    Ok(())
}
