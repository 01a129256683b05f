//! SQLite: the operator views of groups, jobs and item claims (the dashboard's overview,
//! groups, jobs, batches and claims pages). Jobs and claims are keyset-paged by id; group and
//! scope names are found by skipping through their indexes (`MIN(name) … WHERE name > ?`),
//! one seek per name, and every count stops at a cap.

use super::claims::{claim_from_row, CLAIM_COLUMNS};
use super::jobs::{job_from_row, JOB_COLUMNS};
use super::ui::{summary_columns, summary_from_row};
use super::{from_ms, ms, SqliteStore};
use crate::error::{Error, Result};
use crate::search::{
    ActionSummary, ClaimPage, ClaimRow, ClaimSearch, GroupPause, GroupStat, IdPage, JobPage,
    JobSearch, ScopeStat,
};
use crate::store::Capped;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Row, Sqlite};

/// `SELECT COUNT(*)` of `FROM … WHERE …` (the text after `SELECT 1`), stopping at `cap`.
async fn capped(store: &SqliteStore, mut qb: QueryBuilder<'_, Sqlite>, cap: i64) -> Result<Capped> {
    qb.push(" LIMIT ").push_bind(cap.max(0) + 1).push(") AS c");
    let n: i64 = qb
        .build_query_scalar()
        .fetch_one(&store.reader)
        .await
        .map_err(Error::db("capped count"))?;
    Ok(Capped {
        n: n.min(cap.max(0)),
        capped: n > cap.max(0),
    })
}

fn count_of(from_where: &str) -> QueryBuilder<'static, Sqlite> {
    QueryBuilder::new(format!("SELECT COUNT(*) FROM (SELECT 1 {from_where}"))
}

/// Appends the id keyset and order of a newest-first page and the `limit + 1` row limit.
fn push_id_page(
    qb: &mut QueryBuilder<'_, Sqlite>,
    after: Option<i64>,
    before: Option<i64>,
    limit: i64,
) {
    if let Some(a) = after {
        qb.push(" AND id < ").push_bind(a);
    }
    if let Some(b) = before {
        qb.push(" AND id > ").push_bind(b);
    }
    qb.push(if before.is_some() {
        " ORDER BY id ASC"
    } else {
        " ORDER BY id DESC"
    });
    qb.push(" LIMIT ").push_bind(limit + 1);
}

pub(super) async fn group_overview(
    store: &SqliteStore,
    now: DateTime<Utc>,
    cap: i64,
    max_groups: i64,
) -> Result<Vec<GroupStat>> {
    let mut groups: Vec<Option<String>> = vec![None];
    let mut last: Option<String> = None;
    while (groups.len() as i64) <= max_groups {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT MIN(group_name) FROM dockhand_actions WHERE group_name IS NOT NULL",
        );
        if let Some(l) = &last {
            qb.push(" AND group_name > ").push_bind(l.clone());
        }
        let next: Option<String> = qb
            .build_query_scalar()
            .fetch_one(&store.reader)
            .await
            .map_err(Error::db("group names"))?;
        let Some(g) = next else { break };
        last = Some(g.clone());
        groups.push(Some(g));
    }
    let mut out = Vec::with_capacity(groups.len());
    for group in groups {
        let filter = |qb: &mut QueryBuilder<'_, Sqlite>| match &group {
            Some(g) => {
                qb.push(" AND group_name = ").push_bind(g.clone());
            }
            None => {
                qb.push(" AND group_name IS NULL");
            }
        };
        let mut qb = count_of("FROM dockhand_actions WHERE status = 'pending'");
        filter(&mut qb);
        let pending = capped(store, qb, cap).await?;
        let mut qb = count_of("FROM dockhand_actions WHERE status = 'pending'");
        filter(&mut qb);
        qb.push(" AND scheduled_at <= ").push_bind(ms(now));
        let due = capped(store, qb, cap).await?;
        let mut qb = count_of("FROM dockhand_actions WHERE status = 'running'");
        filter(&mut qb);
        let running = capped(store, qb, cap).await?;
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT MIN(scheduled_at) FROM dockhand_actions WHERE status = 'pending'",
        );
        filter(&mut qb);
        qb.push(" AND scheduled_at <= ").push_bind(ms(now));
        let oldest: Option<i64> = qb
            .build_query_scalar()
            .fetch_one(&store.reader)
            .await
            .map_err(Error::db("group lag"))?;
        if group.is_none() && pending.n == 0 && running.n == 0 {
            continue;
        }
        out.push(GroupStat {
            group,
            pending,
            due,
            running,
            oldest_due: oldest.map(from_ms),
        });
    }
    Ok(out)
}

pub(super) async fn set_group_paused(
    store: &SqliteStore,
    group: &str,
    paused: bool,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut conn = store.write_conn("set group paused").await?;
    let done = if paused {
        sqlx::query(
            "INSERT INTO dockhand_group_pauses (group_name, paused_at, paused_by) VALUES (?, ?, ?)
             ON CONFLICT (group_name) DO NOTHING",
        )
        .bind(group)
        .bind(ms(now))
        .bind(actor)
        .execute(&mut *conn)
        .await
    } else {
        sqlx::query("DELETE FROM dockhand_group_pauses WHERE group_name = ?")
            .bind(group)
            .execute(&mut *conn)
            .await
    }
    .map_err(Error::db("set group paused"))?;
    drop(conn);
    if !paused && done.rows_affected() > 0 {
        store.notify();
    }
    Ok(done.rows_affected() > 0)
}

pub(super) async fn paused_groups(store: &SqliteStore) -> Result<Vec<GroupPause>> {
    let rows = sqlx::query(
        "SELECT group_name, paused_at, paused_by FROM dockhand_group_pauses ORDER BY group_name",
    )
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db("paused groups"))?;
    rows.iter()
        .map(|r| {
            Ok(GroupPause {
                group: r.try_get("group_name").map_err(Error::db("decode pause"))?,
                paused_at: from_ms(r.try_get("paused_at").map_err(Error::db("decode pause"))?),
                paused_by: r.try_get("paused_by").map_err(Error::db("decode pause"))?,
            })
        })
        .collect()
}

pub(super) async fn search_jobs(store: &SqliteStore, s: &JobSearch) -> Result<JobPage> {
    s.validate()?;
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT {JOB_COLUMNS} FROM dockhand_jobs WHERE 1 = 1"
    ));
    if let Some(st) = s.status {
        qb.push(" AND status = ").push_bind(st.as_str());
    }
    if let Some(p) = &s.pipeline {
        qb.push(" AND pipeline = ").push_bind(p.clone());
    }
    if let Some(p) = s.parent_id {
        qb.push(" AND parent_id = ").push_bind(p);
    }
    if s.batches_only {
        qb.push(" AND batch_state IS NOT NULL");
    }
    push_id_page(&mut qb, s.after, s.before, s.limit);
    let rows = qb
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("search jobs"))?;
    let jobs = rows.iter().map(job_from_row).collect::<Result<Vec<_>>>()?;
    Ok(IdPage::assemble(jobs, |j| j.id, s.limit, s.after, s.before))
}

pub(super) async fn job_actions(
    store: &SqliteStore,
    job_id: i64,
    limit: i64,
) -> Result<Vec<ActionSummary>> {
    let rows = sqlx::query(&format!(
        "SELECT {} FROM dockhand_actions
         WHERE (unique_key >= ?1 AND unique_key < ?2) OR (unique_key >= ?3 AND unique_key < ?4)
            OR unique_key = ?5
         ORDER BY id DESC LIMIT ?6",
        summary_columns()
    ))
    .bind(format!("j:{job_id}:"))
    .bind(format!("j:{job_id};"))
    .bind(format!("b:{job_id}:"))
    .bind(format!("b:{job_id};"))
    .bind(format!("f:{job_id}"))
    .bind(limit.max(0))
    .fetch_all(&store.reader)
    .await
    .map_err(Error::db("job actions"))?;
    rows.iter().map(summary_from_row).collect()
}

pub(super) async fn search_claims(store: &SqliteStore, s: &ClaimSearch) -> Result<ClaimPage> {
    s.validate()?;
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT {CLAIM_COLUMNS} FROM dockhand_item_claims WHERE 1 = 1"
    ));
    if let Some(sc) = &s.scope {
        qb.push(" AND scope = ").push_bind(sc.clone());
    }
    if let Some(st) = s.status {
        qb.push(" AND status = ").push_bind(st.as_str());
    }
    if let Some(j) = s.job_id {
        qb.push(" AND job_id = ").push_bind(j);
    }
    if let Some(t) = s.stale_at {
        qb.push(" AND status = 'claimed' AND expires_at < ")
            .push_bind(ms(t));
    }
    push_id_page(&mut qb, s.after, s.before, s.limit);
    let rows = qb
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(Error::db("search claims"))?;
    let claims = rows
        .iter()
        .map(|r| {
            Ok(ClaimRow {
                id: r.try_get("id").map_err(Error::db("decode claim"))?,
                claim: claim_from_row(r)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(IdPage::assemble(
        claims,
        |c| c.id,
        s.limit,
        s.after,
        s.before,
    ))
}

pub(super) async fn claim_scopes(
    store: &SqliteStore,
    now: DateTime<Utc>,
    cap: i64,
    max_scopes: i64,
) -> Result<Vec<ScopeStat>> {
    let mut out = Vec::new();
    let mut last: Option<String> = None;
    while (out.len() as i64) < max_scopes {
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new("SELECT MIN(scope) FROM dockhand_item_claims");
        if let Some(l) = &last {
            qb.push(" WHERE scope > ").push_bind(l.clone());
        }
        let next: Option<String> = qb
            .build_query_scalar()
            .fetch_one(&store.reader)
            .await
            .map_err(Error::db("claim scopes"))?;
        let Some(scope) = next else { break };
        last = Some(scope.clone());
        let mut counts = Vec::with_capacity(3);
        for status in ["claimed", "processed", "deferred"] {
            let mut qb = count_of("FROM dockhand_item_claims WHERE scope = ");
            qb.push_bind(scope.clone())
                .push(" AND status = ")
                .push_bind(status);
            counts.push(capped(store, qb, cap).await?);
        }
        let mut qb = count_of("FROM dockhand_item_claims WHERE scope = ");
        qb.push_bind(scope.clone())
            .push(" AND status = 'claimed' AND expires_at < ")
            .push_bind(ms(now));
        let stale = capped(store, qb, cap).await?;
        out.push(ScopeStat {
            scope,
            claimed: counts[0],
            processed: counts[1],
            deferred: counts[2],
            stale,
        });
    }
    Ok(out)
}
