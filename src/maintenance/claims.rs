//! Claim renewal (issue 15, defect 6): a job holds its item claims as long as it lives. Each
//! pass extends, in bounded set-based batches ([`crate::Store::renew_claims`]), the claims of
//! jobs that are not final once half their TTL has passed; claims of final jobs, of job ids
//! with no row and free-standing ones are left to expire, so another owner may take them over.

use super::{Maintenance, MaintenanceReport};
use crate::error::Result;
use tracing::Instrument;

/// At most this many batches per pass (the rest waits for the next pass).
const MAX_ROUNDS: usize = 100;

impl Maintenance {
    /// Renews the claims of live jobs that used half their TTL.
    pub async fn renew_claims(&self, report: &mut MaintenanceReport) -> Result<()> {
        async {
            for _ in 0..MAX_ROUNDS {
                let n = self
                    .store
                    .renew_claims(self.clock.now(), self.config.batch)
                    .await?;
                report.claims_renewed += n;
                if (n as i64) < self.config.batch {
                    break;
                }
            }
            if report.claims_renewed > 0 {
                tracing::debug!(
                    count = report.claims_renewed,
                    "item claims of live jobs renewed"
                );
            }
            Ok(())
        }
        .instrument(tracing::debug_span!(
            "dockhand.maintenance",
            task = "claims"
        ))
        .await
    }
}
