#!/usr/bin/env bash
# Instruction counts of replica-bench workloads under callgrind: Replica's timed region against the raw C side's,
# one repetition each, no warm-up. Deterministic, so it shows the effect of a change on a noisy machine where the
# timed ratios wander. Usage: Scripts/bench-instructions.sh [--full] B1 [B3 ...]   (default: quick sizes)
# BIN overrides the executable (default: the release build's replica-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "bench-instructions: needs valgrind (apt-get install valgrind)"; exit 1; }
size=--quick
if [ "${1:-}" = "--full" ]; then size=""; shift; fi
[ $# -gt 0 ] || { echo "usage: $0 [--full] B1 [B3 ...]"; exit 1; }
BIN=${BIN:-$(swift build -c release --show-bin-path)/replica-bench}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-5s %16s %16s %8s\n' workload replica_Ir raw_Ir ratio
for workload in "$@"; do
  valgrind --tool=callgrind --callgrind-out-file="$out/$workload.cg" \
    --toggle-collect='*timedReplicaRegion*' --toggle-collect='*timedRawRegion*' \
    "$BIN" $size --only "$workload" --reps 1 --warmups 0 >/dev/null 2>&1
  count() { callgrind_annotate --inclusive=yes "$out/$workload.cg" 2>/dev/null | awk -v f="$1" 'index($0, f) && $1 ~ /^[0-9,]+$/ && !done { gsub(",", "", $1); print $1; done = 1 }' || true; }
  replica=$(count timedReplicaRegion); raw=$(count timedRawRegion)
  if [ -n "$raw" ]; then ratio=$(awk -v a="$replica" -v b="$raw" 'BEGIN { printf "%.2f", a / b }'); else raw="-"; ratio="-"; fi
  printf '%-5s %16s %16s %8s\n' "$workload" "${replica:-?}" "$raw" "$ratio"
done
