//! The PostgreSQL backend (being written).
use super::*;
/// PostgreSQL store.
#[derive(Debug)]
pub struct PgStore;
impl PgStore {
    /// Connect.
    pub async fn connect(_url: &str) -> Result<Self> {
        Err(Error::Config("postgres backend not built yet".into()))
    }
}
