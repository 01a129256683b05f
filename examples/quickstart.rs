//! Embeds a worker pool on a temporary SQLite database: registers two handlers, enqueues an
//! immediate, a delayed and a flaky action, waits until all are final, and shuts down.
//!
//! Run with `cargo run --example quickstart`.

use dockhand::{ActionSpec, Backoff, HandlerError, Runtime};
use serde_json::json;
use std::time::Duration;

#[tokio::main]
async fn main() -> dockhand::Result<()> {
    let path = std::env::temp_dir().join(format!("dockhand-quickstart-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let runtime = Runtime::builder(url)
        .handler("greet", |ctx| async move {
            println!("hello, {} (action {})", ctx.args["name"], ctx.action_id);
            Ok(())
        })
        .handler("flaky", |ctx| async move {
            if ctx.attempt < 2 {
                Err(HandlerError::retry("first attempt always fails"))
            } else {
                println!("flaky succeeded on attempt {}", ctx.attempt);
                Ok(())
            }
        })
        .backoff(Backoff::fixed_exponential(
            Duration::from_millis(100),
            2.0,
            Duration::from_secs(1),
        ))
        .poll_interval(Duration::from_millis(50))
        .build()
        .await?;
    let handle = runtime.start().await?;
    let queue = runtime.queue();
    let ids = vec![
        queue
            .enqueue(ActionSpec::new("greet", json!({"name": "world"})))
            .await?,
        queue
            .enqueue(
                ActionSpec::new("greet", json!({"name": "later"}))
                    .after(chrono::Duration::milliseconds(300)),
            )
            .await?,
        queue.enqueue(ActionSpec::new("flaky", json!({}))).await?,
    ];
    for _ in 0..200 {
        let mut all_final = true;
        for id in &ids {
            all_final &= queue.get(*id).await?.status.is_final();
        }
        if all_final {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ids {
        let a = queue.get(*id).await?;
        println!(
            "action {} ({}): {} after {} attempt(s)",
            a.id, a.hook, a.status, a.attempt
        );
    }
    handle.shutdown().await;
    runtime.store().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}
