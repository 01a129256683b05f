//! Property and model-based tests (RELIABILITY.md §5, issue 7).
//!
//! cargo-fuzz needs a nightly toolchain, so the fuzz targets of §5 are proptest properties here,
//! with generous case counts kept fast in debug builds. Every runner uses a fixed seed (see
//! [`support::runner`]), so a run is reproducible and no regression files are written.
//!
//! - [`cron`]: cron expressions and IANA timezones, including instants near DST changes.
//! - [`args`]: args JSON round-trips through every backend; NUL, depth and size limits.
//! - [`urls`]: database URL parsing never panics and never shows a password.
//! - [`backoff`]: retry delays are non-decreasing, capped and never overflow.
//! - [`claims_model`]: a state-machine test of item claims against a real store.
//! - [`hydration`]: packet refs and bodies; corrupt worklist rows in a real batch.
//! - [`cli`]: random argument vectors and durations.
//! - [`contains`]: the JSON containment reference against PostgreSQL `@>`.
//!
//! Backends: SQLite always; PostgreSQL and MySQL/MariaDB when `DOCKHAND_TEST_POSTGRES_URL` /
//! `DOCKHAND_TEST_MYSQL_URL` are set (the conformance harness is shared, see [`harness`]).

#[path = "../conformance/harness.rs"]
#[allow(dead_code)]
mod harness;

mod args;
mod backoff;
mod claims_model;
mod cli;
mod contains;
mod cron;
mod hydration;
mod support;
mod urls;
