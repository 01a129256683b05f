//! Router tests of the dashboard (`ui` feature): the router answers in-process
//! (`tower::ServiceExt::oneshot`) over a real, migrated SQLite file in a temporary directory,
//! seeded through `Queue` and the store with a frozen clock. No sockets, no sleeps.

mod bulk;
mod claims;
mod cli;
mod group_limits;
mod group_pause;
mod hardening;
mod host_check;
mod jobs;
mod lists;
mod metrics;
mod pages;
mod refresh;
mod rerun;
mod security;
mod seed;
mod support;
mod times;
mod writes;
