//! SQLite: a chunk's children created set-based ([`crate::Store::create_children`]). One
//! `BEGIN IMMEDIATE` transaction under the chunk run's fence reads the chunk's existing
//! children, worklist rows and held claims with one statement each, decides every row as
//! [`super::batch::create_child`] would (adopt, discard because the batch stopped or a claim
//! was lost, or create), then writes the new children with one statement per table: the jobs
//! (from their worklist rows), the claim hand-over, the rows marked completed, the parent's
//! `children_total` and the step actions. Children the chunk run runs itself
//! ([`ChildSpec::run_by`]) are inserted started (`processing`) with their step actions
//! `running` under its lease, unless their group is paused or limited. Any error rolls the
//! whole chunk back; the caller then goes row by row. The statements are driven by the chunk's
//! rows (a `CROSS JOIN` keeps `json_each` outside), never by the parent's whole worklist.
//! Claims are found by token (`INDEXED BY`, migration 0015), not among the parent's claims,
//! which may be every item of the batch.

use super::batch::{discard_row, refusal};
use super::lease_fence::run_fence;
use super::one_row::decode;
use super::{ms, SqliteStore};
use crate::batch::{sidecar_text_is_malformed, ChildOutcome, ChildSpec, DiscardCause};
use crate::error::{Error, Result};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use std::collections::{HashMap, HashSet};

/// Bound parameters per step action; chunks stay under SQLite's 32,766-parameter limit.
const PARAMS_PER_ACTION: usize = 17;
const MAX_PARAMS: usize = 32_000;

pub(super) async fn create_children(
    store: &SqliteStore,
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
    let mut tx = store.begin_write(op).await?;
    if let Err(e) = run_fence(&mut tx, chunk, op).await {
        tx.rollback().await.map_err(Error::db(op))?;
        return Err(e);
    }
    match create_in_tx(&mut tx, parent, specs, now).await {
        Ok((outcomes, due)) => {
            tx.commit().await.map_err(Error::db(op))?;
            if due {
                store.wake.notify();
            }
            Ok(outcomes)
        }
        Err(e) => {
            tx.rollback().await.map_err(Error::db(op))?;
            Err(e)
        }
    }
}

/// The rows' decisions and writes on the open transaction; true when a due step action was
/// enqueued.
async fn create_in_tx(
    tx: &mut SqliteConnection,
    parent: i64,
    specs: &[ChildSpec],
    now: DateTime<Utc>,
) -> Result<(Vec<ChildOutcome>, bool)> {
    let op = "create_children";
    let idxs = json!(specs.iter().map(|c| c.idx).collect::<Vec<_>>()).to_string();
    let existing: HashMap<i32, i64> = sqlx::query_as(
        "SELECT child_index, id FROM dockhand_jobs
         WHERE parent_id = ? AND child_index IN (SELECT value FROM json_each(?))",
    )
    .bind(parent)
    .bind(&idxs)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?
    .into_iter()
    .collect();
    let parent_row: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT status, batch_outcome FROM dockhand_jobs WHERE id = ?")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db(op))?;
    // The chunk's rows and the claims it hands over, each read as one row (see `one_row`).
    let rows: String = sqlx::query_scalar(
        "SELECT json_group_array(json_array(idx, state, sidecar)) FROM dockhand_worklist
         WHERE parent_id = ? AND idx IN (SELECT value FROM json_each(?))",
    )
    .bind(parent)
    .bind(&idxs)
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let rows: HashMap<i32, (String, String)> =
        decode::<Vec<(i32, String, String)>>(&rows, "worklist rows")?
            .into_iter()
            .map(|(idx, state, sidecar)| (idx, (state, sidecar)))
            .collect();
    let all_tokens: Vec<&String> = specs.iter().flat_map(|c| &c.claim_tokens).collect();
    // The claims still the parent's; the check holds since this is the one writer. A token
    // handed to an earlier row of this call is no longer the parent's for a later one.
    let held: String = sqlx::query_scalar(
        "SELECT json_group_array(token)
         FROM dockhand_item_claims INDEXED BY dockhand_item_claims_token
         WHERE job_id = ? AND status = 'claimed' AND token IN (SELECT value FROM json_each(?))",
    )
    .bind(parent)
    .bind(json!(all_tokens).to_string())
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let mut held: HashSet<String> = decode(&held, "claim tokens")?;
    let mut outcomes: Vec<Option<ChildOutcome>> = vec![None; specs.len()];
    let mut create: Vec<(usize, Vec<&String>)> = Vec::new();
    for (at, c) in specs.iter().enumerate() {
        let idx = c.idx;
        if let Some(&child) = existing.get(&idx) {
            sqlx::query(
                "UPDATE dockhand_worklist
                 SET state = 'completed', child_id = ?1, lease_owner = NULL, lease_until = NULL
                 WHERE parent_id = ?2 AND idx = ?3
                   AND (state <> 'completed' OR child_id IS NOT ?1)",
            )
            .bind(child)
            .bind(parent)
            .bind(idx)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(op))?;
            outcomes[at] = Some(ChildOutcome::Adopted(child));
            continue;
        }
        let row = rows.get(&idx);
        let stopped = refusal(
            parent,
            idx,
            parent_row.as_ref().map(|p| p.0.as_str()),
            parent_row.as_ref().and_then(|p| p.1.as_deref()),
            row.map(|r| r.0.as_str()),
        )?;
        let malformed = row.is_some_and(|r| sidecar_text_is_malformed(&r.1));
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
        if let Some((cause, error)) = discard {
            discard_row(&mut *tx, parent, idx, &error, 0, malformed, op).await?;
            // Discarding releases what the parent still held of the row's claims.
            for t in &tokens {
                held.remove(t.as_str());
            }
            outcomes[at] = Some(ChildOutcome::Discarded(cause));
            continue;
        }
        for t in &tokens {
            held.remove(t.as_str());
        }
        create.push((at, tokens));
    }
    let mut due = false;
    if !create.is_empty() {
        due = insert_children(&mut *tx, parent, specs, &create, &mut outcomes, now).await?;
    }
    let outcomes = outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| Error::Config(format!("job {parent}: a row got no outcome"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((outcomes, due))
}

/// The groups whose actions a chunk run may not lease (paused or limited: they stay pending
/// for the runners, as a claim would leave them).
async fn held_groups(tx: &mut SqliteConnection) -> Result<HashSet<String>> {
    Ok(sqlx::query_scalar(
        "SELECT group_name FROM dockhand_group_pauses
         UNION SELECT group_name FROM dockhand_group_limits",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("create_children (held groups)"))?
    .into_iter()
    .collect())
}

/// Inserts the children of `create` (spec position, its claim tokens) with their hand-overs,
/// rows, counter and step actions; fills their outcomes. True when a step action is due.
async fn insert_children(
    tx: &mut SqliteConnection,
    parent: i64,
    specs: &[ChildSpec],
    create: &[(usize, Vec<&String>)],
    outcomes: &mut [Option<ChildOutcome>],
    now: DateTime<Utc>,
) -> Result<bool> {
    let op = "create_children";
    // A child whose step action the chunk run leases is inserted started and its step action
    // running (what a claim and `start_steps` would write, in this transaction); the rest
    // pending, for the runners.
    let run_by = crate::batch::run_by_of(specs, create);
    let held = match run_by {
        Some(_) => held_groups(&mut *tx).await?,
        None => HashSet::new(),
    };
    let leases = |c: &ChildSpec| crate::batch::started_by_run(c, run_by, &held);
    let mut wanted = Vec::with_capacity(create.len());
    for &(at, _) in create {
        let c = &specs[at];
        let refs = serde_json::to_string(&c.input_refs)
            .map_err(|e| Error::invalid("input_refs", e.to_string()))?;
        let status = if leases(c) { "processing" } else { "pending" };
        wanted
            .push(json!({"i": c.idx, "p": c.pipeline, "s": c.step_index, "r": refs, "st": status}));
    }
    // The insert, then its ids read as one row (see `one_row`; `RETURNING` answers a row per
    // message), in one batch: sqlx binds a batch's `?NNN` per statement and stops at a gap, so
    // both statements use `?1` and `?2` (the insert also `?3`).
    let made: Vec<String> = sqlx::query_scalar(
        "INSERT INTO dockhand_jobs
            (pipeline, status, step_index, input_refs, engine_data, engine_version, parent_id,
             child_index, created_at, updated_at, item_ref, sidecar)
         SELECT json_extract(j.value, '$.p'), json_extract(j.value, '$.st'),
                json_extract(j.value, '$.s'),
                json_extract(j.value, '$.r'), '{}', 0, ?1, w.idx, ?3, ?3, w.payload_ref,
                w.sidecar
         FROM json_each(?2) j
         CROSS JOIN dockhand_worklist w
         WHERE w.parent_id = ?1 AND w.idx = json_extract(j.value, '$.i')
         ORDER BY j.key;
         SELECT json_group_array(json_array(id, child_index)) FROM dockhand_jobs
         WHERE parent_id = ?1
           AND child_index IN (SELECT json_extract(value, '$.i') FROM json_each(?2))",
    )
    .bind(parent)
    .bind(json!(wanted).to_string())
    .bind(ms(now))
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    let made: Vec<(i64, i32)> = match made.as_slice() {
        [one] => decode(one, "children")?,
        _ => Vec::new(),
    };
    let ids: HashMap<i32, i64> = made.into_iter().map(|(id, idx)| (idx, id)).collect();
    if ids.len() != create.len() {
        return Err(Error::Config(format!(
            "job {parent}: {} children inserted for {} rows",
            ids.len(),
            create.len()
        )));
    }
    let mut handover = Vec::new();
    let mut done = Vec::with_capacity(create.len());
    for (at, tokens) in create {
        let c = &specs[*at];
        let child = ids[&c.idx];
        outcomes[*at] = Some(ChildOutcome::Created(child));
        done.push(c.idx);
        for t in tokens {
            handover.push(json!([t, child, c.claim_ttl.num_milliseconds()]));
        }
    }
    if !handover.is_empty() {
        sqlx::query(
            "UPDATE dockhand_item_claims INDEXED BY dockhand_item_claims_token
             SET job_id = m.child, expires_at = ?2 + COALESCE(dockhand_item_claims.ttl_ms, m.ttl)
             FROM (SELECT json_extract(value, '$[0]') AS token,
                          json_extract(value, '$[1]') AS child,
                          json_extract(value, '$[2]') AS ttl
                   FROM json_each(?1)) AS m
             WHERE dockhand_item_claims.token = m.token
               AND dockhand_item_claims.job_id = ?3
               AND dockhand_item_claims.status = 'claimed'",
        )
        .bind(json!(handover).to_string())
        .bind(ms(now))
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("create_children (claims)"))?;
    }
    sqlx::query(
        "UPDATE dockhand_worklist
         SET state = 'completed', lease_owner = NULL, lease_until = NULL,
             child_id = (SELECT j.id FROM dockhand_jobs j
                         WHERE j.parent_id = ?1 AND j.child_index = dockhand_worklist.idx)
         WHERE parent_id = ?1 AND idx IN (SELECT value FROM json_each(?2))",
    )
    .bind(parent)
    .bind(json!(done).to_string())
    .execute(&mut *tx)
    .await
    .map_err(Error::db(op))?;
    sqlx::query("UPDATE dockhand_jobs SET children_total = children_total + ? WHERE id = ?")
        .bind(create.len() as i64)
        .bind(parent)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(op))?;
    let actions: Vec<_> = create
        .iter()
        .map(|(at, _)| {
            let c = &specs[*at];
            (c.step.action(ids[&c.idx], c.step_index, now), leases(c))
        })
        .collect();
    let mut leased = HashMap::new();
    let (now_ms, owner) = (ms(now), run_by.map(|b| b.owner.as_str()));
    let until = run_by.map(|b| ms(b.lease_until));
    for part in actions.chunks(MAX_PARAMS / PARAMS_PER_ACTION) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO dockhand_actions (hook, args, group_name, priority, status,
             scheduled_at, max_attempts, timeout_ms, unique_key, created_at, lease_owner,
             lease_token, lease_until, attempt, started_at, started_by, started_after) ",
        );
        qb.push_values(part, |mut b, (a, run)| {
            // A leased one as a claim leaves it: running, token 1, attempt 1, the `started`
            // entry in the row (`started_after` 0: a new action has no log entry).
            let run = *run;
            b.push_bind(&a.hook)
                .push_bind(&a.args_json)
                .push_bind(&a.group)
                .push_bind(a.priority)
                .push_bind(if run { "running" } else { "pending" })
                .push_bind(ms(a.scheduled_at))
                .push_bind(a.max_attempts)
                .push_bind(a.timeout_ms)
                .push_bind(&a.unique_key)
                .push_bind(now_ms)
                .push_bind(owner.filter(|_| run))
                .push_bind(i64::from(run))
                .push_bind(until.filter(|_| run))
                .push_bind(i64::from(run))
                .push_bind(run.then_some(now_ms))
                .push_bind(owner.filter(|_| run))
                .push_bind(run.then_some(0_i64));
        });
        // A fresh child has no active step action; a conflict could only be a leftover.
        qb.push(
            " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
              AND status IN ('pending', 'running') DO NOTHING
              RETURNING id, unique_key, lease_token",
        );
        let rows = qb
            .build_query_as::<(i64, String, i64)>()
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("create_children (step actions)"))?;
        for (id, key, token) in rows {
            if token > 0 {
                leased.insert(key, Lease { id, token });
            }
        }
    }
    let started = actions.iter().filter(|(_, run)| *run).count();
    if leased.len() != started {
        // A started child without its running step action: the caller goes row by row.
        return Err(Error::Config(format!(
            "job {parent}: {} of {started} started children's step actions inserted",
            leased.len()
        )));
    }
    let actions: Vec<_> = actions.into_iter().map(|(a, _)| a).collect();
    Ok(crate::batch::apply_leases(
        specs, create, &ids, &leased, outcomes, &actions, now,
    ))
}
