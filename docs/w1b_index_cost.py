#!/usr/bin/env python3
"""What each index of a pending action costs a W1b-shaped bulk enqueue on SQLite
(docs/BENCHMARKS.md, session 25): 10,000 rows in 500-row multi-row INSERTs, one transaction,
WAL + synchronous=NORMAL (as dockhand opens files), on dockhand's schema (every migration in migrations/sqlite), with all
indexes and with the pending-only ones dropped. Python binds the rows outside the timer.

usage: python3 docs/w1b_index_cost.py [ROUNDS]   (run from the repository root; quiet machine)
"""
import sqlite3, glob, time, os, sys, statistics
def mk(path, drop):
    for s in ("", "-wal", "-shm"):
        try: os.remove(path+s)
        except FileNotFoundError: pass
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=NORMAL")
    for f in sorted(glob.glob("migrations/sqlite/*.sql")):
        c.executescript(open(f).read())
    for d in drop: c.execute(f"DROP INDEX {d}")
    return c
def run(c, n=10000, per=500):
    sql = "INSERT INTO dockhand_actions (hook,args,group_name,priority,status,scheduled_at,max_attempts,timeout_ms,created_at,schedule_id) VALUES " + ",".join(["(?,?,?,?,'pending',?,?,?,?,?)"]*per)
    now = int(time.time()*1000)
    allp=[]
    for b in range(n//per):
        params=[]
        for i in range(per):
            params += ["bench.noop", '{"n":%d}'%(b*per+i), None, 0, now, 3, None, now, None]
        allp.append(params)
    t=time.perf_counter()
    c.execute("BEGIN IMMEDIATE")
    for params in allp:
        c.execute(sql, params)
    c.execute("COMMIT")
    return time.perf_counter()-t
variants = {"all": [], "no_pending_sched": ["dockhand_actions_pending_sched"], "no_hook": ["dockhand_actions_hook_pending"], "claim_only": ["dockhand_actions_pending_sched","dockhand_actions_hook_pending"]}
res = {k: [] for k in variants}
for r in range(int(sys.argv[1]) if len(sys.argv)>1 else 5):
    for k, d in variants.items():
        c = mk("/tmp/w1bidx.db", d)
        res[k].append(run(c)); c.close()
for k,v in res.items(): print(k, "median %.1f ms" % (statistics.median(v)*1000), " ".join("%.1f"%(x*1000) for x in v))
