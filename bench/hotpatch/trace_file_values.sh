#!/usr/bin/env bash
# The trace file with values, side by side in one run: `long add2(long,
# long)` (values_loop.c) called 10^1..10^MAX_EXP times (1.1 M calls at 6),
# every event written by `iprobe trace PID --output FILE --lossless`:
#   plain    iprobe attach --functions add2 (the trace handler: 8-byte event words)
#   values   iprobe attach --functions add2 --args --retval (each entry with
#            rdi, rsi; each exit with rax, rdx, xmm0, xmm1: values events)
# Per leg: events written, file bytes per event (the writer's own count, and
# of the values events alone), the writer's CPU (user + system of `iprobe
# trace`, from /usr/bin/time, 10 ms resolution: start-up included) per event,
# user (the encoding) and system (write(2) of the file) apart, and the conversion's
# (`trace --input FILE --format json` to /dev/null) per event.
# usage: bench/hotpatch/trace_file_values.sh [BUILD_DIR]   (as root; alone on the machine, or under the
#   flock(1) lock every benchmark there takes)   env: MAX_EXP (default 6), RUNS (default 3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-6}
runs=${RUNS:-3}
iprobe="$build/bin/iprobe"
work="$build/bench-trace-file-values"
mkdir -p "$work"
. "$here/targets.sh"  # log, start
IPROBE_CC_QUIET=1 "$build/bin/iprobe-cc" --flow=entry -O2 -g -o "$work/values_loop" "$here/values_loop.c"

leg() {  # name [attach args...]
  local name=$1
  shift
  start "$work/values_loop" "$max_exp"
  "$iprobe" attach "$pid" --functions add2 --ring-records 65536 "$@" >/dev/null
  local file="$work/$name.trace"
  /usr/bin/time -f '%U %S' -o "$work/$name.time" "$iprobe" trace "$pid" --lossless --output "$file" 2>"$work/$name.err" &
  local writer=$!
  sleep 0.5  # the writer is draining
  kill -USR1 "$pid"
  wait "$pid"
  wait "$writer" || true  # ends when the target does
  local events cpu values_line conv
  events=$(sed -n 's/^iprobe: \([0-9]*\) events written.*/\1/p' "$work/$name.err")
  bytes=$(sed -n 's/.* (\([0-9]*\) bytes.*/\1/p' "$work/$name.err")
  values_line=$(sed -n 's/.*; \([0-9]*\) with values, \([0-9.]*\) bytes each.*/\1 \2/p' "$work/$name.err")
  cpu=$(awk 'NR == 1 { print $1, $2 }' "$work/$name.time")
  local t0 t1
  t0=$(date +%s.%N)
  "$iprobe" trace --input "$file" --format json >/dev/null
  t1=$(date +%s.%N)
  conv=$(awk -v a="$t0" -v b="$t1" -v e="$events" 'BEGIN { printf "%.0f", (b - a) * 1e9 / e }')
  awk -v n="$name" -v e="$events" -v b="$bytes" -v c="$cpu" -v v="${values_line:-0 -}" -v conv="$conv" 'BEGIN {
    split(v, vv, " ")
    split(c, cc, " ")
    printf "| %s | %d | %d | %.2f | %s | %s | %.2f + %.2f | %.1f | %.1f | %s |\n", n, e, b, b / e, vv[1], vv[2], cc[1], cc[2],
      cc[1] * 1e9 / e, cc[2] * 1e9 / e, conv }'
  rm -f "$file"
}

echo "| leg | events | file bytes | bytes/event | values events | bytes/values event | writer CPU s (user + sys) | writer user ns/event | writer sys ns/event (write(2) into the page cache) | json conversion ns/event |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for ((r = 0; r < runs; r++)); do
  leg plain
  leg values --args --retval
done
