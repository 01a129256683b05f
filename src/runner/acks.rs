//! Batched acknowledgements: finishing writes from concurrent runs are collected and written
//! with one [`crate::Store::finish_many`] call (one transaction), each still guarded by its own
//! id + token + status. Batching is opportunistic — whatever is queued when the writer is free
//! goes in the next batch — so a lone finish waits for nobody. On shutdown the channel drains
//! before the writer stops, so no acknowledgement is dropped.

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::{DynStore, Finish, FinishResult, Lease};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Most acknowledgements written in one transaction.
const MAX_BATCH: usize = 256;

/// One queued finishing write and where its result goes.
pub(crate) struct AckRequest {
    pub(crate) lease: Lease,
    pub(crate) outcome: Finish,
    pub(crate) reply: oneshot::Sender<Result<FinishResult>>,
}

/// The sending side, cloned into every run.
pub(crate) type AckSender = mpsc::Sender<AckRequest>;

/// Sends one finish through the batcher and waits for its result.
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

/// Writes batches until every sender is gone and the queue is empty.
pub(crate) async fn writer(
    store: DynStore,
    clock: Arc<dyn Clock>,
    mut rx: mpsc::Receiver<AckRequest>,
) {
    let mut batch: Vec<AckRequest> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let items: Vec<(Lease, Finish)> =
            batch.iter().map(|r| (r.lease, r.outcome.clone())).collect();
        match store.finish_many(&items, clock.now()).await {
            Ok(results) if results.len() == batch.len() => {
                for (req, r) in batch.drain(..).zip(results) {
                    let _ = req.reply.send(Ok(r));
                }
            }
            other => {
                if let Err(e) = other {
                    tracing::debug!(error = %e, size = batch.len(), "batched finish failed; writing one by one");
                }
                // One by one, so one bad row cannot fail its neighbours.
                for req in batch.drain(..) {
                    let r = store.finish(req.lease, &req.outcome, clock.now()).await;
                    let _ = req.reply.send(r);
                }
            }
        }
    }
}
