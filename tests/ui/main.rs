//! Router tests of the dashboard.
