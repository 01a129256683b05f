#!/usr/bin/env python3
"""SQLite's own floor for W4 against W2, on dockhand's real schema (docs/BENCHMARKS.md, session 23).

usage: python3 docs/w4_floor.py DB  (DB: a file migrated by `dockhand --database-url sqlite:DB migrate`;
the script writes into copies of it and deletes them)

Plays the rows each design writes, set-based, one transaction per store call as dockhand makes
them, with Python's sqlite3 (WAL, synchronous = NORMAL), no dockhand code in the loop:
- W2: N pending actions claimed and completed in rounds of 264 (claim + completion of the
  previous round in one transaction, as the runner's rounds do);
- W4 as B2 builds it today: per chunk of 100 items, the worklist lease; the children's job rows
  (inserted started), claim hand-over, worklist completion and step actions (inserted running
  under the chunk's lease; session 24); their finishes (step actions completed, claims
  processed, jobs completed, events written delivered, parent counters); the chunk action
  completed and the next one enqueued;
- W4 with a child that is its worklist row (the proposed B2/J4 change): per chunk, the lease;
  then the rows completed, the claims processed and the parent counters; the chunk actions.
The claim step's claims, the packets and the worklist (identical in both designs; one
transaction, set-based) are written before the timer in the first columns ("children only"), and
inside it in the last ones ("from job start", as `dockhand bench` times W4: from `Jobs::start` to
the parent final), with "seed alone" their own rate (session 24).
"""
import os, shutil, sqlite3, sys, time

N, CHUNK, ROUND = 10_000, 100, 264


def connect(path):
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = NORMAL")
    return c


def tx(c, f):
    c.execute("BEGIN IMMEDIATE")
    f()
    c.execute("COMMIT")


def seed_items(c):
    def f():
        c.execute("INSERT INTO dockhand_jobs (pipeline, status, created_at, updated_at, batch_state)"
                  " VALUES ('w4', 'processing', 1, 1, 'scheduling')")
        c.executemany("INSERT INTO dockhand_item_claims (identity_hash, scope, source_type, item_id,"
                      " status, token, job_id, claimed_at, expires_at) VALUES (?, 'shared:b', 'b', ?,"
                      " 'claimed', ?, 1, 1, 999999999)",
                      [(f"h{i}", f"item-{i}", f"t{i}") for i in range(N)])
        c.executemany("INSERT INTO dockhand_packets (hash, body, created_at) VALUES (?, ?, 1)",
                      [(f"p{i:064}", '{"n": %d}' % i) for i in range(N)])
        c.executemany("INSERT INTO dockhand_worklist (parent_id, idx, payload_ref, sidecar)"
                      " VALUES (1, ?, ?, ?)",
                      [(i, f"v1:p{i:064}", '[{"token": "t%d"}]' % i) for i in range(N)])
    tx(c, f)


def chunk_action(c, k):
    c.execute("UPDATE dockhand_actions SET status = 'complete', finished_at = 2"
              " WHERE id = (SELECT MAX(id) FROM dockhand_actions WHERE hook = 'dockhand.batch.chunk')"
              " AND status = 'running'")
    c.execute("INSERT INTO dockhand_actions (hook, args, status, scheduled_at, created_at, lease_owner,"
              " lease_until, attempt, max_attempts) VALUES ('dockhand.batch.chunk', ?, 'running', 1, 1,"
              " 'w', 9, 1, 3)",
              ('{"parent": 1, "offset": %d}' % (k + CHUNK),))


def w4_today(c):
    for k in range(0, N, CHUNK):
        idx = list(range(k, k + CHUNK))
        tx(c, lambda: c.executemany("UPDATE dockhand_worklist SET state = 'leased', lease_owner = 'w',"
                                    " lease_until = 9 WHERE parent_id = 1 AND idx = ?", [(i,) for i in idx]))
        ids, steps = [], []

        def create():
            for i in idx:
                cur = c.execute("INSERT INTO dockhand_jobs (pipeline, status, step_index, input_refs,"
                                " parent_id, child_index, created_at, updated_at) VALUES ('w4',"
                                " 'processing', 1, ?, 1, ?, 1, 1)", (f'["v1:p{i:064}"]', i))
                ids.append(cur.lastrowid)
            c.executemany("UPDATE dockhand_item_claims INDEXED BY dockhand_item_claims_token"
                          " SET job_id = ?, expires_at = 99999 WHERE token = ?"
                          " AND job_id = 1 AND status = 'claimed'", [(j, f"t{i}") for j, i in zip(ids, idx)])
            c.executemany("UPDATE dockhand_worklist SET state = 'completed', child_id = ?, lease_owner ="
                          " NULL WHERE parent_id = 1 AND idx = ?", list(zip(ids, idx)))
            for j in ids:
                steps.append(c.execute(
                    "INSERT INTO dockhand_actions (hook, args, status, scheduled_at, created_at,"
                    " unique_key, max_attempts, lease_owner, lease_token, lease_until, attempt,"
                    " started_at, started_by, started_after) VALUES ('dockhand.job.step', ?,"
                    " 'running', 1, 1, ?, 3, 'w', 1, 9, 1, 1, 'w', 0)",
                    ('{"job": %d, "step": 1}' % j, f"j:{j}:1")).lastrowid)
            c.execute("UPDATE dockhand_jobs SET children_total = children_total + ? WHERE id = 1", (CHUNK,))
        tx(c, create)

        def finish():
            c.executemany("UPDATE dockhand_actions SET status = 'complete', finished_at = 2,"
                          " lease_owner = NULL, lease_until = NULL WHERE id = ? AND status ="
                          " 'running'", [(a,) for a in steps])
            c.executemany("UPDATE dockhand_item_claims SET status = 'processed', processed_at = 2,"
                          " token = NULL WHERE job_id = ? AND status = 'claimed'", [(j,) for j in ids])
            c.executemany("UPDATE dockhand_jobs SET status = 'completed', finished_at = 2 WHERE id = ?"
                          " AND status = 'processing'", [(j,) for j in ids])
            c.executemany("INSERT INTO dockhand_job_events (job_id, status, created_at, delivered_at)"
                          " VALUES (?, 'completed', 2, 2)", [(j,) for j in ids])
            c.execute("UPDATE dockhand_jobs SET children_terminal = children_terminal + ?,"
                      " children_completed = children_completed + ? WHERE id = 1", (CHUNK, CHUNK))
        tx(c, finish)
        tx(c, lambda: chunk_action(c, k))


def w4_worklist_child(c):
    for k in range(0, N, CHUNK):
        idx = list(range(k, k + CHUNK))
        tx(c, lambda: c.executemany("UPDATE dockhand_worklist SET state = 'leased', lease_owner = 'w',"
                                    " lease_until = 9 WHERE parent_id = 1 AND idx = ?", [(i,) for i in idx]))

        def finish():
            c.executemany("UPDATE dockhand_worklist SET state = 'completed', lease_owner = NULL"
                          " WHERE parent_id = 1 AND idx = ?", [(i,) for i in idx])
            c.executemany("UPDATE dockhand_item_claims SET status = 'processed', processed_at = 2,"
                          " token = NULL WHERE token = ? AND status = 'claimed'", [(f"t{i}",) for i in idx])
            c.execute("UPDATE dockhand_jobs SET children_total = children_total + ?, children_terminal ="
                      " children_terminal + ?, children_completed = children_completed + ? WHERE id = 1",
                      (CHUNK, CHUNK, CHUNK))
        tx(c, finish)
        tx(c, lambda: chunk_action(c, k))


def w2(c):
    tx(c, lambda: c.executemany("INSERT INTO dockhand_actions (hook, args, status, scheduled_at,"
                                " created_at, max_attempts) VALUES ('bench.noop', ?, 'pending', 1, 1,"
                                " 3)",
                                [('{"n": %d}' % i,) for i in range(N)]))
    start = time.perf_counter()
    prev = []
    while True:
        def rnd():
            nonlocal prev
            c.executemany("UPDATE dockhand_actions SET status = 'complete', finished_at = 2,"
                          " lease_owner = NULL, lease_until = NULL WHERE id = ? AND status = 'running'",
                          [(i,) for i in prev])
            prev = [r[0] for r in c.execute(
                "UPDATE dockhand_actions SET status = 'running', lease_owner = 'w', lease_token ="
                " lease_token + 1, lease_until = 9, attempt = attempt + 1 WHERE id IN (SELECT id FROM"
                " dockhand_actions WHERE status = 'pending' ORDER BY priority, scheduled_at, id LIMIT ?)"
                " RETURNING id", (ROUND,))]
        tx(c, rnd)
        if not prev:
            break
    return N / (time.perf_counter() - start)


def timed(src, f, seed, seed_timed=False):
    path = src + ".floor"
    for ext in ("", "-wal", "-shm"):
        if os.path.exists(path + ext):
            os.remove(path + ext)
    shutil.copy(src, path)
    c = connect(path)
    try:
        if seed:
            start = time.perf_counter()
            seed_items(c)
            if not seed_timed:
                start = time.perf_counter()
            if f:
                f(c)
            return N / (time.perf_counter() - start)
        return f(c)
    finally:
        c.close()
        for ext in ("", "-wal", "-shm"):
            if os.path.exists(path + ext):
                os.remove(path + ext)


if __name__ == "__main__":
    src = sys.argv[1]
    for rep in range(3):
        a = timed(src, w2, False)
        b = timed(src, w4_today, True)
        d = timed(src, w4_worklist_child, True)
        s = timed(src, None, True, True)
        bt = timed(src, w4_today, True, True)
        dt = timed(src, w4_worklist_child, True, True)
        print(f"floor W2 {a:,.0f} jobs/s; children only: W4 today {b:,.0f} items/s ({b / a:.3f}),"
              f" child-as-worklist-row {d:,.0f} ({d / a:.3f}); seed alone {s:,.0f} ({s / a:.3f});"
              f" from job start: W4 today {bt:,.0f} ({bt / a:.3f}),"
              f" child-as-worklist-row {dt:,.0f} ({dt / a:.3f})")
