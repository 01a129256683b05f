//! Group-committed rounds: finishing writes from concurrent runs are collected by the claim
//! loop and written together, each still guarded by its own id + token + status, in the same
//! round trip as the next claim when one is due ([`crate::Store::finish_and_claim`], as Oban
//! Pro flushes acknowledgements with its next fetch). Batching is opportunistic: whatever is
//! queued when no round is in flight goes in the next one, so a lone finish waits for nobody.
//! On shutdown the claim loop keeps serving rounds until every run has ended, so no
//! acknowledgement is dropped.

use super::Runner;
use crate::error::{Error, Result};
use crate::store::{ClaimedAction, DynStore, Finish, FinishResult, Lease};
use crate::telemetry;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// Most acknowledgements written in one round.
pub(crate) const MAX_BATCH: usize = 512;

/// One queued finishing write and where its result goes.
pub(crate) struct AckRequest {
    pub(crate) lease: Lease,
    pub(crate) outcome: Finish,
    pub(crate) reply: oneshot::Sender<Result<FinishResult>>,
}

/// The sending side, cloned into every run.
pub(crate) type AckSender = mpsc::Sender<AckRequest>;

/// Sends one finish through the claim loop and waits for its result.
pub(crate) async fn ack(tx: &AckSender, lease: Lease, outcome: &Finish) -> Result<FinishResult> {
    let (reply, rx) = oneshot::channel();
    let req = AckRequest {
        lease,
        outcome: outcome.clone(),
        reply,
    };
    if tx.send(req).await.is_err() {
        return Err(Error::Config("acknowledgement writer stopped".into()));
    }
    rx.await
        .map_err(|_| Error::Config("acknowledgement writer dropped the request".into()))?
}

/// What a round did about claiming.
pub(crate) struct RoundEnd {
    /// How many actions the round asked for (0: it only wrote finishes).
    pub(crate) asked: usize,
    /// The claimed actions in claim order, or why the claim failed (`None` when not asked).
    pub(crate) claimed: Option<Result<Vec<ClaimedAction>>>,
    /// The lease expiry stamped on the claimed actions.
    pub(crate) lease_until: DateTime<Utc>,
}

/// One round: writes `acks` (answering each) and claims up to `claim` actions, in one store
/// call when both are due.
pub(crate) async fn round(runner: Arc<Runner>, acks: Vec<AckRequest>, claim: usize) -> RoundEnd {
    let now = runner.clock.now();
    let lease_until = now + runner.lease_len();
    let store = &runner.store;
    let claimed = if claim == 0 {
        write(store, acks, now).await;
        None
    } else if acks.is_empty() {
        let started = Instant::now();
        let claimed = store
            .claim(&runner.claim_request(claim, now, lease_until))
            .await;
        metrics::histogram!(telemetry::CLAIM_DURATION, "op" => "claim")
            .record(started.elapsed().as_secs_f64());
        Some(claimed)
    } else {
        let items: Vec<(Lease, Finish)> =
            acks.iter().map(|r| (r.lease, r.outcome.clone())).collect();
        let req = runner.claim_request(claim, now, lease_until);
        let started = Instant::now();
        let both = store.finish_and_claim(&items, &req, now).await;
        metrics::histogram!(telemetry::CLAIM_DURATION, "op" => "finish_and_claim")
            .record(started.elapsed().as_secs_f64());
        match both {
            Ok(both) if both.finished.len() == acks.len() => {
                for (req, r) in acks.into_iter().zip(both.finished) {
                    let _ = req.reply.send(Ok(r));
                }
                Some(both.claimed)
            }
            other => {
                let e = match other {
                    Err(e) => e,
                    Ok(_) => Error::Config("finish_and_claim answered the wrong count".into()),
                };
                tracing::debug!(error = %e, size = acks.len(), "finish-and-claim round failed; finishing on their own");
                write(store, acks, now).await;
                Some(Err(e))
            }
        }
    };
    if let Some(Ok(c)) = &claimed {
        if !c.is_empty() {
            metrics::counter!(telemetry::CLAIMED).increment(c.len() as u64);
        }
    }
    RoundEnd {
        asked: claim,
        claimed,
        lease_until,
    }
}

/// Writes finishes with one [`crate::Store::finish_many`] call; if that fails, one by one, so
/// one bad row cannot fail its neighbours.
async fn write(store: &DynStore, acks: Vec<AckRequest>, now: DateTime<Utc>) {
    if acks.is_empty() {
        return;
    }
    let items: Vec<(Lease, Finish)> = acks.iter().map(|r| (r.lease, r.outcome.clone())).collect();
    match store.finish_many(&items, now).await {
        Ok(results) if results.len() == acks.len() => {
            for (req, r) in acks.into_iter().zip(results) {
                let _ = req.reply.send(Ok(r));
            }
        }
        other => {
            if let Err(e) = other {
                tracing::debug!(error = %e, size = acks.len(), "batched finish failed; writing one by one");
            }
            for req in acks {
                let r = store.finish(req.lease, &req.outcome, now).await;
                let _ = req.reply.send(r);
            }
        }
    }
}
