#!/usr/bin/env bash
# The trace handler's C path against another build's runtime, side by side in
# one run (issue 32, the first-call claims): loop.c's empty function traced
# through C on every call (`--when 'duration > 1s'`: decided at exit, so
# every call is timed and none recorded) and through the fast path (plain
# trace), each with this build's runtime and BASELINE_RUNTIME's.
# usage: BASELINE_RUNTIME=DIR/libiprobe-rt.so bench/hotpatch/trace_c_path.sh [BUILD_DIR]   (as root)
# env: MAX_EXP (default 6), REPEATS (default 5, fastest kept)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-6}
repeats=${REPEATS:-5}
iprobe="$build/bin/iprobe"
work="$build/bench-hotpatch"
: "${BASELINE_RUNTIME:?set BASELINE_RUNTIME to the libiprobe-rt.so to compare with}"
mkdir -p "$work"
cmake --build "$build" --target iprobe iprobe-hotpatch iprobe-probes iprobe-cc iprobe_rt >/dev/null
. "$here/targets.sh"  # log, start, finish, ns_at, run_variant
export IPROBE_CC_QUIET=1
"$build/bin/iprobe-cc" --pad-threshold=0 -O2 -o "$work/loop_iprobe" "$here/loop.c" -lpthread
# alternated, so that a change of load falls on both
for ((round = 0; round < 2; round++)); do
  run_variant c_path "$work/loop_iprobe" --functions empty --ring-records 8388608 --when 'duration > 1s'
  run_variant c_path_baseline "$work/loop_iprobe" --functions empty --ring-records 8388608 --when 'duration > 1s' \
    --runtime "$BASELINE_RUNTIME"
  run_variant fast "$work/loop_iprobe" --functions empty --ring-records 8388608
  run_variant fast_baseline "$work/loop_iprobe" --functions empty --ring-records 8388608 --runtime "$BASELINE_RUNTIME"
  for v in c_path c_path_baseline fast fast_baseline; do cat "$work/result.$v" >>"$work/result.$v.rounds.$round"; done
done
best() { sort -n "$work/result.$1.rounds."* | awk -v n="$2" '$1 == n && (m == "" || $2 < m) { m = $2 } END { print m }'; }
printf '| calls | C path ns/call | C path, baseline ns/call | fast path ns/call | fast path, baseline ns/call |\n|---|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  ((e < 3)) && continue  # the first rows carry the ring's one-time page faults
  printf '| 10^%d | %s | %s | %s | %s |\n' "$e" "$(best c_path $n)" "$(best c_path_baseline $n)" "$(best fast $n)" \
    "$(best fast_baseline $n)"
done
rm -f "$work"/result.*.rounds.*
echo "(CPU ns per call, fastest of 2 x $repeats runs per size)"
