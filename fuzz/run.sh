#!/usr/bin/env bash
# Runs each cargo-fuzz target for a short time (default 60 s each; FUZZ_SECONDS to change).
# New crash inputs land in fuzz/artifacts/<target>/; copy each into
# fuzz/regressions/<target>/ (replayed by `cargo test --test fuzz_regressions`) once fixed.
# cargo-fuzz passes -Z sanitizer flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2; exit 1; }
seconds="${FUZZ_SECONDS:-60}"
export RUSTC_BOOTSTRAP=1
for target in cron args packet url; do
  mkdir -p "corpus/$target"
  if [ -d "regressions/$target" ]; then cp -n regressions/$target/* "corpus/$target/" 2>/dev/null || true; fi
  echo "== fuzz $target for ${seconds}s"
  cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
done
