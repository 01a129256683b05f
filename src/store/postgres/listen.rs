//! PostgreSQL: the cross-process wake-up channel (LISTEN/NOTIFY).
//!
//! Owns the channel name (`dockhand_wakeup_<schema>`, so stores in different schemas never wake
//! each other), the `pg_notify` an enqueue sends, and the background task that LISTENs and
//! forwards every notification into the store's in-process [`Wakeup`].

use crate::error::{Error, Result};
use crate::store::Wakeup;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::PgConnection;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Pause before reopening a failed LISTEN connection.
const RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// Longest identifier PostgreSQL keeps (NAMEDATALEN - 1).
const MAX_IDENT: usize = 63;

/// The wake-up channel of a schema: `dockhand_wakeup_<schema>`, sanitised to `[a-z0-9_]` and
/// cut to 63 characters.
pub(super) fn channel_for(schema: &str) -> String {
    let clean: String = schema
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut channel = format!("dockhand_wakeup_{clean}");
    channel.truncate(MAX_IDENT);
    channel
}

/// The schema a connection's options select: the first entry of a `search_path` startup option
/// (`-c search_path=…`, `-csearch_path=…` or `--search_path=…`; the last one given wins), or
/// `public`.
pub(super) fn schema_from_options(options: &PgConnectOptions) -> String {
    let mut schema = None;
    let mut tokens = options.get_options().unwrap_or("").split_whitespace();
    while let Some(tok) = tokens.next() {
        let setting = if tok == "-c" {
            tokens.next()
        } else if let Some(rest) = tok.strip_prefix("--") {
            Some(rest)
        } else {
            tok.strip_prefix("-c")
        };
        let Some((key, value)) = setting.and_then(|s| s.split_once('=')) else {
            continue;
        };
        if key.replace('-', "_").eq_ignore_ascii_case("search_path") {
            schema = value
                .split(',')
                .map(|s| s.trim().trim_matches('"'))
                .find(|s| !s.is_empty() && !s.starts_with('$'))
                .map(str::to_string);
        }
    }
    schema.unwrap_or_else(|| "public".to_string())
}

/// Sends the wake-up notification on an open connection (delivered when its transaction
/// commits). Without a known channel, the one of the connection's current schema is used.
pub(super) async fn notify(conn: &mut PgConnection, channel: Option<&str>) -> Result<()> {
    let channel = match channel {
        Some(c) => c.to_string(),
        None => {
            let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()::text")
                .fetch_one(&mut *conn)
                .await
                .map_err(Error::db("notify"))?;
            channel_for(schema.as_deref().unwrap_or("public"))
        }
    };
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(channel)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("notify"))?;
    Ok(())
}

/// Opens a dedicated one-connection LISTEN on `channel`.
async fn open(options: &PgConnectOptions, channel: &str) -> Result<PgListener, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(options.clone())
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

/// LISTENs on `channel` (the first LISTEN is done before returning, so no later enqueue is
/// missed) and spawns the task that forwards each notification to `wake`, reopening the
/// connection after a delay on any error.
pub(super) async fn start(
    options: &PgConnectOptions,
    channel: &str,
    wake: Arc<Wakeup>,
) -> Result<JoinHandle<()>> {
    let first = open(options, channel).await.map_err(Error::db("listen"))?;
    let options = options.clone();
    let channel = channel.to_string();
    Ok(tokio::spawn(async move {
        let mut listener = first;
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) => wake.notify(),
                // The connection dropped and was re-established: anything sent in between is
                // lost, so make runners look.
                Ok(None) => wake.notify(),
                Err(e) => {
                    tracing::warn!(channel = %channel, error = %e, "LISTEN connection failed; reconnecting");
                    drop(listener);
                    listener = loop {
                        tokio::time::sleep(RECONNECT_DELAY).await;
                        match open(&options, &channel).await {
                            Ok(l) => break l,
                            Err(e) => {
                                tracing::warn!(channel = %channel, error = %e, "LISTEN reconnect failed")
                            }
                        }
                    };
                    wake.notify();
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn schema(url: &str) -> String {
        schema_from_options(&PgConnectOptions::from_str(url).expect("url"))
    }

    #[test]
    fn channel_follows_search_path() {
        assert_eq!(schema("postgres://h/db"), "public");
        assert_eq!(
            schema("postgres://h/db?options=-c%20search_path%3Ddh_1"),
            "dh_1"
        );
        assert_eq!(schema("postgres://h/db?options=-csearch_path%3Da,b"), "a");
        assert_eq!(
            schema("postgres://h/db?options=--search_path%3D%22%24user%22,x"),
            "x"
        );
        let opts = PgConnectOptions::from_str("postgres://h/db")
            .expect("url")
            .options([("geqo", "off"), ("search_path", "t_9")]);
        assert_eq!(schema_from_options(&opts), "t_9");
        assert_eq!(channel_for("My-Schema"), "dockhand_wakeup_my_schema");
        assert_eq!(channel_for(&"x".repeat(100)).len(), 63);
    }
}
