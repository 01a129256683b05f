//! # dockhand
//!
//! A durable task-queue runtime for tokio programs: named actions with JSON args, run by
//! handlers you register, stored in SQLite (the embedded default), PostgreSQL (many runners
//! on many machines sharing one queue) or MySQL 8 / MariaDB 10.6+. Pipelines of steps run as
//! jobs ([`Jobs`], [`Pipeline`]) whose steps can claim source items and fan out into batches
//! of child jobs; every final status passes through one terminal bridge.
//!
//! Features: `ui` (the operator dashboard: `ui::router` and `dockhand ui`), `failpoints`
//! (named crash points for `dockhand chaos`).
//!
//! ```no_run
//! use dockhand::{ActionSpec, HandlerError, Runtime};
//! use serde_json::json;
//!
//! # async fn demo() -> dockhand::Result<()> {
//! let runtime = Runtime::builder("sqlite:dockhand.db")
//!     .handler("email.send", |ctx| async move {
//!         println!("sending to {}", ctx.args["to"]);
//!         Ok::<(), HandlerError>(())
//!     })
//!     .concurrency(8)
//!     .build()
//!     .await?;
//! let handle = runtime.start().await?;
//! runtime.queue().enqueue(ActionSpec::new("email.send", json!({"to": "a@example.com"}))).await?;
//! handle.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Module map: [`action`] (what is enqueued), [`schedule`] (recurring definitions), [`state`]
//! (the only transition rules), [`store`] (all SQL, one module per backend), [`runner`] (the
//! worker pool), [`maintenance`] (reaper, scheduler, retention), [`runtime`] (builder and
//! handle), [`queue`] (enqueue and query API), [`telemetry`] (metric and span names),
//! [`prometheus`] (the metrics in Prometheus format, the database gauges), and,
//! with the `ui` feature, `ui` (the operator dashboard: an axum router of server-rendered
//! pages, also served by `dockhand ui`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod action;
pub mod backoff;
pub mod batch;
// The doc comments of clap arguments are --help text: `<backend>-<seed>` there is a
// placeholder, not an HTML tag.
#[allow(rustdoc::invalid_html_tags)]
pub mod chaos;
pub mod claims;
#[allow(rustdoc::invalid_html_tags)]
pub mod cli;
pub mod clock;
mod cron_dow;
pub mod error;
pub mod failpoint;
pub mod handler;
pub mod jobs;
pub mod limits;
pub mod maintenance;
pub mod prometheus;
pub mod queue;
pub mod runner;
pub mod runtime;
pub mod schedule;
pub mod search;
pub mod state;
pub mod store;
pub mod telemetry;
#[cfg(feature = "ui")]
pub mod ui;

pub use action::{ActionFilter, ActionOrder, ActionQuery, ActionSpec};
pub use backoff::Backoff;
pub use claims::{CompletionConfig, Descriptor, Identity};
pub use clock::{Clock, DatabaseClock, OffsetClock, SystemClock, TestClock};
pub use error::{Error, Result};
pub use handler::{ActionContext, HandlerError, HandlerResult};
pub use jobs::api::{Jobs, StartOptions};
pub use jobs::pipeline::{Packet, Pipeline, StepContext, StepOutput};
pub use limits::{GroupLimit, RateLimit};
pub use queue::Queue;
pub use runtime::{Runtime, RuntimeBuilder, RuntimeHandle};
pub use schedule::{Recurrence, ScheduleSpec};
pub use state::ActionStatus;
pub use state::JobStatus;
pub use store::{connect, DynStore, Store};

/// The README's code blocks, compiled as doctests so the README stays true to the code.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
