//! PostgreSQL: a chunk's children created set-based ([`crate::Store::create_children`]). One
//! transaction under the chunk run's fence locks the parent, the chunk's worklist rows and the
//! claims they hand over (the lock order of [`super::batch`]), reads the children that exist,
//! decides every row as [`super::batch::create_child`] would (adopt, discard because the batch
//! stopped or a claim was lost, or create), then writes the new children with one statement
//! per table: the jobs (`UNNEST` of the specs joined to their worklist rows), the claim
//! hand-over, the rows marked completed, the step actions in bulk, and last the parent's
//! `children_total` once. Children the chunk run runs itself ([`ChildSpec::run_by`]) are
//! inserted started (`processing`) with their step actions `running` under its lease, unless
//! their group is paused or limited. Any error rolls the whole chunk back; the caller then goes row by
//! row.
//!
//! The parent is locked `FOR KEY SHARE`, not `FOR UPDATE`: every change that decides whether a
//! child may be created (an operator's stop, the fence, the parent's own finish) locks it
//! `FOR UPDATE` first and so waits for this transaction, but the counter updates of children
//! finishing meanwhile (plain `UPDATE`s, `FOR NO KEY UPDATE`) do not; they wait only for the
//! last statement's `children_total` write to commit. Holding the parent `FOR UPDATE` for the
//! whole transaction queued every earlier chunk's finishes behind the next chunk's creation
//! (~19 ms per chunk, session 14's W4 profile).

use super::batch::{discard_row, refusal};
use super::enqueue::{bind_unnested, enqueue_fresh, unnested_actions_sql};
use super::lease_fence::run_fence;
use super::{ts, PgStore};
use crate::batch::{ChildOutcome, ChildSpec, DiscardCause, RunBy};
use crate::error::{Error, Result};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::collections::{HashMap, HashSet};

/// The claims of `$2` (tokens) still held by the parent `$1`, locked in token order. Each
/// token is looked up in the token index on its own (`LATERAL … OFFSET 0`), and the rows are
/// then read by primary key: `job_id + 0` keeps the planner off the `job_id` index, which walks
/// every claim of the batch. On statistics taken before the batch's claims existed, the plain
/// form scanned the claims table for the tokens and walked the parent's claims, once per chunk
/// (PostgreSQL W4 +10-15 %; `tests/plans.rs`).
pub(super) const HELD_CLAIMS: &str = "SELECT token FROM dockhand_item_claims
 WHERE id = ANY(ARRAY(SELECT d.id FROM UNNEST($2::text[]) AS t(token),
                      LATERAL (SELECT x.id FROM dockhand_item_claims x
                               WHERE x.token = t.token OFFSET 0) d))
   AND job_id + 0 = $1 AND status = 'claimed'
 ORDER BY token FOR UPDATE";

/// Hands the claims `$1` (tokens) of parent `$5` to the children `$3` with ttls `$4` (ms), at
/// `$2`; the rows found as [`HELD_CLAIMS`] finds them.
pub(super) const HAND_OVER_CLAIMS: &str = "UPDATE dockhand_item_claims c
 SET job_id = m.child,
     expires_at = $2 + COALESCE(c.ttl_ms, m.ttl) * INTERVAL '1 millisecond'
 FROM UNNEST($1::text[], $3::int8[], $4::int8[]) AS m(token, child, ttl)
 WHERE c.id = ANY(ARRAY(SELECT d.id FROM UNNEST($1::text[]) AS t(token),
                        LATERAL (SELECT x.id FROM dockhand_item_claims x
                                 WHERE x.token = t.token OFFSET 0) d))
   AND c.token = m.token AND c.job_id + 0 = $5 AND c.status = 'claimed'";

pub(super) async fn create_children(
    store: &PgStore,
    specs: &[ChildSpec],
    chunk: Lease,
    now: DateTime<Utc>,
) -> Result<Vec<ChildOutcome>> {
    let op = "create_children";
    let Some(first) = specs.first() else {
        return Ok(Vec::new());
    };
    let parent = first.parent_id;
    let mut seen = HashSet::new();
    if specs
        .iter()
        .any(|c| c.parent_id != parent || !seen.insert(c.idx))
    {
        return Err(Error::invalid(
            "children",
            format!("job {parent}: one parent and distinct rows per call"),
        ));
    }
    let mut tx = store.begin(op).await?;
    let done = async {
        run_fence(&mut tx, chunk, op).await?;
        create_in_tx(&mut tx, parent, specs, now, &store.channel).await
    }
    .await;
    match done {
        Ok((outcomes, due)) => {
            tx.commit().await.map_err(Error::db(op))?;
            if due {
                store.wake.notify();
            }
            Ok(outcomes)
        }
        Err(e) => {
            // Dropping the transaction rolls back if this fails too.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// The rows' decisions and writes on the open transaction; true when a due step action was
/// enqueued.
async fn create_in_tx(
    conn: &mut PgConnection,
    parent: i64,
    specs: &[ChildSpec],
    now: DateTime<Utc>,
    channel: &str,
) -> Result<(Vec<ChildOutcome>, bool)> {
    let op = "create_children";
    let idxs: Vec<i32> = specs.iter().map(|c| c.idx).collect();
    // The parent's lock first (see the lock order of `batch`); its status decides below. Key
    // share mode: every stop, fence and finish of the parent locks it `FOR UPDATE` and waits
    // for this transaction (so no child is created after a stop committed), while the
    // children's counter updates (`FOR NO KEY UPDATE`) do not.
    let parent_row: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT status, batch_outcome FROM dockhand_jobs WHERE id = $1 FOR KEY SHARE",
    )
    .bind(parent)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let existing: HashMap<i32, i64> = sqlx::query_as::<_, (i32, i64)>(
        "SELECT child_index, id FROM dockhand_jobs WHERE parent_id = $1 AND child_index = ANY($2)",
    )
    .bind(parent)
    .bind(&idxs)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?
    .into_iter()
    .collect();
    let rows: HashMap<i32, String> = sqlx::query_as::<_, (i32, String)>(
        "SELECT idx, state FROM dockhand_worklist
         WHERE parent_id = $1 AND idx = ANY($2) ORDER BY idx FOR UPDATE",
    )
    .bind(parent)
    .bind(&idxs)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?
    .into_iter()
    .collect();
    let mut all_tokens: Vec<&str> = specs
        .iter()
        .flat_map(|c| c.claim_tokens.iter().map(String::as_str))
        .collect();
    all_tokens.sort_unstable();
    all_tokens.dedup();
    // The claims still the parent's, locked: no takeover slips in before the hand-over. A
    // token handed to an earlier row of this call is no longer the parent's for a later one.
    let mut held: HashSet<String> = sqlx::query_scalar(HELD_CLAIMS)
        .bind(parent)
        .bind(&all_tokens)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?
        .into_iter()
        .collect();
    let mut outcomes: Vec<Option<ChildOutcome>> = vec![None; specs.len()];
    let mut create: Vec<(usize, Vec<&String>)> = Vec::new();
    for (at, c) in specs.iter().enumerate() {
        let idx = c.idx;
        if let Some(&child) = existing.get(&idx) {
            sqlx::query(
                "UPDATE dockhand_worklist
                 SET state = 'completed', child_id = $3, lease_owner = NULL, lease_until = NULL
                 WHERE parent_id = $1 AND idx = $2",
            )
            .bind(parent)
            .bind(idx)
            .bind(child)
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
            outcomes[at] = Some(ChildOutcome::Adopted(child));
            continue;
        }
        let row = rows.get(&idx);
        let stopped = refusal(parent, idx, parent_row.as_ref(), row.map(String::as_str))?;
        let mut tokens: Vec<&String> = c.claim_tokens.iter().collect();
        tokens.sort_unstable();
        tokens.dedup();
        let lost = tokens.iter().filter(|t| !held.contains(t.as_str())).count();
        let discard = if stopped {
            Some((
                DiscardCause::BatchStopped,
                "batch stopped: no new child".to_string(),
            ))
        } else if lost > 0 {
            Some((
                DiscardCause::ClaimLost,
                format!(
                    "claim lost: {lost} of {} claims are no longer held by the parent",
                    tokens.len()
                ),
            ))
        } else {
            None
        };
        // A row's claims leave the parent either way (handed over, or released by a discard).
        for t in &tokens {
            held.remove(t.as_str());
        }
        if let Some((cause, error)) = discard {
            discard_row(&mut *conn, parent, idx, (&error, 0), op).await?;
            outcomes[at] = Some(ChildOutcome::Discarded(cause));
            continue;
        }
        create.push((at, tokens));
    }
    let mut due = false;
    if !create.is_empty() {
        due = insert_children(
            &mut *conn,
            parent,
            specs,
            &create,
            &mut outcomes,
            now,
            channel,
        )
        .await?;
    }
    let outcomes = outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| Error::Config(format!("job {parent}: a row got no outcome"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((outcomes, due))
}

/// Inserts the children of `create` (spec position, its claim tokens) with their hand-overs,
/// rows, counter and step actions; fills their outcomes. True when a step action is due.
async fn insert_children(
    conn: &mut PgConnection,
    parent: i64,
    specs: &[ChildSpec],
    create: &[(usize, Vec<&String>)],
    outcomes: &mut [Option<ChildOutcome>],
    now: DateTime<Utc>,
    channel: &str,
) -> Result<bool> {
    let op = "create_children";
    // A child whose step action the chunk run leases is inserted started and its step action
    // running (what a claim and `start_steps` would write, in this transaction); the rest
    // pending, for the runners.
    let run_by = crate::batch::run_by_of(specs, create);
    let held = match run_by {
        Some(_) => held_groups(&mut *conn).await?,
        None => HashSet::new(),
    };
    let leases = |c: &ChildSpec| crate::batch::started_by_run(c, run_by, &held);
    let mut refs = Vec::with_capacity(create.len());
    for &(at, _) in create {
        refs.push(
            serde_json::to_string(&specs[at].input_refs)
                .map_err(|e| Error::invalid("input_refs", e.to_string()))?,
        );
    }
    let made: Vec<(i64, i32)> = sqlx::query_as(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version, parent_id,
             child_index, created_at, updated_at, item_ref, sidecar)
         SELECT u.p, u.st, u.s, u.r::jsonb, '{}', 0, $1, w.idx, $2, $2, w.payload_ref,
                w.sidecar
         FROM UNNEST($3::int4[], $4::text[], $5::int4[], $6::text[], $7::text[]) WITH ORDINALITY
              AS u(i, p, s, r, st, n)
         JOIN dockhand_worklist w ON w.parent_id = $1 AND w.idx = u.i
         ORDER BY u.n
         ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
         RETURNING id, child_index",
    )
    .bind(parent)
    .bind(ts(now))
    .bind(
        create
            .iter()
            .map(|&(at, _)| specs[at].idx)
            .collect::<Vec<_>>(),
    )
    .bind(
        create
            .iter()
            .map(|&(at, _)| specs[at].pipeline.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        create
            .iter()
            .map(|&(at, _)| specs[at].step_index)
            .collect::<Vec<_>>(),
    )
    .bind(&refs)
    .bind(
        create
            .iter()
            .map(|&(at, _)| {
                if leases(&specs[at]) {
                    "processing"
                } else {
                    "pending"
                }
            })
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?;
    let ids: HashMap<i32, i64> = made.into_iter().map(|(id, idx)| (idx, id)).collect();
    if ids.len() != create.len() {
        return Err(Error::Config(format!(
            "job {parent}: {} children inserted for {} rows",
            ids.len(),
            create.len()
        )));
    }
    let (mut tokens, mut owners, mut ttls) = (Vec::new(), Vec::new(), Vec::new());
    let (mut done, mut children) = (Vec::new(), Vec::new());
    for (at, held) in create {
        let c = &specs[*at];
        let child = ids[&c.idx];
        outcomes[*at] = Some(ChildOutcome::Created(child));
        done.push(c.idx);
        children.push(child);
        for t in held {
            tokens.push(t.as_str());
            owners.push(child);
            ttls.push(c.claim_ttl.num_milliseconds());
        }
    }
    if !tokens.is_empty() {
        sqlx::query(HAND_OVER_CLAIMS)
            .bind(&tokens)
            .bind(ts(now))
            .bind(&owners)
            .bind(&ttls)
            .bind(parent)
            .execute(&mut *conn)
            .await
            .map_err(Error::db("create_children (claims)"))?;
    }
    sqlx::query(
        "UPDATE dockhand_worklist w
         SET state = 'completed', child_id = m.child, lease_owner = NULL, lease_until = NULL
         FROM UNNEST($2::int4[], $3::int8[]) AS m(idx, child)
         WHERE w.parent_id = $1 AND w.idx = m.idx",
    )
    .bind(parent)
    .bind(&done)
    .bind(&children)
    .execute(&mut *conn)
    .await
    .map_err(Error::db("create_children (worklist)"))?;
    let (mut pending, mut running) = (Vec::new(), Vec::new());
    for (at, _) in create {
        let c = &specs[*at];
        let a = c.step.action(ids[&c.idx], c.step_index, now);
        if leases(c) {
            running.push(a);
        } else {
            pending.push(a);
        }
    }
    if !pending.is_empty() {
        enqueue_fresh(&mut *conn, &pending, now, Some(channel)).await?;
    }
    let leased = match run_by {
        Some(by) if !running.is_empty() => insert_running(&mut *conn, &running, by, now).await?,
        _ => HashMap::new(),
    };
    if leased.len() != running.len() {
        // A started child without its running step action: the caller goes row by row.
        return Err(Error::Config(format!(
            "job {parent}: {} of {} started children's step actions inserted",
            leased.len(),
            running.len()
        )));
    }
    // The parent row's only write, last: until here the transaction holds the parent in key
    // share mode, which the children's counter updates do not wait for (module docs).
    sqlx::query("UPDATE dockhand_jobs SET children_total = children_total + $2 WHERE id = $1")
        .bind(parent)
        .bind(create.len() as i64)
        .execute(&mut *conn)
        .await
        .map_err(Error::db("create_children (parent)"))?;
    // Every running one is leased (checked above): only a pending one can need a wake-up.
    Ok(crate::batch::apply_leases(
        specs, create, &ids, &leased, outcomes, &pending, now,
    ))
}

/// The groups whose actions a chunk run may not lease (paused or limited: they stay pending
/// for the runners, as a claim would leave them).
async fn held_groups(conn: &mut PgConnection) -> Result<HashSet<String>> {
    Ok(sqlx::query_scalar(
        "SELECT group_name FROM dockhand_group_pauses
         UNION SELECT group_name FROM dockhand_group_limits",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("create_children (held groups)"))?
    .into_iter()
    .collect())
}

/// Inserts the step actions of children the chunk run leases as a claim leaves an action
/// (running, token 1, attempt 1, the `started` entry in the row; `started_after` 0: a new
/// action has no log entry); the leases by unique key. A conflicting leftover inserts
/// nothing for its key.
async fn insert_running(
    conn: &mut PgConnection,
    actions: &[crate::action::PreparedAction],
    by: &RunBy,
    now: DateTime<Utc>,
) -> Result<HashMap<String, Lease>> {
    let rows: Vec<(i64, String, i64)> = bind_unnested(
        sqlx::query_as(concat!(
            "INSERT INTO dockhand_actions
                (hook, args, group_name, priority, status, scheduled_at, max_attempts,
                 timeout_ms, unique_key, created_at, lease_owner, lease_token, lease_until,
                 attempt, started_at, started_by, started_after)
             SELECT t.hook, t.args::jsonb, t.group_name, t.priority, 'running', t.scheduled_at,
                    t.max_attempts, t.timeout_ms, t.unique_key, $9, $10, 1, $11, 1, $9, $10, 0 ",
            unnested_actions_sql!(),
            " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                 AND status IN ('pending', 'running')
             DO NOTHING
             RETURNING id, unique_key, lease_token"
        )),
        actions,
    )
    .bind(ts(now))
    .bind(&by.owner)
    .bind(ts(by.lease_until))
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db("create_children (running step actions)"))?;
    Ok(rows
        .into_iter()
        .map(|(id, key, token)| (key, Lease { id, token }))
        .collect())
}
