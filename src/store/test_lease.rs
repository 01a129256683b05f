//! Test support: a real running action lease, for the store methods that a chunk action's
//! lease fences (`lease_work`, `settle_work`).

use super::{ClaimRequest, Lease, Store};
use crate::action::{ActionFilter, ActionQuery, ActionSpec};
use crate::state::ActionStatus;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;

/// The lease of the run of hook `test.lease.<owner>`: the running one if there is one, else a
/// new action enqueued and claimed as `owner` with a one-day lease. So one owner name means
/// one chunk run throughout a test. Its hook has no handler, so nothing else runs it.
pub(crate) async fn running_lease<S: Store + ?Sized>(
    store: &S,
    owner: &str,
    now: DateTime<Utc>,
) -> Lease {
    let hook = format!("test.lease.{owner}");
    let running = store
        .query(&ActionQuery {
            filter: ActionFilter {
                hook: Some(hook.clone()),
                ..Default::default()
            },
            statuses: vec![ActionStatus::Running],
            limit: 1,
            ..Default::default()
        })
        .await
        .expect("query");
    if let Some(a) = running.first() {
        return Lease {
            id: a.id,
            token: a.lease_token,
        };
    }
    let action = ActionSpec::new(hook.clone(), json!({}))
        .prepare(now)
        .expect("a valid test action");
    store.enqueue(&action, now).await.expect("enqueue");
    let hooks = [hook];
    let got = store
        .claim(&ClaimRequest {
            owner,
            limit: 1,
            now,
            lease_until: now + Duration::days(1),
            hooks: Some(&hooks),
            routing: None,
        })
        .await
        .expect("claim");
    assert_eq!(got.len(), 1, "the test action is due at {now}");
    got[0].lease()
}
