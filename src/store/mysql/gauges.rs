//! MySQL/MariaDB: the Prometheus gauges (`Store::metrics_gauges`) in one statement: per group,
//! pending, due, running and failed actions and the oldest due time (one pass over the actions
//! not complete or canceled, by the `(group_name, status)` index), then one row with
//! processing jobs, open batches and held item claims. Sums are cast to `SIGNED` (MySQL sums
//! integers as DECIMAL).

use super::jobs::opt_text;
use super::{from_ms, ms, MySqlStore};
use crate::error::{Error, Result};
use crate::store::{GroupGauges, MetricsGauges};
use chrono::{DateTime, Utc};
use sqlx::Row;

const SQL: &str = "SELECT 0 AS kind, group_name,
        CAST(SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END) AS SIGNED) AS pending,
        CAST(SUM(CASE WHEN status = 'pending' AND scheduled_at <= ? THEN 1 ELSE 0 END)
            AS SIGNED) AS due,
        CAST(SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS SIGNED) AS running,
        CAST(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS SIGNED) AS failed,
        MIN(CASE WHEN status = 'pending' AND scheduled_at <= ? THEN scheduled_at END)
            AS oldest_due
    FROM dockhand_actions WHERE status IN ('pending', 'running', 'failed')
    GROUP BY group_name
    UNION ALL
    SELECT 1, NULL,
        (SELECT COUNT(*) FROM dockhand_jobs WHERE status = 'processing'),
        (SELECT COUNT(*) FROM dockhand_jobs WHERE batch_state IS NOT NULL
            AND status IN ('pending', 'processing', 'waiting')),
        (SELECT COUNT(*) FROM dockhand_item_claims WHERE status = 'claimed'),
        0, NULL";

pub(super) async fn metrics_gauges(
    store: &MySqlStore,
    now: DateTime<Utc>,
) -> Result<MetricsGauges> {
    let rows = sqlx::query(SQL)
        .bind(ms(now))
        .bind(ms(now))
        .fetch_all(store.pool())
        .await
        .map_err(Error::db("metrics gauges"))?;
    let mut out = MetricsGauges::default();
    for r in &rows {
        let get = |c: &str| r.try_get::<i64, _>(c).map_err(Error::db("decode gauges"));
        if get("kind")? == 1 {
            out.jobs_processing = get("pending")?;
            out.batches_open = get("due")?;
            out.claims_held = get("running")?;
            continue;
        }
        let oldest: Option<i64> = r
            .try_get("oldest_due")
            .map_err(Error::db("decode gauges"))?;
        out.groups.push(GroupGauges {
            group: opt_text(r, "group_name")?,
            pending: get("pending")?,
            due: get("due")?,
            running: get("running")?,
            failed: get("failed")?,
            oldest_due: oldest.map(from_ms),
        });
    }
    Ok(out)
}
