#!/usr/bin/env bash
# Instruction counts of replica-bench workloads under callgrind: Replica's timed region against the raw C side's,
# one repetition each, no warm-up. Deterministic, so it shows the effect of a change on a noisy machine where the
# timed ratios wander. Usage: Scripts/bench-instructions.sh [--full] [--floor] B1 [B3 ...]   (default: quick sizes)
# BIN overrides the executable (default: the release build's replica-bench).
# --floor also counts the instructions each side spends inside SQLite and libsodium (every call into them, inclusive)
# and prints `floor`: Replica's library instructions ÷ the raw side's total — the ratio Replica would reach if its own
# Swift code cost nothing, given the SQL it runs. Two callgrind runs per workload instead of one.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "bench-instructions: needs valgrind (apt-get install valgrind)"; exit 1; }
size=--quick
floor=""
while [ $# -gt 0 ]; do
  case "$1" in
    --full) size=""; shift ;;
    --floor) floor=1; shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--full] [--floor] B1 [B3 ...]"; exit 1; }
BIN=${BIN:-$(swift build -c release --show-bin-path)/replica-bench}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Instructions inside SQLite and libsodium: the inclusive cost of every call from outside those libraries into them
# (so what they call in libc, such as malloc and memcpy, counts too, and nested library calls count once; calls
# through unnamed PLT stubs, `[???]`, are the libraries calling themselves).
libraries() {
  callgrind_annotate --threshold=100 --inclusive=yes --tree=calling "$1" 2>/dev/null | awk '
    function lib(line) { return line ~ /\[[^]]*(libsqlite3|libsodium)\.so[^]]*\]$/ }
    /^ *[0-9,]+ \([ 0-9.]+%\)  \*  / { outside = !lib($0) && $0 !~ /\[\?\?\?\]$/; next }
    /^ *[0-9,]+ \([ 0-9.]+%\)  >  / && outside && lib($0) { gsub(",", "", $1); s += $1 }
    END { print s + 0 }'
}
if [ -n "$floor" ]; then
  printf '%-5s %16s %16s %8s %18s %16s %8s\n' workload replica_Ir raw_Ir ratio replica_sqlite+na raw_sqlite+na floor
else
  printf '%-5s %16s %16s %8s\n' workload replica_Ir raw_Ir ratio
fi
for workload in "$@"; do
  if [ -n "$floor" ]; then
    for side in Replica Raw; do
      valgrind --tool=callgrind --callgrind-out-file="$out/$workload.$side.cg" --toggle-collect="*timed${side}Region*" \
        "$BIN" $size --only "$workload" --reps 1 --warmups 0 >/dev/null 2>&1
    done
    total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'; }
    replica=$(total "$out/$workload.Replica.cg"); raw=$(total "$out/$workload.Raw.cg")
    lr=$(libraries "$out/$workload.Replica.cg"); lw=$(libraries "$out/$workload.Raw.cg")
    if [ -n "$raw" ] && [ "$raw" != 0 ]; then
      ratio=$(awk -v a="$replica" -v b="$raw" 'BEGIN { printf "%.2f", a / b }')
      low=$(awk -v a="$lr" -v b="$raw" 'BEGIN { printf "%.2f", a / b }')
    else raw="-"; ratio="-"; lw="-"; low="-"; fi
    printf '%-5s %16s %16s %8s %18s %16s %8s\n' "$workload" "${replica:-?}" "$raw" "$ratio" "$lr" "$lw" "$low"
    continue
  fi
  valgrind --tool=callgrind --callgrind-out-file="$out/$workload.cg" \
    --toggle-collect='*timedReplicaRegion*' --toggle-collect='*timedRawRegion*' \
    "$BIN" $size --only "$workload" --reps 1 --warmups 0 >/dev/null 2>&1
  count() { callgrind_annotate --inclusive=yes "$out/$workload.cg" 2>/dev/null | awk -v f="$1" 'index($0, f) && $1 ~ /^[0-9,]+$/ && !done { gsub(",", "", $1); print $1; done = 1 }' || true; }
  replica=$(count timedReplicaRegion); raw=$(count timedRawRegion)
  if [ -n "$raw" ]; then ratio=$(awk -v a="$replica" -v b="$raw" 'BEGIN { printf "%.2f", a / b }'); else raw="-"; ratio="-"; fi
  printf '%-5s %16s %16s %8s\n' "$workload" "${replica:-?}" "$raw" "$ratio"
done
