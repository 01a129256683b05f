#!/usr/bin/env bash
# The benchmark rounds behind docs/BENCHMARKS.md: every workload on every backend, REPS times,
# interleaved, then the W2 drain at concurrency 1-16 for the chart. Appends the raw lines (and
# the floors of docs/bench_floors.sh) to OUT. Usage: bash docs/bench_run.sh [OUT] [REPS]
set -euo pipefail
OUT=${1:-docs/bench-results.txt}
REPS=${2:-3}
PG=${DOCKHAND_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
MY=${DOCKHAND_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
BIN=${BIN:-./target/release/dockhand}
run() { echo "# $*" >> "$OUT"; "$@" 2>/dev/null | grep '^peer=' | tee -a "$OUT"; }
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)" >> "$OUT"
bash "$(dirname "$0")/bench_floors.sh" | tee -a "$OUT"
for _ in $(seq 1 "$REPS"); do
  run "$BIN" bench --backend sqlite
  run "$BIN" bench --backend postgres --database-url "$PG"
  run "$BIN" bench --backend mysql --database-url "$MY"
done
for c in 1 2 4 8 16; do
  run "$BIN" bench --backend sqlite --workload W2 --concurrency "$c"
  run "$BIN" bench --backend postgres --database-url "$PG" --workload W2 --concurrency "$c"
  run "$BIN" bench --backend mysql --database-url "$MY" --workload W2 --concurrency "$c"
done
