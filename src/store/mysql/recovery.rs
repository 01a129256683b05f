//! MySQL: recovery reads — what drives each stale job (R2, R3), and the invariant audit of
//! DESIGN §11 behind `dockhand check`. Read-only. `job_liveness` is one statement; the audit
//! runs its statements in one `REPEATABLE READ` transaction started `WITH CONSISTENT
//! SNAPSHOT` (sessions default to READ COMMITTED), so every answer comes from one snapshot.
//!
//! A job's actions are found by unique key among pending and running actions: step
//! `j:{id}:{step}`, chunk `b:{id}:{offset}`, finalize `f:{id}`. Prefixes are matched as key
//! ranges (`':'` sorts just before `';'`), which the `(unique_key, status)` index can serve,
//! where `LIKE` with a computed pattern could not. Flags and sums are cast to `SIGNED` (BIGINT):
//! MySQL sums integers as DECIMAL.

use super::fence::job_status;
use super::jobs::{opt_text, text};
use super::{from_ms, ms, MySqlStore};
use crate::batch::{JobLiveness, Violation};
use crate::error::{Error, Result};
use crate::jobs::STEP_HOOK;
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use sqlx::{MySqlConnection, Row};

/// True when a pending or running step, chunk or finalize action of job `j` exists.
const HAS_ACTIVE_ACTION: &str = "EXISTS (SELECT 1 FROM dockhand_actions a
    WHERE a.status IN ('pending', 'running')
      AND ((a.unique_key >= CONCAT('j:', j.id, ':') AND a.unique_key < CONCAT('j:', j.id, ';'))
        OR (a.unique_key >= CONCAT('b:', j.id, ':') AND a.unique_key < CONCAT('b:', j.id, ';'))
        OR a.unique_key = CONCAT('f:', j.id)))";

/// `('completed', …)`: the final job statuses as an SQL list.
fn final_statuses() -> String {
    let quoted: Vec<String> = JobStatus::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    format!("({})", quoted.join(", "))
}

pub(super) async fn job_liveness(
    store: &MySqlStore,
    older_than: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<JobLiveness>> {
    let op = "job_liveness";
    let limit = if limit <= 0 { 100 } else { limit };
    let rows = sqlx::query(&format!(
        "SELECT j.id, j.pipeline, j.status, j.step_index, j.updated_at,
            CAST({HAS_ACTIVE_ACTION} AS SIGNED) AS has_action,
            CAST(j.batch_state IS NOT NULL AS SIGNED) AS is_batch_parent,
            CAST(COALESCE(j.batch_state = 'fenced', 0) AS SIGNED) AS fenced,
            CAST(j.children_total - j.children_terminal AS SIGNED) AS active_children,
            CAST(EXISTS (SELECT 1 FROM dockhand_actions f
                    WHERE f.hook = ? AND f.status = 'failed'
                      AND f.unique_key = CONCAT('j:', j.id, ':', j.step_index)) AS SIGNED)
                AS step_failed
         FROM dockhand_jobs j
         WHERE j.status IN ('pending', 'processing') AND j.updated_at < ?
         ORDER BY j.id
         LIMIT ?"
    ))
    .bind(STEP_HOOK)
    .bind(ms(older_than))
    .bind(limit)
    .fetch_all(store.pool())
    .await
    .map_err(Error::db(op))?;
    let d = || Error::db("decode job liveness");
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get("id").map_err(d())?;
            let status = text(row, "status")?;
            let flag =
                |c: &str| -> Result<bool> { Ok(row.try_get::<i64, _>(c).map_err(d())? != 0) };
            Ok(JobLiveness {
                job_id: id,
                pipeline: text(row, "pipeline")?,
                status: job_status(id, &status)?,
                step_index: row.try_get("step_index").map_err(d())?,
                updated_at: from_ms(row.try_get("updated_at").map_err(d())?),
                has_action: flag("has_action")?,
                is_batch_parent: flag("is_batch_parent")?,
                fenced: flag("fenced")?,
                active_children: row.try_get("active_children").map_err(d())?,
                step_failed: flag("step_failed")?,
            })
        })
        .collect()
}

pub(super) async fn audit(
    store: &MySqlStore,
    now: DateTime<Utc>,
    grace: chrono::Duration,
) -> Result<Vec<Violation>> {
    let op = "audit";
    let cutoff = now.checked_sub_signed(grace).unwrap_or(now);
    // `SET TRANSACTION` applies to the next transaction only; the session stays READ COMMITTED.
    let mut tx = store
        .pool()
        .begin_with(
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
             START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
        )
        .await
        .map_err(Error::db(op))?;
    let mut found = claims_of_final_jobs(&mut tx).await?;
    found.extend(jobs_without_path(&mut tx).await?);
    found.extend(running_without_lease(&mut tx, cutoff).await?);
    found.extend(counter_mismatches(&mut tx).await?);
    tx.commit().await.map_err(Error::db(op))?;
    Ok(found)
}

fn violation(invariant: &'static str, subject: String, detail: String) -> Violation {
    Violation {
        invariant,
        subject,
        detail,
    }
}

/// (1) A claim still `claimed` by a job that is final (the bridge should have settled it).
async fn claims_of_final_jobs(conn: &mut MySqlConnection) -> Result<Vec<Violation>> {
    let rows = sqlx::query(&format!(
        "SELECT c.scope, c.source_type, c.item_id, j.id, j.status
         FROM dockhand_item_claims c JOIN dockhand_jobs j ON j.id = c.job_id
         WHERE c.status = 'claimed' AND j.status IN {}
         ORDER BY c.id",
        final_statuses()
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("audit (claims)"))?;
    let mut found = Vec::with_capacity(rows.len());
    for row in &rows {
        let item: String = text(row, "item_id")?.chars().take(60).collect();
        let job: i64 = row.try_get("id").map_err(Error::db("audit (claims)"))?;
        found.push(violation(
            "claim_held_by_final_job",
            format!(
                "claim {}/{}/{item}",
                text(row, "scope")?,
                text(row, "source_type")?
            ),
            format!(
                "still claimed by job {job}, which is {}",
                text(row, "status")?
            ),
        ));
    }
    Ok(found)
}

/// (2) Processing jobs nothing drives, and (3) fenced parents with every child terminal that
/// are not final and have no action to finalize them.
async fn jobs_without_path(conn: &mut MySqlConnection) -> Result<Vec<Violation>> {
    let op = "audit (jobs)";
    let stuck: Vec<(i64, i32, i32)> = sqlx::query_as(&format!(
        "SELECT j.id, j.step_index, j.children_total FROM dockhand_jobs j
         WHERE j.status = 'processing' AND j.children_total = j.children_terminal
           AND NOT {HAS_ACTIVE_ACTION}
         ORDER BY j.id"
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let fenced = sqlx::query(&format!(
        "SELECT j.id, j.status, j.children_total FROM dockhand_jobs j
         WHERE j.batch_state = 'fenced' AND j.children_total = j.children_terminal
           AND j.status NOT IN {} AND NOT {HAS_ACTIVE_ACTION}
         ORDER BY j.id",
        final_statuses()
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut found: Vec<Violation> = stuck
        .into_iter()
        .map(|(id, step, children)| {
            violation(
                "processing_job_without_path",
                format!("job {id}"),
                format!(
                    "processing at step {step} with no pending or running step, chunk or \
                     finalize action and no active child ({children} children, all terminal)"
                ),
            )
        })
        .collect();
    for row in &fenced {
        let id: i64 = row.try_get("id").map_err(Error::db(op))?;
        let children: i32 = row.try_get("children_total").map_err(Error::db(op))?;
        found.push(violation(
            "fenced_parent_not_final",
            format!("job {id}"),
            format!(
                "fenced with all {children} children terminal, still {}, and no pending \
                 or running action to finalize it",
                text(row, "status")?
            ),
        ));
    }
    Ok(found)
}

/// (4) Running actions whose lease expired before `cutoff` (or that have none).
async fn running_without_lease(
    conn: &mut MySqlConnection,
    cutoff: DateTime<Utc>,
) -> Result<Vec<Violation>> {
    let op = "audit (leases)";
    let rows = sqlx::query(
        "SELECT id, hook, lease_owner, lease_until FROM dockhand_actions
         WHERE status = 'running' AND (lease_until IS NULL OR lease_until < ?)
         ORDER BY id",
    )
    .bind(ms(cutoff))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let mut found = Vec::with_capacity(rows.len());
    for row in &rows {
        let id: i64 = row.try_get("id").map_err(Error::db(op))?;
        let until: Option<i64> = row.try_get("lease_until").map_err(Error::db(op))?;
        let owner = opt_text(row, "lease_owner")?;
        let owner = owner.as_deref().unwrap_or("nobody");
        let lease = match until {
            Some(t) => format!("lease expired at {}", from_ms(t).to_rfc3339()),
            None => "no lease".to_string(),
        };
        found.push(violation(
            "running_without_live_lease",
            format!("action {id}"),
            format!("running `{}` held by {owner}: {lease}", text(row, "hook")?),
        ));
    }
    Ok(found)
}

/// (5) Batch parents whose counters differ from the statuses of their child rows.
async fn counter_mismatches(conn: &mut MySqlConnection) -> Result<Vec<Violation>> {
    let rows = sqlx::query(&format!(
        "SELECT p.id,
                CAST(p.children_total AS SIGNED), CAST(p.children_terminal AS SIGNED),
                CAST(p.children_completed AS SIGNED), CAST(p.children_failed AS SIGNED),
                CAST(p.children_skipped AS SIGNED),
                CAST(COALESCE(c.total, 0) AS SIGNED), CAST(COALESCE(c.terminal, 0) AS SIGNED),
                CAST(COALESCE(c.completed, 0) AS SIGNED), CAST(COALESCE(c.failed, 0) AS SIGNED),
                CAST(COALESCE(c.skipped, 0) AS SIGNED)
             FROM dockhand_jobs p LEFT JOIN (
                SELECT parent_id, COUNT(*) AS total, SUM(status IN {final}) AS terminal,
                    SUM(status = 'completed') AS completed,
                    SUM(status IN ('failed', 'cancelled')) AS failed,
                    SUM(status IN ('skipped', 'completed_no_items')) AS skipped
                FROM dockhand_jobs WHERE parent_id IS NOT NULL GROUP BY parent_id
             ) c ON c.parent_id = p.id
             WHERE p.batch_state IS NOT NULL
             ORDER BY p.id",
        final = final_statuses()
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("audit (counters)"))?;
    let d = || Error::db("decode counters");
    let mut found = Vec::new();
    for row in rows {
        // Columns 1..=5: the stored counters; 6..=10: the same five counted from child rows.
        let mut v = [0i64; 11];
        for (i, slot) in v.iter_mut().enumerate() {
            *slot = row.try_get(i).map_err(d())?;
        }
        let (stored, counted) = (&v[1..6], &v[6..11]);
        if stored != counted {
            let show = |c: &[i64]| c.iter().map(i64::to_string).collect::<Vec<_>>().join("/");
            found.push(violation(
                "parent_counters_mismatch",
                format!("job {}", v[0]),
                format!(
                    "counters total/terminal/completed/failed/skipped are {}, its child rows \
                     count {}",
                    show(stored),
                    show(counted)
                ),
            ));
        }
    }
    Ok(found)
}
