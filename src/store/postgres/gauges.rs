//! PostgreSQL: the Prometheus gauges (`Store::metrics_gauges`) in one statement: per group,
//! pending, due, running and failed actions and the oldest due time (one pass over the actions
//! not complete or canceled), then one row with processing jobs, open batches and held item
//! claims.

use super::PgStore;
use crate::error::{Error, Result};
use crate::store::{GroupGauges, MetricsGauges};
use chrono::{DateTime, Utc};
use sqlx::Row;

const SQL: &str = "SELECT 0 AS kind, group_name,
        COUNT(*) FILTER (WHERE status = 'pending') AS pending,
        COUNT(*) FILTER (WHERE status = 'pending' AND scheduled_at <= $1) AS due,
        COUNT(*) FILTER (WHERE status = 'running') AS running,
        COUNT(*) FILTER (WHERE status = 'failed') AS failed,
        MIN(scheduled_at) FILTER (WHERE status = 'pending' AND scheduled_at <= $1) AS oldest_due
    FROM dockhand_actions WHERE status IN ('pending', 'running', 'failed')
    GROUP BY group_name
    UNION ALL
    SELECT 1, NULL,
        (SELECT COUNT(*) FROM dockhand_jobs WHERE status = 'processing'),
        (SELECT COUNT(*) FROM dockhand_jobs WHERE batch_state IS NOT NULL
            AND status IN ('pending', 'processing', 'waiting')),
        (SELECT COUNT(*) FROM dockhand_item_claims WHERE status = 'claimed'),
        0, NULL";

pub(super) async fn metrics_gauges(store: &PgStore, now: DateTime<Utc>) -> Result<MetricsGauges> {
    let rows = sqlx::query(SQL)
        .bind(now)
        .fetch_all(&store.pool)
        .await
        .map_err(Error::db("metrics gauges"))?;
    let mut out = MetricsGauges::default();
    for r in &rows {
        let get = |c: &str| r.try_get::<i64, _>(c).map_err(Error::db("decode gauges"));
        if r.try_get::<i32, _>("kind")
            .map_err(Error::db("decode gauges"))?
            == 1
        {
            out.jobs_processing = get("pending")?;
            out.batches_open = get("due")?;
            out.claims_held = get("running")?;
            continue;
        }
        out.groups.push(GroupGauges {
            group: r
                .try_get("group_name")
                .map_err(Error::db("decode gauges"))?,
            pending: get("pending")?,
            due: get("due")?,
            running: get("running")?,
            failed: get("failed")?,
            oldest_due: r
                .try_get("oldest_due")
                .map_err(Error::db("decode gauges"))?,
        });
    }
    Ok(out)
}
