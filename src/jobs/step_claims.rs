//! The job engine's item claims for a running step (J7): one item or many, as that run of the
//! step (fenced by its lease, recorded on the claim), with the reprocess decision for an item
//! processed already.

use super::engine::{Engine, ReprocessContext};
use super::pipeline::StepContext;
use crate::claims::{ClaimItemRequest, ClaimOutcome, CompletionConfig, Descriptor, Identity};
use crate::error::Result;

impl Engine {
    /// Claims `identity` for the step's job, as this run of the step (fenced by its lease,
    /// recorded on the claim) and with the step's TTL; when it was processed already, asks the
    /// reprocess callback (with the executing step's id) whether to take it again. `None` also
    /// when the job is final or moved past this step: the store checks that under a lock on
    /// the job row in the claim's own transaction, so no claim outlives its job.
    pub(crate) async fn claim_for_step(
        &self,
        ctx: &StepContext,
        identity: Identity,
        completion: CompletionConfig,
    ) -> Result<Option<Descriptor>> {
        let mut req = ClaimItemRequest {
            identity,
            job_id: Some(ctx.job_id),
            ttl: ctx.claim_ttl,
            completion,
            reprocess: false,
            run: Some(ctx.run),
        };
        loop {
            match self.store.claim_item(&req, self.clock.now()).await? {
                ClaimOutcome::Claimed(d) => return Ok(Some(d)),
                ClaimOutcome::HeldByOther => return Ok(None),
                ClaimOutcome::JobNotLive {
                    job_id,
                    status,
                    step_index,
                } => {
                    tracing::info!(job_id, %status, step_index, run_step = ctx.step_index, item = %req.identity.item_id, "claim refused: the job is final or moved on");
                    return Ok(None);
                }
                ClaimOutcome::AlreadyProcessed if req.reprocess => return Ok(None),
                ClaimOutcome::AlreadyProcessed => {
                    if !self.takes_again(ctx, &req.identity) {
                        return Ok(None);
                    }
                    req.reprocess = true;
                }
            }
        }
    }

    /// [`Self::claim_for_step`] for many identities, in one store call
    /// ([`crate::Store::claim_items`]: one transaction, the job and run checked once); the
    /// items processed already are put to the reprocess callback, and those it takes again
    /// claimed in a second call. One result per identity, in order.
    pub(crate) async fn claim_many_for_step(
        &self,
        ctx: &StepContext,
        identities: Vec<Identity>,
        completion: CompletionConfig,
    ) -> Result<Vec<Option<Descriptor>>> {
        let reqs: Vec<ClaimItemRequest> = identities
            .into_iter()
            .map(|identity| ClaimItemRequest {
                identity,
                job_id: Some(ctx.job_id),
                ttl: ctx.claim_ttl,
                completion: completion.clone(),
                reprocess: false,
                run: Some(ctx.run),
            })
            .collect();
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.store.claim_items(&reqs, self.clock.now()).await?;
        let mut out = vec![None; reqs.len()];
        let mut again = Vec::new();
        let mut refused = None;
        for (at, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                ClaimOutcome::Claimed(d) => out[at] = Some(d),
                ClaimOutcome::HeldByOther => {}
                ClaimOutcome::JobNotLive { .. } => refused = Some(outcome),
                ClaimOutcome::AlreadyProcessed => {
                    if self.takes_again(ctx, &reqs[at].identity) {
                        again.push(at);
                    }
                }
            }
        }
        if !again.is_empty() {
            let retake: Vec<ClaimItemRequest> = again
                .iter()
                .map(|&at| ClaimItemRequest {
                    reprocess: true,
                    ..reqs[at].clone()
                })
                .collect();
            let outcomes = self.store.claim_items(&retake, self.clock.now()).await?;
            for (&at, outcome) in again.iter().zip(outcomes) {
                match outcome {
                    ClaimOutcome::Claimed(d) => out[at] = Some(d),
                    ClaimOutcome::JobNotLive { .. } => refused = Some(outcome),
                    _ => {}
                }
            }
        }
        if let Some(ClaimOutcome::JobNotLive {
            job_id,
            status,
            step_index,
        }) = refused
        {
            tracing::info!(job_id, %status, step_index, run_step = ctx.step_index, items = reqs.len(), "claims refused: the job is final or moved on");
        }
        Ok(out)
    }

    /// The reprocess callback's answer for an item the step's job finds processed already
    /// (J7): take it again? No callback: no.
    fn takes_again(&self, ctx: &StepContext, identity: &Identity) -> bool {
        self.reprocess.as_ref().is_some_and(|f| {
            f(&ReprocessContext {
                step_id: ctx.step_id(),
                scope: identity.scope.clone(),
                source_type: identity.source_type.clone(),
                item_id: identity.item_id.clone(),
                job_id: ctx.job_id,
            })
        })
    }
}
