//! A model-based state-machine test of item claims (§5 row 4) against a real store: random
//! sequences of claim / complete / release / advance-clock / takeover-after-expiry by several
//! owners over a few identities — some sharing a 250-character prefix, some differing only in
//! scope or source type — each step checked against a small in-memory model, and every
//! identity's stored claim compared with the model after every step.
//!
//! Rules the model encodes (`state::claim` and the conformance scenarios S-C1…S-C4):
//! identities are equal only in full; only the current token holder completes or releases (a
//! stale or forged descriptor changes nothing); another owner takes a claim over only once it
//! expired (`expires_at <= now`), its own owner re-claims it keeping the token; a processed
//! item is claimable only when reprocessing is asked for; an expired claim nobody took over can
//! still be completed by its holder.

use crate::harness::{Kind, TestDb};
use crate::support::{runner, tokio_rt};
use chrono::{DateTime, Duration, Utc};
use dockhand::claims::{ClaimStatus, CompleteOutcome};
use dockhand::{Clock, CompletionConfig, Descriptor, Identity, Jobs};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Identities per case: the same long item id under two source types and two scopes, a
/// second long id differing only in its last character, and a short one.
const IDENTITIES: usize = 5;

fn identity(case: usize, i: usize) -> Identity {
    let long = "p".repeat(250);
    let scope = format!("case{case}");
    let (scope, source, item) = match i {
        0 => (scope, "rss", format!("{long}a")),
        1 => (scope, "rss", format!("{long}b")),
        2 => (scope, "csv", format!("{long}a")),
        3 => (format!("{scope}x"), "rss", format!("{long}a")),
        _ => (scope, "rss", "a".to_string()),
    };
    Identity::new(scope, source, item).unwrap()
}

/// Owners: three job ids (free-standing: no job rows) and no job at all.
const OWNERS: [Option<i64>; 4] = [Some(1), Some(2), Some(3), None];

#[derive(Debug, Clone)]
enum Op {
    Claim {
        id: usize,
        owner: usize,
        ttl: i64,
        reprocess: bool,
        retain: bool,
    },
    /// Completes a held descriptor (by index, any age), or a forgery of it naming another
    /// identity.
    Complete {
        held: usize,
        forge: Option<usize>,
    },
    Release {
        held: usize,
        defer: bool,
    },
    Advance {
        secs: i64,
    },
    /// Moves the clock to (or past) the expiry of the identity's claim, then claims it as
    /// another owner.
    Takeover {
        id: usize,
        owner: usize,
        past: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDENTITIES;
    let owner = 0..OWNERS.len();
    prop_oneof![
        4 => (id.clone(), owner.clone(), 1i64..120, any::<bool>(), any::<bool>()).prop_map(
            |(id, owner, ttl, reprocess, retain)| Op::Claim { id, owner, ttl, reprocess, retain }
        ),
        3 => (0..64usize, prop::option::weighted(0.2, 0..IDENTITIES))
            .prop_map(|(held, forge)| Op::Complete { held, forge }),
        2 => (0..64usize, any::<bool>()).prop_map(|(held, defer)| Op::Release { held, defer }),
        1 => prop_oneof![0i64..5, 0i64..200].prop_map(|secs| Op::Advance { secs }),
        2 => (id, owner, 0i64..3).prop_map(|(id, owner, past)| Op::Takeover { id, owner, past }),
    ]
}

/// The model of one claim row.
#[derive(Debug, Clone, PartialEq)]
enum Row {
    Claimed {
        token: String,
        owner: Option<i64>,
        expires: DateTime<Utc>,
    },
    Processed {
        owner: Option<i64>,
    },
    Deferred,
}

struct Model {
    rows: HashMap<usize, Row>,
    held: Vec<Descriptor>,
}

impl Model {
    /// What a claim by `owner` at `now` must do: `Some(Some(token))` keeps the token,
    /// `Some(None)` issues a new one, `None` refuses.
    fn claim(
        &self,
        id: usize,
        owner: Option<i64>,
        now: DateTime<Utc>,
        reprocess: bool,
    ) -> Option<Option<String>> {
        match self.rows.get(&id) {
            None | Some(Row::Deferred) => Some(None),
            Some(Row::Processed { .. }) => reprocess.then_some(None),
            Some(Row::Claimed {
                token,
                owner: o,
                expires,
            }) => {
                if owner.is_some() && *o == owner {
                    Some(Some(token.clone()))
                } else if *expires <= now {
                    Some(None)
                } else {
                    None
                }
            }
        }
    }

    fn index_of(&self, which: &Identity, case: usize) -> usize {
        (0..IDENTITIES)
            .find(|i| identity(case, *i) == *which)
            .unwrap()
    }

    /// Whether `d` (its identity, token) holds the claim now.
    fn holds(&self, id: usize, d: &Descriptor) -> bool {
        matches!(self.rows.get(&id), Some(Row::Claimed { token, .. }) if *token == d.token)
    }
}

fn claim_config(retain: bool) -> CompletionConfig {
    CompletionConfig {
        retain_processed: retain,
        ..CompletionConfig::default()
    }
}

async fn run_case(jobs: &Jobs, db: &TestDb, case: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut m = Model {
        rows: HashMap::new(),
        held: Vec::new(),
    };
    let fail = |step: usize, e: dockhand::Error| TestCaseError::fail(format!("step {step}: {e}"));
    for (step, op) in ops.iter().enumerate() {
        let now = db.clock.now();
        match op.clone() {
            Op::Advance { secs } => db.clock.advance(Duration::seconds(secs)),
            Op::Claim {
                id,
                owner,
                ttl,
                reprocess,
                retain,
            } => {
                claim(
                    jobs,
                    db,
                    &mut m,
                    case,
                    step,
                    id,
                    OWNERS[owner],
                    ttl,
                    reprocess,
                    retain,
                )
                .await?
            }
            Op::Takeover { id, owner, past } => {
                if let Some(Row::Claimed { expires, .. }) = m.rows.get(&id) {
                    if *expires + Duration::seconds(past) > now {
                        db.clock.set(*expires + Duration::seconds(past));
                    }
                }
                claim(
                    jobs,
                    db,
                    &mut m,
                    case,
                    step,
                    id,
                    OWNERS[owner],
                    30,
                    false,
                    true,
                )
                .await?
            }
            Op::Complete { held, forge } => {
                if m.held.is_empty() {
                    continue;
                }
                let mut d = m.held[held % m.held.len()].clone();
                if let Some(other) = forge {
                    d.identity = identity(case, other);
                }
                let id = m.index_of(&d.identity, case);
                let expect = m.holds(id, &d);
                let got = jobs.complete(&d).await.map_err(|e| fail(step, e))?;
                prop_assert_eq!(
                    got == CompleteOutcome::Completed,
                    expect,
                    "step {} {:?}",
                    step,
                    op
                );
                if expect {
                    let owner = match m.rows.get(&id) {
                        Some(Row::Claimed { owner, .. }) => *owner,
                        _ => unreachable!(),
                    };
                    if d.completion.retain_processed {
                        m.rows.insert(id, Row::Processed { owner });
                    } else {
                        m.rows.remove(&id);
                    }
                }
            }
            Op::Release { held, defer } => {
                if m.held.is_empty() {
                    continue;
                }
                let d = m.held[held % m.held.len()].clone();
                let id = m.index_of(&d.identity, case);
                let expect = m.holds(id, &d);
                let got = jobs.release(&d, defer).await.map_err(|e| fail(step, e))?;
                prop_assert_eq!(got, expect, "step {} {:?}", step, op);
                if expect {
                    if defer {
                        m.rows.insert(id, Row::Deferred);
                    } else {
                        m.rows.remove(&id);
                    }
                }
            }
        }
        // Every identity's stored claim matches the model after every step.
        for i in 0..IDENTITIES {
            let stored = jobs
                .claim_state(&identity(case, i))
                .await
                .map_err(|e| fail(step, e))?;
            let got = stored.map(|c| {
                prop_assert_eq!(&c.identity, &identity(case, i), "full identity stored");
                Ok(match c.status {
                    ClaimStatus::Claimed => Row::Claimed {
                        token: c.token.unwrap_or_default(),
                        owner: c.job_id,
                        expires: c.expires_at.unwrap_or_default(),
                    },
                    ClaimStatus::Processed => {
                        prop_assert_eq!(c.token, None);
                        Row::Processed { owner: c.job_id }
                    }
                    ClaimStatus::Deferred => {
                        prop_assert_eq!((c.token, c.job_id), (None, None));
                        Row::Deferred
                    }
                })
            });
            let got = got.transpose()?;
            prop_assert_eq!(
                got.as_ref(),
                m.rows.get(&i),
                "identity {} after step {} {:?}",
                i,
                step,
                op
            );
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn claim(
    jobs: &Jobs,
    db: &TestDb,
    m: &mut Model,
    case: usize,
    step: usize,
    id: usize,
    owner: Option<i64>,
    ttl: i64,
    reprocess: bool,
    retain: bool,
) -> Result<(), TestCaseError> {
    let now = db.clock.now();
    let expect = m.claim(id, owner, now, reprocess);
    let got = jobs
        .claim(
            identity(case, id),
            owner,
            Duration::seconds(ttl),
            claim_config(retain),
            reprocess,
        )
        .await
        .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
    match (expect, got) {
        (None, None) => {}
        (Some(kept), Some(d)) => {
            prop_assert_eq!(&d.identity, &identity(case, id));
            prop_assert_eq!(d.job_id, owner);
            match kept {
                Some(token) => prop_assert_eq!(&d.token, &token, "own re-claim keeps the token"),
                None => prop_assert!(
                    m.held.iter().all(|h| h.token != d.token),
                    "a new claim gets a new token"
                ),
            }
            m.rows.insert(
                id,
                Row::Claimed {
                    token: d.token.clone(),
                    owner,
                    expires: now + Duration::seconds(ttl),
                },
            );
            m.held.push(d);
        }
        (expect, got) => prop_assert!(
            false,
            "step {step}: claim of {id} by {owner:?} at {now}: model {expect:?}, store {got:?}; row {:?}",
            m.rows.get(&id)
        ),
    }
    Ok(())
}

fn model_test(kind: Kind) {
    let rt = tokio_rt();
    let Some(db) = rt.block_on(TestDb::new(kind)) else {
        return;
    };
    let jobs = Jobs::without_pipelines(db.store.clone(), Arc::new(db.clock.clone()));
    let cases = AtomicUsize::new(0);
    let (n, len) = if kind == Kind::Sqlite {
        (96, 40)
    } else {
        (40, 30)
    };
    let result = runner(n).run(&prop::collection::vec(op(), 1..len), |ops| {
        let case = cases.fetch_add(1, Ordering::Relaxed);
        rt.block_on(run_case(&jobs, &db, case, &ops))
    });
    rt.block_on(db.cleanup());
    if let Err(e) = result {
        panic!("{kind:?}: {e}");
    }
}

crate::per_backend!(model_test);
