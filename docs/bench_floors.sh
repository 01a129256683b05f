#!/usr/bin/env bash
# The databases' own floors on this machine, for scale next to `dockhand bench` (not dockhand):
# one durable single-row commit per call, from one client, with each database's own fastest
# client. Usage: bash docs/bench_floors.sh  (needs pgbench, python3, mariadb-slap; servers as
# in .ci/run). Prints one line per floor.
set -euo pipefail
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | tail -n1)
PGURL=${DOCKHAND_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}

# SQLite: Python's sqlite3 (a thin C binding), WAL + synchronous=NORMAL, autocommit inserts.
python3 - <<'PY'
import os, sqlite3, tempfile, time
d = tempfile.mkdtemp(); c = sqlite3.connect(os.path.join(d, "f.db"), isolation_level=None)
c.execute("pragma journal_mode=wal"); c.execute("pragma synchronous=normal")
c.execute("create table t (id integer primary key, v text)")
n = 20000; s = time.perf_counter()
for i in range(n): c.execute("insert into t (v) values (?)", (str(i),))
e = time.perf_counter() - s
print(f"floor=sqlite-python-autocommit-insert per_sec={n/e:.0f} us={e/n*1e6:.1f}")
PY

# SQLite, dockhand's own schema (migrations/sqlite, triggers included) and claim/complete SQL,
# from Python: claim 8 (one autocommit UPDATE … RETURNING), complete those 8 (one transaction:
# set-based UPDATE + log insert), until 10,000 rows are drained. The ceiling of W2 at
# concurrency 8 without sqlx, tokio or the runner.
python3 - "$(dirname "$0")/../migrations/sqlite" <<'PY'
import glob, json, os, sqlite3, sys, tempfile, time
d = tempfile.mkdtemp(); c = sqlite3.connect(os.path.join(d, "f.db"), isolation_level=None)
c.execute("pragma journal_mode=wal"); c.execute("pragma synchronous=normal")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.sql"))):
    c.executescript(open(f).read())
c.execute("begin")
for i in range(10000):
    c.execute("insert into dockhand_actions (hook, args, priority, status, scheduled_at,"
              " max_attempts, created_at) values ('x', '{}', 10, 'pending', 0, 3, 0)")
c.execute("commit")
claim = """UPDATE dockhand_actions SET status = 'running', lease_owner = 'o',
  lease_token = lease_token + 1, lease_until = 1, attempt = attempt + 1, started_at = 1
  WHERE id IN (SELECT id FROM dockhand_actions WHERE status = 'pending' AND scheduled_at <= 1
               ORDER BY priority, scheduled_at, id LIMIT 8)
  RETURNING id, lease_token"""
done = """UPDATE dockhand_actions SET status = 'complete', finished_at = 2, lease_owner = NULL,
  lease_until = NULL
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token
        FROM json_each(?1)) AS l
  WHERE dockhand_actions.id = l.id AND dockhand_actions.lease_token = l.token
    AND status = 'running' RETURNING dockhand_actions.id"""
s = time.perf_counter()
while True:
    rows = c.execute(claim).fetchall()
    if not rows:
        break
    c.execute("begin immediate")
    ids = c.execute(done, (json.dumps(rows),)).fetchall()
    c.execute("INSERT INTO dockhand_action_logs (action_id, at, event)"
              " SELECT value, 2, 'completed' FROM json_each(?)", (json.dumps([i[0] for i in ids]),))
    c.execute("commit")
e = time.perf_counter() - s
print(f"floor=sqlite-python-drain-batch8 per_sec={10000/e:.0f}")
PY

# SQLite, W1b's statement from Python: 10 transactions of one 1,000-row insert of pending
# actions, on dockhand's schema as migrated (four index entries per pending row: the claim
# order, the pending tab's time order, hook and group), and again with the claim index alone
# (what a queue without the operators' indexes writes). Medians of 5, alternating.
python3 - "$(dirname "$0")/../migrations/sqlite" <<'PY'
import glob, os, sqlite3, statistics, sys, tempfile, time
migs = sorted(glob.glob(os.path.join(sys.argv[1], "*.sql")))
cols = "(hook, args, group_name, priority, status, scheduled_at, max_attempts, created_at)"
rows = [("bench.noop", '{"n":%d}' % i, None, 10, "pending", 0, 3, 0) for i in range(10000)]
sql = f"insert into dockhand_actions {cols} values " + ",".join(["(?,?,?,?,?,?,?,?)"] * 1000)
def run(drop):
    c = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "f.db"), isolation_level=None)
    c.execute("pragma journal_mode=wal"); c.execute("pragma synchronous=normal")
    for f in migs:
        c.executescript(open(f).read())
    for i in drop:
        c.execute(f"drop index {i}")
    s = time.perf_counter()
    for k in range(0, 10000, 1000):
        c.execute("begin immediate")
        c.execute(sql, [v for r in rows[k:k + 1000] for v in r])
        c.execute("commit")
    return 10000 / (time.perf_counter() - s)
ops = ["dockhand_actions_pending_sched", "dockhand_actions_hook", "dockhand_actions_group_sched"]
full, lean = [], []
for _ in range(5):
    full.append(run([])); lean.append(run(ops))
print(f"floor=sqlite-python-bulk1000-dockhand-schema per_sec={statistics.median(full):.0f}")
print(f"floor=sqlite-python-bulk1000-claim-index-only per_sec={statistics.median(lean):.0f}")
PY

# PostgreSQL: pgbench, one autocommitted single-row insert per transaction, 1 and 8 clients.
psql "$PGURL" -qc "set client_min_messages = warning; drop table if exists dockhand_floor; create table dockhand_floor (id bigserial primary key, v text)"
echo "insert into dockhand_floor (v) values ('x');" > /tmp/dockhand_floor.sql
for c in 1 8; do
  tps=$("$PGBIN/pgbench" -n -f /tmp/dockhand_floor.sql -T 5 -c "$c" "$PGURL" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  echo "floor=pg-pgbench-insert clients=$c per_sec=${tps%.*}"
done
psql "$PGURL" -qc "drop table dockhand_floor"

# MariaDB: mariadb-slap, autocommitted single-row inserts, 1 client.
if command -v mariadb-slap >/dev/null; then
  out=$(mariadb-slap -h 127.0.0.1 -u root --create-schema=dockhand_floor \
    --create="create table t (id bigint auto_increment primary key, v varchar(10)) engine=innodb" \
    --query="insert into t (v) values ('x')" --number-of-queries=2000 --concurrency=1 --iterations=1 2>/dev/null)
  secs=$(echo "$out" | sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\).*/\1/p')
  echo "floor=mariadb-slap-insert clients=1 per_sec=$(python3 -c "print(round(2000/$secs))")"
fi
