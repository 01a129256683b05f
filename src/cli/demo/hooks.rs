//! The demo hooks `dockhand run` serves ([`register_demo_hooks`], [`DEMO_HOOKS`]); also used
//! by `tests/multi_process.rs`.

use crate::{HandlerError, RuntimeBuilder};
use serde_json::Value;
use std::time::Duration;

/// The hooks [`register_demo_hooks`] installs (served by `dockhand run`).
pub const DEMO_HOOKS: [&str; 4] = ["demo.noop", "demo.sleep", "demo.flaky", "demo.tick"];

/// Registers the demo handlers `dockhand run` serves: `demo.noop` (returns at once),
/// `demo.sleep` (sleeps `args.ms` milliseconds, default 5, at most 1000), `demo.flaky` (fails
/// with a retryable error while `ctx.attempt <= args.fail_times`, default 1, then succeeds) and
/// `demo.tick` (for schedules).
pub fn register_demo_hooks(builder: RuntimeBuilder) -> RuntimeBuilder {
    builder
        .handler("demo.noop", |_ctx| async { Ok::<(), HandlerError>(()) })
        .handler("demo.sleep", |ctx| async move {
            let ms = ctx.args.get("ms").and_then(Value::as_u64).unwrap_or(5);
            tokio::time::sleep(Duration::from_millis(ms.min(1_000))).await;
            Ok::<(), HandlerError>(())
        })
        .handler("demo.flaky", |ctx| async move {
            let fail_times = ctx
                .args
                .get("fail_times")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            if i64::from(ctx.attempt) <= fail_times {
                return Err(HandlerError::retry(format!(
                    "demo.flaky: simulated failure on attempt {} of {}",
                    ctx.attempt, ctx.max_attempts
                )));
            }
            Ok(())
        })
        .handler("demo.tick", |ctx| async move {
            tracing::info!(action_id = ctx.action_id, due = %ctx.scheduled_at, "demo.tick");
            Ok::<(), HandlerError>(())
        })
}
