//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds `migrations/` at
//! compile time, and cargo does not watch that directory on its own (sqlx's documented
//! build-script line).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
