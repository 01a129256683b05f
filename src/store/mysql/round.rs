//! MySQL: a runner's round, its finishes and its next claim in one transaction (one commit,
//! one redo-log flush instead of two). The finishes lock their rows first, as
//! [`super::finish`] does; the claim then picks pending rows with `SKIP LOCKED`, so the two
//! never wait on each other.

use super::claim::claim_on;
use super::finish::{finish_chunk, FINISH_CHUNK};
use super::{retry_deadlocks, MySqlStore};
use crate::error::{Error, Result};
use crate::store::{ClaimRequest, Finish, FinishAndClaim, FinishResult, Lease};
use chrono::{DateTime, Utc};

pub(super) async fn finish_and_claim(
    store: &MySqlStore,
    items: &[(Lease, Finish)],
    req: &ClaimRequest<'_>,
    now: DateTime<Utc>,
) -> Result<FinishAndClaim> {
    let claims = req.limit > 0 && !req.hooks.is_some_and(|h| h.is_empty());
    let round = retry_deadlocks("finish_and_claim", || async move {
        let mut tx = store.begin("finish_and_claim").await?;
        let mut finished = Vec::with_capacity(items.len());
        for chunk in items.chunks(FINISH_CHUNK) {
            finished.extend(finish_chunk(&mut tx, chunk, now).await?);
        }
        let claimed = if claims {
            claim_on(&mut tx, req).await?
        } else {
            Vec::new()
        };
        tx.commit().await.map_err(Error::db("finish_and_claim"))?;
        Ok(FinishAndClaim {
            finished,
            claimed: Ok(claimed),
        })
    })
    .await?;
    if items.iter().zip(&round.finished).any(|((_, o), r)| {
        matches!(
            (r, o),
            (FinishResult::Applied, Finish::Fail { .. } | Finish::Release)
        )
    }) {
        // A failed step action enqueued its job's finish action; a release is due again.
        store.wake.notify();
    }
    Ok(round)
}
