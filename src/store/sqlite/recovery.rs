//! SQLite: recovery reads — what drives each stale job (R2, R3), and the invariant audit of
//! DESIGN §11 behind `dockhand check`. Read-only; each runs in one read transaction, so every
//! answer comes from one snapshot.
//!
//! A job's actions are found by unique key: step `j:{id}:{step}`, chunk `b:{id}:{offset}`,
//! finalize `f:{id}`. Prefixes are matched as key ranges (`':'` sorts just before `';'`), which
//! the unique index on active actions can serve, where `LIKE` could not.

use super::fence::job_status;
use super::{from_ms, ms, SqliteStore};
use crate::batch::{JobLiveness, Violation};
use crate::error::{Error, Result};
use crate::jobs::STEP_HOOK;
use crate::state::JobStatus;
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};

/// True when a pending or running step, chunk or finalize action of job `j` exists.
const HAS_ACTIVE_ACTION: &str = "EXISTS (SELECT 1 FROM dockhand_actions a
    WHERE a.status IN ('pending', 'running')
      AND ((a.unique_key >= 'j:' || j.id || ':' AND a.unique_key < 'j:' || j.id || ';')
        OR (a.unique_key >= 'b:' || j.id || ':' AND a.unique_key < 'b:' || j.id || ';')
        OR a.unique_key = 'f:' || j.id))";

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
    store: &SqliteStore,
    older_than: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<JobLiveness>> {
    let op = "job_liveness";
    let limit = if limit <= 0 { 100 } else { limit };
    let rows = sqlx::query(&format!(
        "SELECT j.id, j.pipeline, j.status, j.step_index, j.updated_at,
            {HAS_ACTIVE_ACTION} AS has_action,
            j.batch_state IS NOT NULL AS is_batch_parent,
            COALESCE(j.batch_state = 'fenced', 0) AS fenced,
            j.children_total - j.children_terminal AS active_children,
            EXISTS (SELECT 1 FROM dockhand_actions f
                    WHERE f.hook = ?1 AND f.status = 'failed'
                      AND f.unique_key = 'j:' || j.id || ':' || j.step_index) AS step_failed
         FROM dockhand_jobs j
         WHERE j.status IN ('pending', 'processing') AND j.updated_at < ?2
         ORDER BY j.id
         LIMIT ?3"
    ))
    .bind(STEP_HOOK)
    .bind(ms(older_than))
    .bind(limit)
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db(op))?;
    let d = || Error::db("decode job liveness");
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get("id").map_err(d())?;
            let status: String = row.try_get("status").map_err(d())?;
            let flag =
                |c: &str| -> Result<bool> { Ok(row.try_get::<i64, _>(c).map_err(d())? != 0) };
            Ok(JobLiveness {
                job_id: id,
                pipeline: row.try_get("pipeline").map_err(d())?,
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
    store: &SqliteStore,
    now: DateTime<Utc>,
    grace: chrono::Duration,
) -> Result<Vec<Violation>> {
    let cutoff = now.checked_sub_signed(grace).unwrap_or(now);
    let mut tx = store.reader.begin().await.map_err(Error::db("audit"))?;
    let mut found = claims_of_final_jobs(&mut tx).await?;
    found.extend(jobs_without_path(&mut tx).await?);
    found.extend(running_without_lease(&mut tx, cutoff).await?);
    found.extend(counter_mismatches(&mut tx).await?);
    tx.commit().await.map_err(Error::db("audit"))?;
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
async fn claims_of_final_jobs(conn: &mut SqliteConnection) -> Result<Vec<Violation>> {
    let rows: Vec<(String, String, String, i64, String)> = sqlx::query_as(&format!(
        "SELECT c.scope, c.source_type, c.item_id, j.id, j.status
         FROM dockhand_item_claims c JOIN dockhand_jobs j ON j.id = c.job_id
         WHERE c.status = 'claimed' AND j.status IN {}
         ORDER BY c.id",
        final_statuses()
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("audit (claims)"))?;
    Ok(rows
        .into_iter()
        .map(|(scope, source, item, job, status)| {
            let item: String = item.chars().take(60).collect();
            violation(
                "claim_held_by_final_job",
                format!("claim {scope}/{source}/{item}"),
                format!("still claimed by job {job}, which is {status}"),
            )
        })
        .collect())
}

/// (2) Processing jobs nothing drives, and (3) fenced parents with every child terminal that
/// are not final and have no action to finalize them.
async fn jobs_without_path(conn: &mut SqliteConnection) -> Result<Vec<Violation>> {
    let op = "audit (jobs)";
    let stuck: Vec<(i64, i32, i64)> = sqlx::query_as(&format!(
        "SELECT j.id, j.step_index, j.children_total FROM dockhand_jobs j
         WHERE j.status = 'processing' AND j.children_total = j.children_terminal
           AND NOT {HAS_ACTIVE_ACTION}
         ORDER BY j.id"
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let fenced: Vec<(i64, String, i64)> = sqlx::query_as(&format!(
        "SELECT j.id, j.status, j.children_total FROM dockhand_jobs j
         WHERE j.batch_state = 'fenced' AND j.children_total = j.children_terminal
           AND j.status NOT IN {} AND NOT {HAS_ACTIVE_ACTION}
         ORDER BY j.id",
        final_statuses()
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let stuck = stuck.into_iter().map(|(id, step, children)| {
        violation(
            "processing_job_without_path",
            format!("job {id}"),
            format!(
                "processing at step {step} with no pending or running step, chunk or finalize \
                 action and no active child ({children} children, all terminal)"
            ),
        )
    });
    let fenced = fenced.into_iter().map(|(id, status, children)| {
        violation(
            "fenced_parent_not_final",
            format!("job {id}"),
            format!(
                "fenced with all {children} children terminal, still {status}, and no pending \
                 or running action to finalize it"
            ),
        )
    });
    Ok(stuck.chain(fenced).collect())
}

/// (4) Running actions whose lease expired before `cutoff` (or that have none).
async fn running_without_lease(
    conn: &mut SqliteConnection,
    cutoff: DateTime<Utc>,
) -> Result<Vec<Violation>> {
    let rows: Vec<(i64, String, Option<String>, Option<i64>)> = sqlx::query_as(
        "SELECT id, hook, lease_owner, lease_until FROM dockhand_actions
         WHERE status = 'running' AND (lease_until IS NULL OR lease_until < ?)
         ORDER BY id",
    )
    .bind(ms(cutoff))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("audit (leases)"))?;
    Ok(rows
        .into_iter()
        .map(|(id, hook, owner, until)| {
            let owner = owner.as_deref().unwrap_or("nobody");
            let lease = match until {
                Some(t) => format!("lease expired at {}", from_ms(t).to_rfc3339()),
                None => "no lease".to_string(),
            };
            violation(
                "running_without_live_lease",
                format!("action {id}"),
                format!("running `{hook}` held by {owner}: {lease}"),
            )
        })
        .collect())
}

/// (5) Batch parents whose counters differ from the statuses of their child rows.
async fn counter_mismatches(conn: &mut SqliteConnection) -> Result<Vec<Violation>> {
    let rows = sqlx::query(&format!(
        "SELECT p.id, p.children_total, p.children_terminal, p.children_completed,
                p.children_failed, p.children_skipped, COALESCE(c.total, 0),
                COALESCE(c.terminal, 0), COALESCE(c.completed, 0), COALESCE(c.failed, 0),
                COALESCE(c.skipped, 0)
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
