//! End-to-end tests of the dashboard in a real headless browser (`ui` feature; Debian's
//! `chromium` and `chromium-driver`), driven over WebDriver ([`webdriver`]). Each test skips
//! with one line when chromedriver is missing, unless `DOCKHAND_E2E_REQUIRED=1` (set by
//! `.ci/run`), which makes a missing browser a failure. Run with
//! `cargo test --features ui --test e2e`.

#![forbid(unsafe_code)]

mod dashboard;
mod harness;
mod rebinding;
mod webdriver;
