//! The chaos run's checker: the invariants I1–I8 of RELIABILITY.md §3, read back from the
//! database after the drain, and the counts that go into the run's figures.

use super::workload::{self, Plan, SCOPE};
use crate::claims::ClaimFilter;
use crate::jobs::JobFilter;
use crate::state::{ClaimStatus, JobStatus};
use crate::store::chaos::ChaosDb;
use crate::{ActionQuery, ActionStatus, DynStore};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What the producer saw.
#[derive(Debug, Default, Clone)]
pub struct Acks {
    /// Plain/slow action keys whose enqueue returned success.
    pub actions: BTreeSet<String>,
    /// Keys whose enqueue never returned success (outcome unknown).
    pub unknown_actions: BTreeSet<String>,
    /// Jobs whose start returned an id: (id, pipeline, items it requested).
    pub jobs: Vec<(i64, &'static str, Vec<String>)>,
    /// Job starts that never returned an id.
    pub unknown_jobs: u64,
}

/// The counts of a run, read back from the database.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Counts {
    /// Actions the producer enqueued (acknowledged).
    pub actions_enqueued: u64,
    /// Of those, complete.
    pub actions_completed: u64,
    /// Of those, failed by design (fatal).
    pub actions_failed_by_design: u64,
    /// Runs beyond the first attempt that faults caused (attempts − 1, less the designed
    /// retries and panics).
    pub extra_attempts: u64,
    /// Jobs started (acknowledged): claim jobs and batch parents.
    pub jobs_started: u64,
    /// Batch parents finished `completed`.
    pub batches_finished: u64,
    /// Child jobs created by the batches.
    pub batch_children: u64,
    /// Items processed (claims in `processed`).
    pub items_processed: u64,
    /// Ledger rows.
    pub ledger_rows: u64,
    /// Work whose acknowledgement was lost but was found stored afterwards.
    pub recovered_unknown: u64,
}

/// The checker's verdict.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Verdict {
    /// Broken invariants, each naming its invariant and subject.
    pub violations: Vec<String>,
    /// Acknowledged work not found or not finished as expected (I1).
    pub lost: u64,
    /// Items with more than one ledger row (I2).
    pub duplicates: u64,
    /// The counts.
    pub counts: Counts,
}

async fn all_actions(store: &DynStore) -> crate::Result<Vec<crate::action::Action>> {
    let mut out = Vec::new();
    loop {
        let page = store
            .query(&ActionQuery {
                limit: 5000,
                offset: out.len() as i64,
                ..ActionQuery::default()
            })
            .await?;
        let n = page.len();
        out.extend(page);
        if n < 5000 {
            return Ok(out);
        }
    }
}

/// Runs every invariant; `check_ok` is whether `dockhand check` exited 0.
pub async fn verify(
    store: &DynStore,
    db: &ChaosDb,
    plan: &Plan,
    acks: &Acks,
    check_ok: bool,
) -> crate::Result<Verdict> {
    let mut v = Verdict::default();
    let mut bad = |s: String| v.violations.push(s);
    if !check_ok {
        bad("I4/I6: `dockhand check` reported violations (see check.txt)".into());
    }
    // I1, I7: every acknowledged action final as designed, attempts bounded, nothing stuck.
    let actions = all_actions(store).await?;
    let by_key: HashMap<&str, &crate::action::Action> = actions
        .iter()
        .filter(|a| a.hook == workload::PLAIN_HOOK || a.hook == workload::SLOW_HOOK)
        .filter_map(|a| a.args.get("key").and_then(|k| k.as_str()).map(|k| (k, a)))
        .collect();
    let mut lost = 0;
    let mut c = Counts::default();
    for a in &plan.actions {
        let acked = acks.actions.contains(&a.key);
        let Some(stored) = by_key.get(a.key.as_str()) else {
            if acked {
                lost += 1;
                bad(format!("I1: action {} acknowledged but not stored", a.key));
            }
            continue;
        };
        if !acked {
            c.recovered_unknown += 1;
        }
        c.actions_enqueued += u64::from(acked);
        let want = if a.fails_by_design() {
            ActionStatus::Failed
        } else {
            ActionStatus::Complete
        };
        if stored.status != want {
            lost += 1;
            bad(format!(
                "I1: action {} (id {}) is {} after the drain, expected {want} (last error: {:?})",
                a.key, stored.id, stored.status, stored.last_error
            ));
        }
        match stored.status {
            ActionStatus::Complete => c.actions_completed += 1,
            ActionStatus::Failed if a.fails_by_design() => {
                c.actions_failed_by_design += 1;
                if stored.last_error.as_deref().map_or(true, str::is_empty) {
                    bad(format!(
                        "I7: fatal action {} failed without a reason",
                        a.key
                    ));
                }
            }
            _ => {}
        }
        let designed = i32::from(matches!(a.mode, "retry" | "panic"));
        c.extra_attempts += (stored.attempt - 1 - designed).max(0) as u64;
    }
    for a in &actions {
        if a.attempt > a.max_attempts {
            bad(format!(
                "I7: action {} ran {} attempts, more than its {}",
                a.id, a.attempt, a.max_attempts
            ));
        }
        if matches!(a.status, ActionStatus::Running | ActionStatus::Pending) {
            bad(format!(
                "I7: action {} ({}) still {} after the drain",
                a.id, a.hook, a.status
            ));
        }
    }
    // I1, I5: every acknowledged job final as designed; every job (children too) final.
    let jobs = store
        .list_jobs(&JobFilter {
            limit: 10_000_000,
            ..JobFilter::default()
        })
        .await?;
    let job_by_id: HashMap<i64, &crate::jobs::Job> = jobs.iter().map(|j| (j.id, j)).collect();
    for (id, pipeline, _) in &acks.jobs {
        c.jobs_started += 1;
        match job_by_id.get(id) {
            None => {
                lost += 1;
                bad(format!(
                    "I1: {pipeline} job {id} acknowledged but not stored"
                ));
            }
            Some(j) if !matches!(j.status, JobStatus::Completed | JobStatus::CompletedNoItems) => {
                lost += 1;
                bad(format!(
                    "I1/I5: {pipeline} job {id} ended {} ({:?}), expected completed",
                    j.status, j.reason
                ));
            }
            Some(j) => {
                let batch = [workload::BATCH_PIPELINE, workload::IN_CHUNK_PIPELINE];
                if batch.contains(pipeline) && j.status == JobStatus::Completed {
                    c.batches_finished += 1;
                }
            }
        }
    }
    for j in &jobs {
        if !j.status.is_final() {
            bad(format!(
                "I5: job {} ({}) still {} after the drain",
                j.id, j.pipeline, j.status
            ));
        }
        c.batch_children += u64::from(j.parent_id.is_some());
    }
    // I2, I3, I4: ledger rows once per item, each by the token that processed the claim; no
    // claim still held.
    let ledger = db.ledger().await?;
    c.ledger_rows = ledger.len() as u64;
    let claims = store
        .list_claims(&ClaimFilter {
            scope: Some(SCOPE.into()),
            limit: 10_000_000,
            ..ClaimFilter::default()
        })
        .await?;
    let mut processed: BTreeSet<&str> = BTreeSet::new();
    for cl in &claims {
        match cl.status {
            ClaimStatus::Processed => {
                c.items_processed += 1;
                processed.insert(cl.identity.item_id.as_str());
            }
            ClaimStatus::Claimed => bad(format!(
                "I4: item {} still claimed (job {:?}, expires {:?}) after the drain",
                short(cl.identity.item_id.as_str()),
                cl.job_id,
                cl.expires_at
            )),
            ClaimStatus::Deferred => {}
        }
    }
    let mut rows: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &ledger {
        rows.entry(r.item_id.as_str())
            .or_default()
            .push(r.token.as_str());
    }
    // I3: a processed claim keeps no token, so the fence is checked by its effect: a ledger
    // row exists only beside a processed claim, and no two rows (of any items) share a token
    // — a stale holder's completion, had it slipped through, would add a second row or reuse
    // a token.
    let mut duplicates = 0;
    let mut seen_tokens: HashMap<&str, &str> = HashMap::new();
    for (item, toks) in &rows {
        if toks.len() > 1 {
            duplicates += 1;
            bad(format!(
                "I2: item {} has {} ledger rows",
                short(item),
                toks.len()
            ));
        }
        if !processed.contains(item) {
            bad(format!(
                "I3: item {} has a ledger row but its claim is not processed",
                short(item)
            ));
        }
        for t in toks {
            if let Some(other) = seen_tokens.insert(t, item) {
                bad(format!(
                    "I3: token {t} wrote ledger rows for {} and {}",
                    short(other),
                    short(item)
                ));
            }
        }
    }
    // I1 for items: every item of acknowledged work processed, with its one ledger row.
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for a in plan.actions.iter().filter(|a| !a.fails_by_design()) {
        if acks.actions.contains(&a.key) {
            wanted.insert(format!("plain:{}", a.key));
        }
    }
    for (_, _, items) in &acks.jobs {
        wanted.extend(items.iter().cloned());
    }
    for item in &wanted {
        if !rows.contains_key(item.as_str()) {
            lost += 1;
            bad(format!(
                "I1: item {} of acknowledged work has no ledger row",
                short(item)
            ));
        }
    }
    // I8: storage sane.
    if let Some(result) = db.integrity_check().await? {
        if result != "ok" {
            bad(format!("I8: SQLite integrity_check: {result}"));
        }
    }
    v.lost = lost;
    v.duplicates = duplicates;
    v.counts = c;
    Ok(v)
}

/// An item id shortened for messages (ids may be 200+ characters).
fn short(item: &str) -> String {
    if item.len() <= 40 {
        return item.to_string();
    }
    let head: String = item.chars().take(12).collect();
    let tail: String = item
        .chars()
        .rev()
        .take(12)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{head}…{tail} ({} chars)", item.chars().count())
}
