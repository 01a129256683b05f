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

#[tokio::test]
async fn the_queued_step_cancel_finds_its_action_by_unique_key() {
    let (_dir, store) = migrated().await;
    let plan = plan(&store, super::bridge::CANCEL_QUEUED_STEP, 3).await;
    assert!(
        plan.iter()
            .any(|p| p.contains("USING INDEX dockhand_actions_unique (unique_key=?)")),
        "the cancel walked another index: {plan:?}"
    );
}

/// A migrated store in a temporary directory (kept alive by the returned guard).
async fn migrated() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    (dir, store)
}

/// The plan of a built statement (every bind as NULL).
async fn plan_of(
    store: &SqliteStore,
    qb: sqlx::QueryBuilder<'static, sqlx::Sqlite>,
) -> Vec<String> {
    let sql = qb.sql().to_string();
    plan(store, &sql, sql.matches('?').count()).await
}

#[tokio::test]
async fn hook_queries_walk_the_index_of_their_status() {
    use crate::action::{ActionFilter, ActionQuery};
    use crate::search::{ActionSearch, ActionSort};
    use crate::state::ActionStatus;
    let (_dir, store) = migrated().await;
    let by_hook = ActionFilter {
        hook: Some("h".into()),
        ..ActionFilter::default()
    };
    let pending = |plan: &[String]| {
        plan.iter()
            .any(|p| p.contains("INDEX dockhand_actions_hook_pending (hook=?"))
    };
    let running = |plan: &[String]| {
        plan.iter()
            .any(|p| p.contains("INDEX dockhand_actions_lease"))
    };
    let scans_table = |plan: &[String]| plan.iter().any(|p| p == "SCAN dockhand_actions");
    let p = plan_of(&store, super::query::next_scheduled_sql(&by_hook).unwrap()).await;
    assert!(pending(&p), "next_scheduled by hook: {p:?}");
    for statuses in [
        vec![ActionStatus::Pending],
        vec![ActionStatus::Running],
        vec![ActionStatus::Pending, ActionStatus::Running],
    ] {
        let q = ActionQuery {
            filter: by_hook.clone(),
            statuses: statuses.clone(),
            ..ActionQuery::default()
        };
        let p = plan_of(&store, super::query::query_sql(&q).unwrap()).await;
        let want_pending = statuses.contains(&ActionStatus::Pending);
        let want_running = statuses.contains(&ActionStatus::Running);
        assert_eq!(
            pending(&p),
            want_pending,
            "query {statuses:?} by hook: {p:?}"
        );
        assert_eq!(
            running(&p),
            want_running,
            "query {statuses:?} by hook: {p:?}"
        );
        assert!(!scans_table(&p), "query {statuses:?} by hook: {p:?}");
    }
    for status in [ActionStatus::Pending, ActionStatus::Running] {
        let s = ActionSearch {
            status: Some(status),
            hook: Some("h".into()),
            sort: ActionSort::Scheduled,
            ..ActionSearch::default()
        };
        let p = plan_of(&store, super::ui::search_sql(&s).unwrap()).await;
        let walks = match status {
            ActionStatus::Pending => pending(&p),
            _ => running(&p),
        };
        assert!(
            walks && !scans_table(&p),
            "dashboard {status:?} tab by hook: {p:?}"
        );
    }
    // Finished actions by hook walk the finished index of their status, never the table.
    let s = ActionSearch {
        status: Some(ActionStatus::Complete),
        hook: Some("h".into()),
        sort: ActionSort::FinishedDesc,
        ..ActionSearch::default()
    };
    let p = plan_of(&store, super::ui::search_sql(&s).unwrap()).await;
    assert!(
        p.iter()
            .any(|l| l.contains("USING INDEX dockhand_actions_finished_by_status")),
        "dashboard complete tab by hook: {p:?}"
    );
}

#[tokio::test]
async fn a_groups_queries_walk_the_grouped_index() {
    use crate::search::{ActionSearch, ActionSort};
    use crate::state::ActionStatus;
    let (_dir, store) = migrated().await;
    let s = ActionSearch {
        status: Some(ActionStatus::Pending),
        group: Some(Some("g".into())),
        sort: ActionSort::Scheduled,
        ..ActionSearch::default()
    };
    let p = plan_of(&store, super::ui::search_sql(&s).unwrap()).await;
    assert!(
        p.iter()
            .any(|l| l.contains("USING INDEX dockhand_actions_group_sched (group_name=?")),
        "dashboard pending tab of a group: {p:?}"
    );
    let p = plan(
        &store,
        "SELECT count(*) FROM dockhand_actions WHERE group_name = ? AND status = 'running'",
        1,
    )
    .await;
    assert!(
        p.iter()
            .any(|l| l.contains("USING COVERING INDEX dockhand_actions_group_sched")),
        "running count of a group: {p:?}"
    );
}

#[test]
fn reads_of_names_the_statuses_a_statement_reads() {
    use super::query::Reads;
    use crate::state::ActionStatus::*;
    assert_eq!(Reads::of(&[]), Reads::Any);
    assert_eq!(Reads::of(&[Pending]), Reads::Pending);
    assert_eq!(Reads::of(&[Pending, Pending]), Reads::Pending);
    assert_eq!(Reads::of(&[Running]), Reads::Running);
    assert_eq!(Reads::of(&[Running, Pending]), Reads::Active);
    assert_eq!(Reads::of(&[Pending, Complete]), Reads::Any);
    assert_eq!(Reads::of(&[Failed]), Reads::Any);
}
