//! MySQL: claiming due actions and heartbeating their leases.
//!
//! Claim (Q3), one transaction: `SELECT id … WHERE status = 'pending' AND scheduled_at <= now
//! ORDER BY priority, scheduled_at, id LIMIT n FOR UPDATE SKIP LOCKED` over the index
//! `(status, priority, scheduled_at, id)` (concurrent claimers take disjoint rows without
//! waiting; the hook filter and the routing of [`crate::store::Routing`] filter that scan),
//! then one `UPDATE … WHERE id IN (…)` stamping the lease, the rows read back, and one
//! multi-row insert of `started` log rows. While group limits exist (migration 0016) the pick
//! leaves limited groups out and [`super::limits`] adds each one's share, under its row lock.

use super::{from_ms, limits, ms, opt_text, retry_deadlocks, text, MySqlStore};
use crate::error::{Error, Result};
use crate::limits::Candidate;
use crate::store::{ClaimRequest, ClaimedAction, Lease};
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

pub(super) async fn claim(
    store: &MySqlStore,
    req: &ClaimRequest<'_>,
) -> Result<Vec<ClaimedAction>> {
    if req.limit <= 0 || req.hooks.is_some_and(|h| h.is_empty()) {
        return Ok(Vec::new());
    }
    retry_deadlocks("claim", || async move {
        let mut tx = store.begin("claim").await?;
        let claimed = claim_on(&mut tx, req).await?;
        if claimed.is_empty() {
            tx.rollback().await.map_err(Error::db("claim"))?;
        } else {
            tx.commit().await.map_err(Error::db("claim"))?;
        }
        Ok(claimed)
    })
    .await
}

pub(super) async fn claim_on(
    conn: &mut MySqlConnection,
    req: &ClaimRequest<'_>,
) -> Result<Vec<ClaimedAction>> {
    // Paused and limited groups, read without locks first: inside the locking pick below a
    // pause row held by another transaction would be skipped (SKIP LOCKED), and its group's
    // actions claimed.
    let rows = sqlx::query(
        "SELECT group_name, CAST(0 AS SIGNED) AS limited FROM dockhand_group_pauses
         UNION ALL SELECT group_name, CAST(1 AS SIGNED) FROM dockhand_group_limits",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("claim (paused groups)"))?;
    let (mut paused, mut limited) = (Vec::new(), Vec::new());
    for r in &rows {
        let d = || Error::db("claim (paused groups)");
        let name = text(r, "group_name").map_err(d())?;
        if r.try_get::<i64, _>("limited").map_err(d())? == 0 {
            paused.push(name);
        } else {
            limited.push(name);
        }
    }
    let (ids, states) = if limited.is_empty() {
        let picked = pick(&mut *conn, req, &paused, None, req.limit).await?;
        (picked.into_iter().map(|c| c.id).collect(), Vec::new())
    } else {
        limits::pick_limited(&mut *conn, req, &paused, &limited).await?
    };
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "UPDATE dockhand_actions SET status = 'running', lease_token = lease_token + 1,
         attempt = attempt + 1, lease_owner = ",
    );
    qb.push_bind(req.owner)
        .push(", lease_until = ")
        .push_bind(ms(req.lease_until))
        .push(", started_at = ")
        .push_bind(ms(req.now))
        .push(" WHERE status = 'pending' AND id");
    push_in(&mut qb, &ids);
    qb.build()
        .execute(&mut *conn)
        .await
        .map_err(Error::db("claim"))?;
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "SELECT id, hook, args, group_name, scheduled_at, attempt, max_attempts, timeout_ms,
         lease_token FROM dockhand_actions WHERE id IN (",
    );
    push_list(&mut qb, &ids);
    qb.push(") ORDER BY priority, scheduled_at, id");
    let rows = qb
        .build()
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim"))?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let d = || Error::db("claim");
        let id: i64 = row.try_get("id").map_err(d())?;
        let args_text = text(&row, "args").map_err(d())?;
        let args = serde_json::from_str(&args_text).map_err(|e| Error::Corrupt {
            what: "action",
            id,
            message: format!("args: {e}"),
        })?;
        claimed.push(ClaimedAction {
            id,
            hook: text(&row, "hook").map_err(d())?,
            args,
            group: opt_text(&row, "group_name").map_err(d())?,
            scheduled_at: from_ms(row.try_get("scheduled_at").map_err(d())?),
            attempt: row.try_get("attempt").map_err(d())?,
            max_attempts: row.try_get("max_attempts").map_err(d())?,
            timeout_ms: row.try_get("timeout_ms").map_err(d())?,
            token: row.try_get("lease_token").map_err(d())?,
        });
    }
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("INSERT INTO dockhand_action_logs (action_id, at, event, detail) ");
    qb.push_values(&claimed, |mut b, c| {
        b.push_bind(c.id)
            .push_bind(ms(req.now))
            .push("'started'")
            .push_bind(req.owner);
    });
    qb.build()
        .execute(&mut *conn)
        .await
        .map_err(Error::db("claim (log)"))?;
    limits::record_starts(conn, &states, &claimed, ms(req.now)).await?;
    Ok(claimed)
}

/// Up to `n` claimable rows in claim order, locked (`FOR UPDATE SKIP LOCKED`): of `only` one
/// group, or of any group but the `excluded` ones.
pub(super) async fn pick(
    conn: &mut MySqlConnection,
    req: &ClaimRequest<'_>,
    excluded: &[String],
    only: Option<&str>,
    n: i64,
) -> Result<Vec<Candidate>> {
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "SELECT id, priority, scheduled_at FROM dockhand_actions
         WHERE status = 'pending' AND scheduled_at <= ",
    );
    qb.push_bind(ms(req.now));
    if let Some(group) = only {
        qb.push(" AND group_name = ").push_bind(group.to_owned());
    } else if !excluded.is_empty() {
        qb.push(" AND (group_name IS NULL OR group_name NOT IN (");
        let mut sep = qb.separated(", ");
        for g in excluded {
            sep.push_bind(g.clone());
        }
        qb.push("))");
    }
    if let Some(hooks) = req.hooks {
        qb.push(" AND hook IN (");
        let mut sep = qb.separated(", ");
        for h in hooks {
            sep.push_bind(h.clone());
        }
        qb.push(")");
    }
    if let Some(routing) = req.routing.filter(|r| !r.hooks.is_empty()) {
        qb.push(" AND (hook NOT IN (");
        let mut sep = qb.separated(", ");
        for h in routing.hooks {
            sep.push_bind(h.clone());
        }
        qb.push(")");
        if !routing.groups.is_empty() {
            qb.push(" OR group_name IN (");
            let mut sep = qb.separated(", ");
            for g in routing.groups {
                sep.push_bind(g.clone());
            }
            qb.push(")");
        }
        qb.push(")");
    }
    qb.push(" ORDER BY priority, scheduled_at, id LIMIT ")
        .push_bind(n)
        .push(" FOR UPDATE SKIP LOCKED");
    let rows = qb
        .build()
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("claim"))?;
    rows.iter()
        .map(|r| {
            let d = || Error::db("claim");
            Ok(Candidate {
                id: r.try_get("id").map_err(d())?,
                priority: r.try_get("priority").map_err(d())?,
                scheduled_at: r.try_get("scheduled_at").map_err(d())?,
            })
        })
        .collect()
}

/// Appends ` IN (v, v, …)`, every value a bound parameter.
pub(super) fn push_in<'a, T>(qb: &mut QueryBuilder<'a, MySql>, values: &[T])
where
    T: Copy + Send + 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql>,
{
    qb.push(" IN (");
    push_list(qb, values);
    qb.push(")");
}

/// Appends `v, v, …` as bound parameters (the inside of an `IN (…)` list).
pub(super) fn push_list<'a, T>(qb: &mut QueryBuilder<'a, MySql>, values: &[T])
where
    T: Copy + Send + 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql>,
{
    let mut sep = qb.separated(", ");
    for v in values {
        sep.push_bind(*v);
    }
}

pub(super) async fn heartbeat(
    store: &MySqlStore,
    owner: &str,
    leases: &[Lease],
    until: DateTime<Utc>,
) -> Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    retry_deadlocks("heartbeat", || async move {
        let mut total = 0;
        // Three parameters per lease: stay far below the 65,535-parameter limit.
        for chunk in leases.chunks(10_000) {
            let mut qb: QueryBuilder<MySql> =
                QueryBuilder::new("UPDATE dockhand_actions SET lease_until = ");
            qb.push_bind(ms(until))
                .push(" WHERE status = 'running' AND lease_owner = ")
                .push_bind(owner)
                .push(" AND id IN (");
            let ids: Vec<i64> = chunk.iter().map(|l| l.id).collect();
            push_list(&mut qb, &ids);
            qb.push(") AND (");
            let mut sep = qb.separated(" OR ");
            for l in chunk {
                sep.push("(id = ")
                    .push_bind_unseparated(l.id)
                    .push_unseparated(" AND lease_token = ")
                    .push_bind_unseparated(l.token)
                    .push_unseparated(")");
            }
            qb.push(")");
            let done = qb
                .build()
                .execute(store.pool())
                .await
                .map_err(Error::db("heartbeat"))?;
            total += done.rows_affected();
        }
        Ok(total)
    })
    .await
}
