//! MySQL: a chunk's children created set-based ([`crate::Store::create_children`]). One
//! transaction under the chunk run's fence reads the parent, locks the chunk's worklist rows
//! and the claims they hand over, reads the children that exist, decides every row as
//! [`super::batch::create_child`] would (adopt, discard because the batch stopped or a claim
//! was lost, or create), then writes the new children with multi-row statements: the jobs
//! (`INSERT … SELECT` joining the specs to their worklist rows; ids read back by child index,
//! MySQL 8 has no `RETURNING`), the claim hand-over (an `UPDATE … JOIN` by the primary keys of
//! the claims locked by token), the rows marked completed, the step actions (one multi-row
//! insert; a fresh child's unique key is free; the children the chunk run runs itself
//! inserted started with their step actions running under its lease, unless their group is
//! paused or limited, and those actions' `started` log rows), and last the parent's
//! `children_total`, which is when the parent's row lock is taken ([`ParentLock`]). Any error
//! rolls the whole chunk back; the caller then goes row by row. A deadlock re-runs the
//! transaction.

use super::batch::{discard_row, push_token_in, refusal};
use super::claim::push_in;
use super::connect::retry_deadlocks;
use super::fence::{job_status, read_parent, TOKENS_PER_STATEMENT};
use super::jobs::text;
use super::lease_fence::run_fence;
use super::{ms, MySqlStore};
use crate::batch::{ChildOutcome, ChildSpec, DiscardCause, RunBy};
use crate::error::{Error, Result};
use crate::store::Lease;
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use std::collections::{HashMap, HashSet};

/// Rows per multi-row statement (at most 10 parameters each, under MySQL's 65,535).
const ROWS_PER_STATEMENT: usize = 1_000;

pub(super) async fn create_children(
    store: &MySqlStore,
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
    let mut refs = Vec::with_capacity(specs.len());
    for c in specs {
        refs.push(
            serde_json::to_string(&c.input_refs)
                .map_err(|e| Error::invalid("input_refs", e.to_string()))?,
        );
    }
    let refs = &refs;
    let (outcomes, due) = retry_deadlocks(op, move || async move {
        // The parent's lock last, then (when the parent was stopped or changed meanwhile)
        // first: see `ParentLock`.
        for lock in [ParentLock::Last, ParentLock::First] {
            let mut tx = store.begin(op).await?;
            let done = async {
                run_fence(&mut tx, chunk, op).await?;
                create_in_tx(&mut tx, parent, specs, refs, now, lock).await
            }
            .await;
            match done {
                Ok(Some(done)) => {
                    tx.commit().await.map_err(Error::db(op))?;
                    return Ok(done);
                }
                Ok(None) => {
                    tx.rollback().await.map_err(Error::db(op))?;
                }
                Err(e) => {
                    // Dropping the transaction rolls back if this fails too.
                    let _ = tx.rollback().await;
                    return Err(e);
                }
            }
        }
        Err(Error::Config(format!(
            "create_children: job {parent} changed under its row lock"
        )))
    })
    .await?;
    if due {
        store.wake.notify();
    }
    Ok(outcomes)
}

/// When `create_children` locks the parent row. InnoDB has no key-share mode: a parent locked
/// `FOR UPDATE` at the start (the lock order of `batch`) is held through the whole
/// transaction, and every child finishing meanwhile waits for it to bump the counters (~117 ms
/// each with four chunk lanes, session 16). So the first attempt reads the parent without a
/// lock, decides and writes the rows, and takes the parent's lock only with its one write to
/// it, `children_total`, which matches only while the parent is still live and unstopped as
/// read; if it is not (a stop or finish committed meanwhile) or was not at the read, the
/// attempt is rolled back and the transaction runs again with the parent locked first,
/// deciding as before (no child of a stopped batch). Taking the parent after the rows can
/// deadlock with a stop that locks it first and then scans the rows; InnoDB then rolls one
/// back and `retry_deadlocks` runs it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParentLock {
    /// Read it unlocked; lock it with the `children_total` write at the end.
    Last,
    /// Lock it `FOR UPDATE` before anything else.
    First,
}

/// The children of `parent` at `idxs` that exist, by child index.
async fn existing(
    conn: &mut MySqlConnection,
    parent: i64,
    idxs: &[i32],
) -> Result<HashMap<i32, i64>> {
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("SELECT child_index, id FROM dockhand_jobs WHERE parent_id = ");
    qb.push_bind(parent).push(" AND child_index");
    push_in(&mut qb, idxs);
    let rows = qb
        .build()
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db("create_children"))?;
    let mut out = HashMap::with_capacity(rows.len());
    for r in rows {
        let d = || Error::db("create_children");
        out.insert(
            r.try_get("child_index").map_err(d())?,
            r.try_get("id").map_err(d())?,
        );
    }
    Ok(out)
}

/// The rows' decisions and writes on the open transaction; true when a due step action was
/// enqueued. `None`: with [`ParentLock::Last`], the parent was stopped or final when read, or
/// changed before its lock was taken; the caller rolls back and runs it with the lock first.
async fn create_in_tx(
    conn: &mut MySqlConnection,
    parent: i64,
    specs: &[ChildSpec],
    refs: &[String],
    now: DateTime<Utc>,
    lock: ParentLock,
) -> Result<Option<(Vec<ChildOutcome>, bool)>> {
    let op = "create_children";
    let idxs: Vec<i32> = specs.iter().map(|c| c.idx).collect();
    // The parent's status decides below; see `ParentLock` for when it is locked.
    let parent_row = read_parent(conn, parent, lock == ParentLock::First, op).await?;
    if lock == ParentLock::Last {
        let live = match &parent_row {
            Some(p) => p.batch_outcome.is_none() && !job_status(parent, &p.status)?.is_final(),
            None => false,
        };
        if !live {
            return Ok(None);
        }
    }
    let existing = existing(conn, parent, &idxs).await?;
    let mut qb: QueryBuilder<MySql> =
        QueryBuilder::new("SELECT idx, state FROM dockhand_worklist WHERE parent_id = ");
    qb.push_bind(parent).push(" AND idx");
    push_in(&mut qb, &idxs);
    qb.push(" ORDER BY idx FOR UPDATE");
    let mut rows: HashMap<i32, String> = HashMap::new();
    for r in qb
        .build()
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::db(op))?
    {
        rows.insert(r.try_get("idx").map_err(Error::db(op))?, text(&r, "state")?);
    }
    let mut all_tokens: Vec<&String> = specs.iter().flat_map(|c| &c.claim_tokens).collect();
    all_tokens.sort_unstable();
    all_tokens.dedup();
    // The claims still the parent's, locked: no takeover slips in before the hand-over. A
    // token handed to an earlier row of this call is no longer the parent's for a later one.
    // The hand-over below updates them by primary key (`claim_ids`).
    let mut held: HashSet<String> = HashSet::new();
    let mut claim_ids: HashMap<String, i64> = HashMap::new();
    for part in all_tokens.chunks(TOKENS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("SELECT id, token FROM dockhand_item_claims WHERE job_id = ");
        qb.push_bind(parent).push(" AND status = 'claimed' AND ");
        push_token_in(&mut qb, part);
        qb.push(" ORDER BY token FOR UPDATE");
        for r in qb
            .build()
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(op))?
        {
            let token = text(&r, "token")?;
            claim_ids.insert(token.clone(), r.try_get("id").map_err(Error::db(op))?);
            held.insert(token);
        }
    }
    let mut outcomes: Vec<Option<ChildOutcome>> = vec![None; specs.len()];
    let mut create: Vec<(usize, Vec<i64>)> = Vec::new();
    for (at, c) in specs.iter().enumerate() {
        let idx = c.idx;
        if let Some(&child) = existing.get(&idx) {
            sqlx::query(
                "UPDATE dockhand_worklist
                 SET state = 'completed', child_id = ?, lease_owner = NULL, lease_until = NULL
                 WHERE parent_id = ? AND idx = ? AND NOT (state = 'completed' AND child_id <=> ?)",
            )
            .bind(child)
            .bind(parent)
            .bind(idx)
            .bind(child)
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
            outcomes[at] = Some(ChildOutcome::Adopted(child));
            continue;
        }
        let stopped = refusal(
            parent,
            idx,
            parent_row.as_ref(),
            rows.get(&idx).map(String::as_str),
        )?;
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
        // Every token of a row that gets its child was held, so locked above with its id.
        let mut claims = Vec::with_capacity(tokens.len());
        for t in &tokens {
            let Some(&claim) = claim_ids.get(t.as_str()) else {
                return Err(Error::Config(format!(
                    "job {parent}: a claim token of row {idx} is not among the locked claims"
                )));
            };
            claims.push(claim);
        }
        create.push((at, claims));
    }
    let mut due = false;
    if !create.is_empty() {
        due = insert_children(&mut *conn, parent, specs, refs, &create, &mut outcomes, now).await?;
        // The parent's one write, last: with `ParentLock::Last` it takes the lock here and
        // matches only while the parent is as it was read (live, not stopped).
        let mut qb = QueryBuilder::<MySql>::new(
            "UPDATE dockhand_jobs SET children_total = children_total + ",
        );
        qb.push_bind(create.len() as i64)
            .push(" WHERE id = ")
            .push_bind(parent);
        if lock == ParentLock::Last {
            qb.push(
                " AND batch_outcome IS NULL AND status IN ('pending', 'processing', 'waiting')",
            );
        }
        let done = qb
            .build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db("create_children (parent)"))?;
        if done.rows_affected() != 1 {
            if lock == ParentLock::Last {
                return Ok(None);
            }
            return Err(Error::Config(format!(
                "create_children: job {parent} changed under its row lock"
            )));
        }
    }
    let outcomes = outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| Error::Config(format!("job {parent}: a row got no outcome"))))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((outcomes, due)))
}

/// Inserts the children of `create` (spec position, the ids of the claims it takes over) with
/// their hand-overs,
/// rows, counter and step actions; fills their outcomes. True when a step action is due.
async fn insert_children(
    conn: &mut MySqlConnection,
    parent: i64,
    specs: &[ChildSpec],
    refs: &[String],
    create: &[(usize, Vec<i64>)],
    outcomes: &mut [Option<ChildOutcome>],
    now: DateTime<Utc>,
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
    for part in create.chunks(ROWS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "INSERT INTO dockhand_jobs
                (pipeline, status, step_index, input_refs, engine_data, engine_version,
                 parent_id, child_index, created_at, updated_at, item_ref, sidecar)
             SELECT u.p, u.st, u.s, u.r, '{}', 0, w.parent_id, w.idx, ",
        );
        qb.push_bind(ms(now))
            .push(", ")
            .push_bind(ms(now))
            .push(", w.payload_ref, w.sidecar FROM (");
        for (n, &(at, _)) in part.iter().enumerate() {
            let c = &specs[at];
            qb.push(if n == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            })
            .push_bind(c.idx)
            .push(" AS i, ")
            .push_bind(&c.pipeline)
            .push(" AS p, ")
            .push_bind(c.step_index)
            .push(" AS s, ")
            .push_bind(&refs[at])
            .push(" AS r, ")
            .push_bind(if leases(c) { "processing" } else { "pending" })
            .push(" AS st, ")
            .push_bind(n as i64)
            .push(" AS n");
        }
        qb.push(") u JOIN dockhand_worklist w ON w.parent_id = ")
            .push_bind(parent)
            .push(" AND w.idx = u.i ORDER BY u.n");
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
    }
    let made: Vec<i32> = create.iter().map(|&(at, _)| specs[at].idx).collect();
    let ids = existing(conn, parent, &made).await?;
    if ids.len() != create.len() {
        return Err(Error::Config(format!(
            "job {parent}: {} children inserted for {} rows",
            ids.len(),
            create.len()
        )));
    }
    let mut handover: Vec<(i64, i64, i64)> = Vec::new();
    for (at, claims) in create {
        let c = &specs[*at];
        let child = ids[&c.idx];
        outcomes[*at] = Some(ChildOutcome::Created(child));
        for &claim in claims {
            handover.push((claim, child, c.claim_ttl.num_milliseconds()));
        }
    }
    for part in handover.chunks(ROWS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new("UPDATE dockhand_item_claims c JOIN (");
        for (n, (claim, child, ttl)) in part.iter().enumerate() {
            qb.push(if n == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            })
            .push_bind(*claim)
            .push(" AS id, ")
            .push_bind(*child)
            .push(" AS child, ")
            .push_bind(*ttl)
            .push(" AS ttl");
        }
        qb.push(") m ON c.id = m.id SET c.job_id = m.child, c.expires_at = ")
            .push_bind(ms(now))
            .push(" + COALESCE(c.ttl_ms, m.ttl) WHERE c.job_id = ")
            .push_bind(parent)
            .push(" AND c.status = 'claimed'");
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db("create_children (claims)"))?;
    }
    let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
        "UPDATE dockhand_worklist w JOIN dockhand_jobs j
            ON j.parent_id = w.parent_id AND j.child_index = w.idx
         SET w.state = 'completed', w.child_id = j.id, w.lease_owner = NULL,
             w.lease_until = NULL
         WHERE w.parent_id = ",
    );
    qb.push_bind(parent).push(" AND w.idx");
    push_in(&mut qb, &made);
    qb.build()
        .execute(&mut *conn)
        .await
        .map_err(Error::db("create_children (worklist)"))?;
    let actions: Vec<_> = create
        .iter()
        .map(|(at, _)| {
            let c = &specs[*at];
            (c.step.action(ids[&c.idx], c.step_index, now), leases(c))
        })
        .collect();
    let owner = run_by.map(|b| b.owner.as_str());
    let until = run_by.map(|b| ms(b.lease_until));
    for part in actions.chunks(ROWS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "INSERT INTO dockhand_actions
                (hook, args, group_name, priority, status, scheduled_at, max_attempts,
                 timeout_ms, unique_key, active_key, created_at, lease_owner, lease_token,
                 lease_until, attempt, started_at) ",
        );
        qb.push_values(part, |mut b, (a, run)| {
            // A leased one as a claim leaves it: running, token 1, attempt 1 (its `started`
            // log row below).
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
                .push_bind(a.unique_key.as_deref().map(str::as_bytes))
                .push_bind(ms(now))
                .push_bind(owner.filter(|_| run))
                .push_bind(i64::from(run))
                .push_bind(until.filter(|_| run))
                .push_bind(i64::from(run))
                .push_bind(run.then_some(ms(now)));
        });
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db("create_children (step actions)"))?;
    }
    let running: Vec<&str> = actions
        .iter()
        .filter(|(_, run)| *run)
        .filter_map(|(a, _)| a.unique_key.as_deref())
        .collect();
    let leased = match run_by {
        Some(by) if !running.is_empty() => log_started(&mut *conn, &running, by, now).await?,
        _ => HashMap::new(),
    };
    if leased.len() != running.len() {
        return Err(Error::Config(format!(
            "job {parent}: {} of {} started children's step actions found",
            leased.len(),
            running.len()
        )));
    }
    let actions: Vec<_> = actions.into_iter().map(|(a, _)| a).collect();
    Ok(crate::batch::apply_leases(
        specs, create, &ids, &leased, outcomes, &actions, now,
    ))
}

/// The groups whose actions a chunk run may not lease (paused or limited: they stay pending
/// for the runners, as a claim would leave them). A plain read: it takes no locks (a locking
/// read also locked what it read of the pause and limit tables, and concurrent chunks waited
/// on each other there, ~50 ms per chunk on MariaDB).
async fn held_groups(conn: &mut MySqlConnection) -> Result<HashSet<String>> {
    let op = "create_children (held groups)";
    sqlx::query(
        "SELECT group_name FROM dockhand_group_pauses
         UNION SELECT group_name FROM dockhand_group_limits",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::db(op))?
    .iter()
    .map(|r| text(r, "group_name"))
    .collect()
}

/// The step actions this transaction inserted running under `by`'s lease (by unique key,
/// `keys`): their ids read back by active key, and their `started` log rows written as a
/// claim writes them; the leases by unique key.
async fn log_started(
    conn: &mut MySqlConnection,
    keys: &[&str],
    by: &RunBy,
    now: DateTime<Utc>,
) -> Result<HashMap<String, Lease>> {
    let op = "create_children (started step actions)";
    let mut leased = HashMap::with_capacity(keys.len());
    for part in keys.chunks(ROWS_PER_STATEMENT) {
        let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
            "SELECT id, unique_key, lease_token FROM dockhand_actions
             WHERE status = 'running' AND active_key IN (",
        );
        let mut sep = qb.separated(", ");
        for k in part {
            sep.push_bind(k.as_bytes().to_vec());
        }
        qb.push(") AND lease_owner = ").push_bind(&by.owner);
        let mut ids = Vec::with_capacity(part.len());
        for r in qb
            .build()
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(op))?
        {
            let id: i64 = r.try_get("id").map_err(Error::db(op))?;
            let token: i64 = r.try_get("lease_token").map_err(Error::db(op))?;
            leased.insert(text(&r, "unique_key")?, Lease { id, token });
            ids.push(id);
        }
        if ids.is_empty() {
            continue;
        }
        let mut qb: QueryBuilder<MySql> =
            QueryBuilder::new("INSERT INTO dockhand_action_logs (action_id, at, event, detail) ");
        qb.push_values(&ids, |mut b, id| {
            b.push_bind(*id)
                .push_bind(ms(now))
                .push("'started'")
                .push_bind(&by.owner);
        });
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(Error::db(op))?;
    }
    Ok(leased)
}
