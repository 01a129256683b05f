//! The one check that a run still holds its action's lease (the action is `running` under the
//! run's token), on the caller's open transaction: the fence of every write a run makes besides
//! its own finish (a chunk's worklist leases and settles and its children, item claims, a
//! step's output, the bridge from a step). `FOR SHARE` holds the action row until the caller commits: the reaper (which skips locked
//! rows) cannot expire the lease, nor a newer run claim the action, in between.

use crate::error::{Error, Result};
use crate::store::Lease;
use sqlx::PgConnection;

/// Whether `lease` is still a running action's.
pub(super) async fn lease_live(
    conn: &mut PgConnection,
    lease: Lease,
    op: &'static str,
) -> Result<bool> {
    let live: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM dockhand_actions
         WHERE id = $1 AND status = 'running' AND lease_token = $2 FOR SHARE",
    )
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(conn)
    .await
    .map_err(Error::db(op))?;
    Ok(live.is_some())
}

/// Fails with [`Error::LeaseLost`] unless `lease` is still a running action's.
pub(super) async fn run_fence(
    conn: &mut PgConnection,
    lease: Lease,
    op: &'static str,
) -> Result<()> {
    if lease_live(conn, lease, op).await? {
        Ok(())
    } else {
        Err(lease.lost())
    }
}

/// [`run_fence`] for a write a run may make or not: `None` (the caller is no run, as in a test
/// or an operator tool) passes.
pub(super) async fn output_fence(
    conn: &mut PgConnection,
    fence: Option<Lease>,
    op: &'static str,
) -> Result<()> {
    match fence {
        Some(lease) => run_fence(conn, lease, op).await,
        None => Ok(()),
    }
}
