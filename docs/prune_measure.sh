#!/usr/bin/env bash
# Measures `dockhand prune` over 1,000,000 final jobs (each with a delivered lifecycle event and
# its own input packet: 3,000,000 rows) on each backend: seeds the rows with the database's own
# SQL, then runs `dockhand prune` until nothing is left, timing it. Not part of CI.
# Usage: DOCKHAND_BIN=target/release/dockhand bash docs/prune_measure.sh [sqlite|postgres|mysql]...
# (servers as in .ci/run; N=... changes the job count).
set -euo pipefail
BIN=${DOCKHAND_BIN:-target/release/dockhand}
N=${N:-1000000}
PGURL=${DOCKHAND_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
NOW_MS=$(( $(date +%s) * 1000 ))
OLD_MS=$(( NOW_MS - 10 * 86400 * 1000 ))

prune_all() { # URL
  local start=$SECONDS total=0
  while :; do
    out=$("$BIN" --database-url "$1" --json prune)
    jobs=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["jobs_pruned"])' "$out")
    pk=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["packets_pruned"])' "$out")
    more=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["more_may_remain"])' "$out")
    total=$(( total + jobs ))
    echo "  prune: jobs=$jobs packets=$pk more=$more" >&2
    [[ "$more" == "True" ]] || break
  done
  echo "jobs_deleted=$total secs=$(( SECONDS - start ))"
}

for backend in "${@:-sqlite postgres mysql}"; do
  case "$backend" in
  sqlite)
    dir=$(mktemp -d); url="sqlite:$dir/prune.db"
    "$BIN" --database-url "$url" migrate >/dev/null
    python3 - "$dir/prune.db" "$N" "$OLD_MS" <<'PY'
import hashlib, sqlite3, sys
db, n, old = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = sqlite3.connect(db, isolation_level=None)
c.execute("begin")
def rows():
    for i in range(1, n + 1):
        body = '{"i":%d}' % i
        yield (hashlib.sha256(body.encode()).hexdigest(), body, i)
c.executemany("insert into dockhand_packets (hash, body, created_at, used_at) values (?, ?, %d, %d)" % (old, old),
              ((h, b) for h, b, _ in rows()))
c.executemany("insert into dockhand_jobs (id, pipeline, status, input_refs, created_at, updated_at, finished_at) "
              "values (?, 'p', 'completed', ?, %d, %d, %d)" % (old, old, old),
              ((i, '["v1:%s"]' % h) for h, _, i in rows()))
c.execute("insert into dockhand_job_events (job_id, status, created_at, delivered_at) "
          "select id, 'completed', %d, %d from dockhand_jobs" % (old, old))
c.execute("commit")
PY
    echo "sqlite: seeded $N jobs" >&2
    echo "peer=dockhand-sqlite workload=prune n=$N $(prune_all "$url")"
    rm -rf "$dir" ;;
  postgres)
    schema="prune_$$"
    psql "$PGURL" -qc "create schema $schema" >/dev/null
    url="$PGURL?options=-csearch_path%3D$schema"
    "$BIN" --database-url "$url" migrate >/dev/null
    psql "$PGURL" -q -v ON_ERROR_STOP=1 <<SQL
set search_path = $schema;
insert into dockhand_packets (hash, body, created_at, used_at)
  select encode(sha256(('{"i":' || i || '}')::bytea), 'hex'), '{"i":' || i || '}',
         to_timestamp($OLD_MS / 1000.0), to_timestamp($OLD_MS / 1000.0)
  from generate_series(1, $N) i;
insert into dockhand_jobs (pipeline, status, input_refs, created_at, updated_at, finished_at)
  select 'p', 'completed',
         jsonb_build_array('v1:' || encode(sha256(('{"i":' || i || '}')::bytea), 'hex')),
         to_timestamp($OLD_MS / 1000.0), to_timestamp($OLD_MS / 1000.0), to_timestamp($OLD_MS / 1000.0)
  from generate_series(1, $N) i;
insert into dockhand_job_events (job_id, status, created_at, delivered_at)
  select id, 'completed', to_timestamp($OLD_MS / 1000.0), to_timestamp($OLD_MS / 1000.0) from dockhand_jobs;
analyze;
SQL
    echo "postgres: seeded $N jobs" >&2
    echo "peer=dockhand-postgres workload=prune n=$N $(prune_all "$url")"
    psql "$PGURL" -qc "drop schema $schema cascade" >/dev/null ;;
  mysql)
    db="prune_$$"
    mariadb -h 127.0.0.1 -u root -e "create database $db"
    url="mysql://root@127.0.0.1:3306/$db"
    "$BIN" --database-url "$url" migrate >/dev/null
    mariadb -h 127.0.0.1 -u root "$db" <<SQL
insert into dockhand_packets (hash, body, created_at, used_at)
  select sha2(concat('{"i":', seq, '}'), 256), concat('{"i":', seq, '}'), $OLD_MS, $OLD_MS
  from seq_1_to_$N;
insert into dockhand_jobs (pipeline, status, input_refs, engine_data, created_at, updated_at, finished_at)
  select 'p', 'completed', concat('["v1:', sha2(concat('{"i":', seq, '}'), 256), '"]'), '{}',
         $OLD_MS, $OLD_MS, $OLD_MS
  from seq_1_to_$N;
insert into dockhand_job_events (job_id, status, created_at, delivered_at)
  select id, 'completed', $OLD_MS, $OLD_MS from dockhand_jobs;
analyze table dockhand_jobs, dockhand_packets, dockhand_job_events;
SQL
    echo "mysql: seeded $N jobs" >&2
    echo "peer=dockhand-mysql workload=prune n=$N $(prune_all "$url")"
    mariadb -h 127.0.0.1 -u root -e "drop database $db" ;;
  esac
done
