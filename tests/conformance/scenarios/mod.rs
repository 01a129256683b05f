//! Scenario bodies, each an `async fn(TestDb)` run once per backend by `conformance!`.

mod batch_guards;
mod batch_refan;
mod batch_regressions;
mod batch_rerun;
mod batch_stop;
mod batches;
mod claim_handlers;
mod claim_many;
mod claim_races;
mod claim_upkeep;
mod claims;
mod clock;
mod faults;
mod group_limits;
mod grouped;
mod in_chunk;
mod job_owned;
mod jobs;
mod listeners;
mod log_entries;
mod metrics;
mod operator;
mod operator_args;
mod packets;
mod prefetch;
mod queue_api;
mod recovery;
mod retention;
mod routing;
mod runner;
mod scheduled_pipelines;
mod schedules;
mod stale_output;
mod step_failures;
mod store_api;
mod sweep;
mod sweep_checks;
mod sweep_workload;
mod views;

pub use batch_guards::*;
pub use batch_refan::*;
pub use batch_regressions::*;
pub use batch_rerun::*;
pub use batch_stop::*;
pub use batches::*;
pub use claim_handlers::*;
pub use claim_many::*;
pub use claim_races::*;
pub use claim_upkeep::*;
pub use claims::*;
pub use clock::*;
pub use faults::*;
pub use group_limits::*;
pub use grouped::*;
pub use in_chunk::*;
pub use job_owned::*;
pub use jobs::*;
pub use listeners::*;
pub use log_entries::*;
pub use metrics::*;
pub use operator::*;
pub use operator_args::*;
pub use packets::*;
pub use prefetch::*;
pub use queue_api::*;
pub use recovery::*;
pub use retention::*;
pub use routing::*;
pub use runner::*;
pub use scheduled_pipelines::*;
pub use schedules::*;
pub use stale_output::*;
pub use step_failures::*;
pub use store_api::*;
pub use sweep::sweep_fault_points;
pub use views::*;

use chrono::{DateTime, Utc};
use dockhand::{ActionContext, HandlerError};
use std::sync::{Arc, Mutex};

/// One handler run as a test saw it.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: i64,
    pub hook: String,
    pub at: DateTime<Utc>,
}

/// Shared record of handler runs.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<Run>>>);

impl Recorder {
    pub fn record(&self, ctx: &ActionContext) {
        self.0.lock().unwrap().push(Run {
            id: ctx.action_id,
            hook: ctx.hook.clone(),
            at: ctx.queue.clock().now(),
        });
    }
    pub fn runs(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }
    pub fn of(&self, hook: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.hook == hook).collect()
    }
    /// A handler that records and succeeds.
    pub fn ok_handler(
        &self,
    ) -> impl Fn(ActionContext) -> std::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static
    {
        let me = self.clone();
        move |ctx| {
            me.record(&ctx);
            std::future::ready(Ok(()))
        }
    }
}
