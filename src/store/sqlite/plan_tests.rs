//! Query plans of hot-path statements whose good plan SQLite's planner does not find on its
//! own (no statistics): each is checked with `EXPLAIN QUERY PLAN` on a migrated database.

use super::SqliteStore;
use crate::store::Store;

async fn plan(store: &SqliteStore, sql: &str, params: usize) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {sql}");
    let mut q = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
    for _ in 0..params {
        q = q.bind(Option::<i64>::None);
    }
    q.fetch_all(store.pool())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.3)
        .collect()
}

#[tokio::test]
async fn start_steps_looks_jobs_up_by_id_not_by_status() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let plan = plan(&store, super::grouped::START_STEPS, 2).await;
    assert!(
        plan.iter()
            .any(|p| p.starts_with("SEARCH dockhand_jobs USING INTEGER PRIMARY KEY")),
        "{plan:?}"
    );
    assert!(
        !plan.iter().any(|p| p.contains("dockhand_jobs_status")),
        "the start walked the pending jobs: {plan:?}"
    );
}
