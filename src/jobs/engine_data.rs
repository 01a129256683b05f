//! Engine data (E1, E2): a JSON document per job with a version, changed only by
//! compare-and-swap. No cache takes part in any decision: every mutation reads the database.

use crate::error::{Error, Result};
use crate::store::DynStore;
use serde_json::Value;

/// How many times a conflicting mutation is re-read and re-applied before giving up.
pub const MAX_CAS_ATTEMPTS: usize = 16;

/// Reads the job's engine data, applies `f`, and writes it back only if nobody else wrote in
/// between; on conflict, re-reads and retries up to [`MAX_CAS_ATTEMPTS`] times. Returns the
/// document as written.
pub async fn mutate<F>(store: &DynStore, job_id: i64, f: F) -> Result<Value>
where
    F: Fn(&mut Value) + Send + Sync,
{
    for attempt in 0..MAX_CAS_ATTEMPTS {
        let (mut data, version) = store.engine_data(job_id).await?.ok_or(Error::NotFound {
            what: "job",
            id: job_id,
        })?;
        f(&mut data);
        if store.cas_engine_data(job_id, version, &data).await? {
            return Ok(data);
        }
        // Spread contenders out a little before re-reading.
        tokio::time::sleep(std::time::Duration::from_micros(
            50 * (attempt as u64 + 1) + fastrand::u64(0..200),
        ))
        .await;
    }
    Err(Error::invalid(
        "engine_data",
        format!("job {job_id}: {MAX_CAS_ATTEMPTS} concurrent-write conflicts in a row; gave up"),
    ))
}
