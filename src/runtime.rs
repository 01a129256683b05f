//! The runtime: a builder that ties a store, handlers, a clock and settings together, and a
//! handle that stops the worker pool gracefully.

use crate::backoff::Backoff;
use crate::batch::{CHUNK_HOOK, FINALIZE_HOOK};
use crate::claims::{CompletionHandler, CompletionRegistry};
use crate::clock::{Clock, DatabaseClock, SystemClock};
use crate::error::Result;
use crate::handler::{ActionContext, HandlerResult, Registry};
use crate::jobs::api::Jobs;
use crate::jobs::engine::{Engine, LifecycleHook, LifecycleHooks, ReprocessContext, ReprocessFn};
use crate::jobs::pipeline::{Pipeline, PipelineRegistry};
use crate::jobs::{JobEvent, StepAction, FINISH_HOOK, SCHEDULED_START_HOOK, STEP_HOOK};
use crate::maintenance::{Maintenance, MaintenanceConfig, MaintenanceReport};
use crate::queue::Queue;
use crate::runner::{Runner, RunnerConfig};
use crate::store::DynStore;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

enum StoreSource {
    Url(String),
    Store(DynStore),
}

/// Builds a [`Runtime`]. Start with [`Runtime::builder`] (a database URL) or
/// [`Runtime::with_store`] (an opened store).
pub struct RuntimeBuilder {
    source: StoreSource,
    registry: Registry,
    runner: RunnerConfig,
    maintenance: MaintenanceConfig,
    clock: ClockChoice,
    migrate: bool,
    pipelines: PipelineRegistry,
    completions: CompletionRegistry,
    lifecycle: LifecycleHooks,
    reprocess: Option<ReprocessFn>,
    invalid: Option<crate::Error>,
}

/// Where a runtime's time comes from.
enum ClockChoice {
    /// A [`DatabaseClock`] over this base clock (the default, over the system clock).
    Database(Arc<dyn Clock>),
    /// Exactly this clock (tests).
    Fixed(Arc<dyn Clock>),
}

fn lifecycle_hook<F, Fut>(f: F) -> LifecycleHook
where
    F: Fn(JobEvent) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |e| Box::pin(f(e)))
}

impl RuntimeBuilder {
    /// Registers a pipeline (J1). A second pipeline with the same name replaces the first; an
    /// invalid one (no steps, bad names) makes `build` fail with an error naming it.
    pub fn pipeline(mut self, pipeline: Pipeline) -> Self {
        if let Err(e) = pipeline.validate() {
            self.invalid.get_or_insert(e);
        }
        self.pipelines
            .pipelines
            .insert(pipeline.name.clone(), Arc::new(pipeline));
        self
    }

    /// Registers a completion handler under `id` (C3); the tracked-items ledger
    /// (`dockhand.tracked_items`) is registered already.
    pub fn completion_handler(
        mut self,
        id: impl Into<String>,
        handler: Arc<dyn CompletionHandler>,
    ) -> Self {
        self.completions.insert(id, handler);
        self
    }

    /// Called after a job finishes `completed`, `completed_no_items` or `skipped` (J5).
    pub fn on_job_completed<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(JobEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.lifecycle.on_completed.push(lifecycle_hook(f));
        self
    }

    /// Called after a job finishes `failed` (J5). Not for `cancelled`: a cancel is an
    /// operator's decision, not a failure (it reaches [`RuntimeBuilder::on_job_finished`] with
    /// its status; see the README's hook table).
    pub fn on_job_failed<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(JobEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.lifecycle.on_failed.push(lifecycle_hook(f));
        self
    }

    /// Called after a job reaches any final status (J5).
    pub fn on_job_finished<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(JobEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.lifecycle.on_finished.push(lifecycle_hook(f));
        self
    }

    /// Decides whether a step may take an already processed item again (J7). Without one,
    /// processed items are never reprocessed.
    pub fn reprocess<F>(mut self, f: F) -> Self
    where
        F: Fn(&ReprocessContext) -> bool + Send + Sync + 'static,
    {
        self.reprocess = Some(Arc::new(f));
        self
    }

    /// Registers the handler for `hook` (one handler per hook; a later one replaces it).
    pub fn handler<F, Fut>(mut self, hook: impl Into<String>, f: F) -> Self
    where
        F: Fn(ActionContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.registry.insert(hook, f);
        self
    }

    /// Actions run at once. Default 10.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.runner.concurrency = n.max(1);
        self
    }

    /// Actions claimed ahead of free slots into the runner's buffer (leased, heartbeated,
    /// started in claim order, given back at shutdown); 0 claims only for free slots. Default
    /// [`crate::runner::DEFAULT_PREFETCH`]. See [`RunnerConfig::prefetch`].
    pub fn prefetch(mut self, n: usize) -> Self {
        self.runner.prefetch = n;
        self
    }

    /// Idle poll interval. Default 1 s.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.runner.poll_interval = d;
        self
    }

    /// Lease length and heartbeat interval (heartbeat should be well under the lease).
    pub fn lease(mut self, lease: Duration, heartbeat: Duration) -> Self {
        self.runner.lease = lease;
        self.runner.heartbeat_interval = heartbeat;
        self
    }

    /// How long shutdown waits for in-flight handlers. Default 30 s.
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.runner.shutdown_timeout = d;
        self
    }

    /// Timeout for actions without their own. Default 5 min.
    pub fn default_timeout(mut self, d: Option<Duration>) -> Self {
        self.runner.default_timeout = d;
        self
    }

    /// Retry delays.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.runner.backoff = b;
        self
    }

    /// This runner's owner id (default `host:pid:random`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.runner.owner = owner.into();
        self
    }

    /// Claim only actions whose hook has a handler in this runtime (several services sharing
    /// one queue). Default false: an action nobody handles fails with "unknown hook". Either
    /// way the job engine's actions are claimed only for the pipelines this runtime has (see
    /// [`crate::store::Routing`]).
    pub fn only_registered_hooks(mut self, yes: bool) -> Self {
        self.runner.only_registered_hooks = yes;
        self
    }

    /// Maintenance settings.
    pub fn maintenance(mut self, c: MaintenanceConfig) -> Self {
        self.maintenance = c;
        self
    }

    /// The clock every "now" comes from (tests use [`crate::TestClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = ClockChoice::Fixed(clock);
        self
    }

    /// Uses the database's clock, read through `base` corrected by the measured offset (see
    /// [`DatabaseClock`]). The default, over the system clock; a different `base` simulates a
    /// host with a skewed clock.
    pub fn database_clock(mut self, base: Arc<dyn Clock>) -> Self {
        self.clock = ClockChoice::Database(base);
        self
    }

    /// Whether `build` applies migrations. Default true.
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// Opens the store (if given a URL), migrates unless disabled, and returns the runtime.
    pub async fn build(mut self) -> Result<Runtime> {
        if let Some(e) = self.invalid.take() {
            return Err(e);
        }
        let store = match self.source {
            StoreSource::Url(url) => crate::store::connect(&url).await?,
            StoreSource::Store(s) => s,
        };
        if self.migrate {
            store.migrate().await?;
        }
        let (clock, db_clock): (Arc<dyn Clock>, _) = match self.clock {
            ClockChoice::Fixed(c) => (c, None),
            ClockChoice::Database(base) => {
                let c = Arc::new(DatabaseClock::new(base));
                match c.sync(store.as_ref()).await {
                    Ok(offset) if offset.num_milliseconds().abs() >= 1000 => tracing::warn!(
                        offset_ms = offset.num_milliseconds(),
                        "this host's clock differs from the database's; using the database's"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read the database clock; using the local clock until the next sync")
                    }
                }
                (Arc::clone(&c) as Arc<dyn Clock>, Some(c))
            }
        };
        let queue = Queue::with_clock(Arc::clone(&store), Arc::clone(&clock));
        let listens = self.lifecycle.any();
        let engine = Arc::new(Engine {
            store: Arc::clone(&store),
            clock: Arc::clone(&clock),
            pipelines: self.pipelines,
            completions: self.completions,
            hooks: self.lifecycle,
            reprocess: self.reprocess,
            delivers_events: true,
            listeners: crate::jobs::listeners::Listeners::new(listens),
            delivering: tokio::sync::Mutex::new(()),
            grouped: Default::default(),
            packet_cache: Default::default(),
        });
        if !engine.pipelines.pipelines.is_empty() {
            let e = Arc::clone(&engine);
            self.registry
                .insert(STEP_HOOK, move |ctx| Arc::clone(&e).run_step(ctx));
            let e = Arc::clone(&engine);
            self.registry
                .insert(CHUNK_HOOK, move |ctx| Arc::clone(&e).run_chunk(ctx));
            let e = Arc::clone(&engine);
            self.registry
                .insert(FINALIZE_HOOK, move |ctx| Arc::clone(&e).run_finalize(ctx));
            let e = Arc::clone(&engine);
            self.registry
                .insert(FINISH_HOOK, move |ctx| Arc::clone(&e).run_job_finish(ctx));
            let jobs = crate::jobs::api::Jobs::new(Arc::clone(&engine));
            self.registry.insert(SCHEDULED_START_HOOK, move |ctx| {
                crate::jobs::scheduled::run_scheduled_start(jobs.clone(), ctx)
            });
        }
        let maintenance = Arc::new(
            Maintenance::new(
                Arc::clone(&store),
                Arc::clone(&clock),
                self.maintenance,
                self.runner.owner.clone(),
            )
            .with_outbox(Arc::clone(&engine)),
        );
        let claim_hooks = self
            .runner
            .only_registered_hooks
            .then(|| self.registry.hook_list());
        maintenance.refresh_listeners().await;
        let routing = engine_routing(&engine.pipelines);
        let runner = Arc::new(Runner {
            claim_hooks,
            routing,
            store: Arc::clone(&store),
            clock,
            registry: Arc::new(self.registry),
            facts: Runner::facts_of(&self.runner),
            config: self.runner,
            queue: queue.clone(),
        });
        Ok(Runtime {
            store,
            queue,
            runner,
            maintenance,
            engine,
            db_clock,
        })
    }
}

/// How a runtime routes the job engine's actions (see [`crate::store::Routing`]): step,
/// finish, scheduled-start, chunk and finalize actions only of the pipelines it has (group `pipeline:<name>`;
/// a batch's chunk and finalize actions carry its parent's pipeline group). Chunk and finalize
/// actions enqueued before they were routed carry the legacy group `dockhand.batch`: any
/// runtime that has a pipeline still takes those. So runtimes with different pipeline sets
/// share one database without failing or running each other's jobs, and a runtime without
/// pipelines leaves the job engine's actions alone.
fn engine_routing(pipelines: &PipelineRegistry) -> (Vec<String>, Vec<String>) {
    let hooks = [
        STEP_HOOK,
        FINISH_HOOK,
        SCHEDULED_START_HOOK,
        CHUNK_HOOK,
        FINALIZE_HOOK,
    ]
    .map(String::from)
    .to_vec();
    let mut groups: Vec<String> = pipelines
        .pipelines
        .keys()
        .map(|p| StepAction::group_for(p))
        .collect();
    if !groups.is_empty() {
        groups.push(crate::batch::GROUP.to_string());
    }
    groups.sort();
    (hooks, groups)
}

/// A configured runtime: enqueue through [`Runtime::queue`], run workers with
/// [`Runtime::start`], or drive it step by step in tests with [`Runtime::run_due_once`].
pub struct Runtime {
    store: DynStore,
    queue: Queue,
    runner: Arc<Runner>,
    maintenance: Arc<Maintenance>,
    engine: Arc<Engine>,
    db_clock: Option<Arc<DatabaseClock>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("runner", &self.runner)
            .finish()
    }
}

impl Runtime {
    /// A builder over the database at `url` (`sqlite:…`, `postgres://…` or `mysql://…`).
    pub fn builder(url: impl Into<String>) -> RuntimeBuilder {
        Self::builder_from(StoreSource::Url(url.into()))
    }

    /// A builder over an opened store.
    pub fn with_store(store: DynStore) -> RuntimeBuilder {
        Self::builder_from(StoreSource::Store(store))
    }

    fn builder_from(source: StoreSource) -> RuntimeBuilder {
        RuntimeBuilder {
            source,
            registry: Registry::default(),
            runner: RunnerConfig::default(),
            maintenance: MaintenanceConfig::default(),
            clock: ClockChoice::Database(Arc::new(SystemClock)),
            migrate: true,
            pipelines: PipelineRegistry::default(),
            completions: CompletionRegistry::with_builtins(),
            lifecycle: LifecycleHooks::default(),
            reprocess: None,
            invalid: None,
        }
    }

    /// The job and item-claim API.
    pub fn jobs(&self) -> Jobs {
        self.engine.jobs()
    }

    /// The queue API.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The store.
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// The hooks that have handlers.
    pub fn hooks(&self) -> Vec<String> {
        self.runner.registry.hook_list()
    }

    /// Starts the worker pool, the maintenance loop and (on PostgreSQL) the LISTEN wake-up.
    pub async fn start(&self) -> Result<RuntimeHandle> {
        if let Err(e) = self.store.listen().await {
            tracing::warn!(error = %e, "cross-process wake-ups unavailable; polling only");
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(Arc::clone(&self.runner).run(stop_rx.clone()));
        let clock_sync = self
            .db_clock
            .clone()
            .map(|c| tokio::spawn(sync_clock(c, Arc::clone(&self.store), stop_rx.clone())));
        let maintenance = tokio::spawn(Arc::clone(&self.maintenance).run(stop_rx));
        Ok(RuntimeHandle {
            stop: stop_tx,
            runner,
            maintenance,
            clock_sync,
        })
    }

    /// Testing helper: claims what is due now and runs it inline; returns how many ran.
    pub async fn run_due_once(&self) -> Result<usize> {
        self.runner.run_due_once().await
    }

    /// Testing helper: runs maintenance (reaper, scheduler, retention) once, now, without
    /// cluster leases.
    pub async fn run_maintenance_once(&self) -> Result<MaintenanceReport> {
        self.maintenance.run_all_unguarded().await
    }

    /// Testing helper: alternates maintenance and runs until nothing is due at the clock's
    /// current time. Returns how many runs happened. Bounded: stops after `max_runs`.
    pub async fn drain(&self, max_runs: usize) -> Result<usize> {
        let mut total = 0;
        loop {
            self.run_maintenance_once().await?;
            let n = self.run_due_once().await?;
            total += n;
            if n == 0 || total >= max_runs {
                return Ok(total);
            }
        }
    }

    /// The maintenance tasks.
    pub fn maintenance(&self) -> &Arc<Maintenance> {
        &self.maintenance
    }

    /// The database clock in use, unless the builder was given a fixed clock.
    pub fn database_clock(&self) -> Option<&Arc<DatabaseClock>> {
        self.db_clock.as_ref()
    }
}

/// Re-measures the database clock's offset every [`DatabaseClock::SYNC_EVERY`] until stopped.
async fn sync_clock(clock: Arc<DatabaseClock>, store: DynStore, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(DatabaseClock::SYNC_EVERY) => {}
        }
        if let Err(e) = clock.sync(store.as_ref()).await {
            tracing::debug!(error = %e, "database clock sync failed; keeping the last offset");
        }
    }
}

/// A running worker pool; [`RuntimeHandle::shutdown`] stops it gracefully (Q12).
#[derive(Debug)]
pub struct RuntimeHandle {
    stop: watch::Sender<bool>,
    runner: JoinHandle<()>,
    maintenance: JoinHandle<()>,
    clock_sync: Option<JoinHandle<()>>,
}

impl RuntimeHandle {
    /// Stops claiming, lets in-flight handlers finish up to the shutdown timeout, gives the
    /// remaining leases back (pending again, attempt uncounted), and waits for all of it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.runner.await {
            tracing::error!(error = %e, "runner task ended abnormally");
        }
        if let Err(e) = self.maintenance.await {
            tracing::error!(error = %e, "maintenance task ended abnormally");
        }
        if let Some(sync) = self.clock_sync {
            let _ = sync.await;
        }
    }

    /// Stops everything at once without giving anything back, as a killed process would:
    /// handlers are dropped mid-run and the leases of running and buffered actions stay until
    /// they expire, when the reaper puts them back (counting the attempt). For crash tests;
    /// stop a pool with [`RuntimeHandle::shutdown`].
    pub async fn abort(self) {
        self.runner.abort();
        self.maintenance.abort();
        let _ = self.runner.await;
        let _ = self.maintenance.await;
        if let Some(sync) = self.clock_sync {
            sync.abort();
            let _ = sync.await;
        }
    }
}
