//! Re-running a whole store transaction in-process when it rolled back for a reason a new
//! attempt may clear: a deadlock or serialization failure, or a completion handler's transient
//! failure ([`Error::reruns_transaction`]). MySQL/MariaDB runs every multi-statement write this
//! way (`mysql::connect::retry_deadlocks`); PostgreSQL and SQLite run the transactions that
//! call completion handlers (`complete_claim`, the bridge's `finish_job`) and the claim
//! statement through [`rerun_transaction`]. Each re-run is counted in
//! [`telemetry::STORE_DEADLOCK_RETRIES`].

use crate::error::{Error, Result};
use crate::telemetry;
use backon::{ExponentialBuilder, Retryable};
use std::future::Future;
use std::time::Duration;

/// How many times a transaction runs at most.
const ATTEMPTS: usize = 10;

/// Runs `f` (a whole transaction: begin, work, commit) and runs it again after a short
/// jittered backoff while it fails with an error that [`Error::reruns_transaction`], up to
/// [`ATTEMPTS`] times; the last error, or any other one, is returned.
pub(crate) async fn rerun_transaction<T, F, Fut>(
    backend: &'static str,
    op: &'static str,
    f: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(2))
        .with_max_delay(Duration::from_millis(200))
        .with_factor(2.0)
        .with_jitter()
        .with_max_times(ATTEMPTS - 1);
    f.retry(backoff)
        .sleep(tokio::time::sleep)
        .when(Error::reruns_transaction)
        .notify(|e, after| {
            metrics::counter!(
                telemetry::STORE_DEADLOCK_RETRIES,
                "backend" => backend,
                "op" => op
            )
            .increment(1);
            tracing::debug!(backend, op, error = %e, ?after, "store transaction re-run");
        })
        .await
}
