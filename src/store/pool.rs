//! How the backends' connection pools are set up: when a pooled connection is pinged, and
//! when it is closed and replaced, checked on the acquire path instead of by sqlx's reaper.
//!
//! sqlx 0.8's pool spawns a maintenance task whenever `idle_timeout` or `max_lifetime` is set
//! (both are by default). That task walks `0..num_idle()` without yielding, and a race between
//! a connection's release and a concurrent acquire can wrap `num_idle` below zero to
//! `usize::MAX` (launchbadge/sqlx#3645, fixed upstream after 0.8.6 by #4289): the task then
//! spins on one runtime worker for good. Seen here twice (a conformance run stuck at 100 % CPU
//! in `spawn_maintenance_tasks`, its watchdog starved because the spinning worker was the one
//! driving the timers). Every pool dockhand opens therefore sets both to `None` (no reaper
//! task at all) and applies the same limits in `before_acquire`: a connection past
//! [`MAX_LIFETIME`] or idle past [`IDLE_TIMEOUT`] is closed and replaced when it is next taken.

use sqlx::pool::PoolConnectionMetadata;
use sqlx::Connection;
use std::time::Duration;

/// A pooled connection is replaced once this old (sqlx's own default): a server-side session
/// does not grow without bound, and a moved server address is picked up.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// A pooled connection idle this long is replaced rather than reused (sqlx's own default): a
/// firewall or proxy may have dropped it meanwhile.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// PostgreSQL and MySQL pools ping a pooled connection before handing it out only when it
/// sat idle at least this long: sqlx's default pings on every acquire, a full round trip per
/// store call on a busy pool (and the hot path's calls are one statement each). A connection
/// that broke while busy fails its next statement instead, which callers treat as transient.
pub(crate) const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// Whether a pooled connection `age` old and idle for `idle_for` may be handed out as it is
/// (`false`: the pool closes it and opens another): not past [`MAX_LIFETIME`], not idle past
/// [`IDLE_TIMEOUT`].
pub(crate) fn fresh_enough(age: Duration, idle_for: Duration) -> bool {
    age < MAX_LIFETIME && idle_for < IDLE_TIMEOUT
}

/// The `before_acquire` check of the PostgreSQL and MySQL pools: a stale connection is
/// replaced ([`fresh_enough`]), one idle past [`IDLE_PING_AFTER`] is pinged first.
pub(crate) async fn check_before_acquire<C: Connection>(
    conn: &mut C,
    meta: &PoolConnectionMetadata,
) -> Result<bool, sqlx::Error> {
    if !fresh_enough(meta.age, meta.idle_for) {
        return Ok(false);
    }
    if meta.idle_for >= IDLE_PING_AFTER {
        conn.ping().await?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_past_its_lifetime_or_idle_too_long_is_replaced() {
        let s = Duration::from_secs;
        assert!(fresh_enough(s(0), s(0)));
        assert!(fresh_enough(MAX_LIFETIME - s(1), IDLE_TIMEOUT - s(1)));
        assert!(!fresh_enough(MAX_LIFETIME, s(0)));
        assert!(!fresh_enough(s(5), IDLE_TIMEOUT));
    }

    /// sqlx#3645: the PostgreSQL and MySQL stores' pools run no reaper task (neither an idle
    /// timeout nor a lifetime set on the pool). Each backend is skipped, with a line, unless
    /// its test URL is set.
    #[tokio::test]
    async fn server_pools_run_no_reaper_task() {
        /// Opens `$store` on the URL in `$env` (or prints a skip line) and checks its pool.
        macro_rules! check {
            ($env:literal, $store:ty) => {
                match std::env::var($env) {
                    Ok(url) if !url.is_empty() => {
                        let store = <$store>::connect(&url).await.expect($env);
                        let o = store.pool().options();
                        assert_eq!((o.get_idle_timeout(), o.get_max_lifetime()), (None, None));
                        crate::store::Store::close(&store).await;
                    }
                    _ => println!("SKIPPED pool check: set {} to run it", $env),
                }
            };
        }
        check!(
            "DOCKHAND_TEST_POSTGRES_URL",
            crate::store::postgres::PgStore
        );
        check!("DOCKHAND_TEST_MYSQL_URL", crate::store::mysql::MySqlStore);
    }
}
