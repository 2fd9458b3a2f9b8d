#!/usr/bin/env bash
# What saying where a detach lost exits (exit marks) costs, side by side
# with a base build in one run.
#   the target  nothing: the runtime's code is the base's, instruction for
#               instruction (objdump -d of both libiprobe-rt.so, compared:
#               printed first)
#   the reader  per event, a test that no mark waits (and per ring and
#               drain, one load of the region's mark counter): a trace file
#               of loop.c's empty function (10^MAX_EXP calls, the entry
#               flow), written once by the base build's `trace --output
#               --lossless` (version 4: both read it), converted by each
#               build (`trace --input FILE --format F >/dev/null`, text and
#               JSON), alternating, RUNS rounds: user CPU per event
#               (/usr/bin/time, 10 ms resolution over seconds), median
# usage: bench/hotpatch/exit_marks.sh BASE_BUILD_DIR [BUILD_DIR]   (as root; alone on the
#   machine, or under the flock(1) lock every benchmark there takes)   env: MAX_EXP (7), RUNS (7)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
base="$(cd "$1" && pwd)"
build="$(cd "${2:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-7}
runs=${RUNS:-7}
work="$build/bench-exit-marks"
mkdir -p "$work"
. "$here/targets.sh"  # log, start

code() { objdump -d --no-show-raw-insn "$1/lib/libiprobe-rt.so" | sed -n 's/^ *[0-9a-f]*:\t//p'; }
if diff <(code "$base") <(code "$build") >/dev/null; then
  echo "runtime: the same instructions as the base's ($(code "$build" | wc -l) lines of objdump -d)"
else
  echo "runtime: its code differs from the base's"
fi

"$build/bin/iprobe-cc" --pad-threshold=0 -O2 -o "$work/loop_iprobe" "$here/loop.c" -lpthread
start "$work/loop_iprobe" "$max_exp"
"$base/bin/iprobe" attach "$pid" --functions empty --ring-records 65536 >/dev/null
file="$work/loop.trace"
"$base/bin/iprobe" trace "$pid" --lossless --output "$file" 2>"$work/write.err" &
writer=$!
sleep 0.5  # the writer is draining
kill -USR1 "$pid"
wait "$pid"
wait "$writer" || true  # ends when the target does
events=$(sed -n 's/^iprobe: \([0-9]*\) events written.*/\1/p' "$work/write.err")
echo "file: $events events, $(stat -c %s "$file") bytes (version $(od -An -tu4 -j8 -N4 "$file" | tr -d ' '))"

convert() {  # build format: user ns per event
  /usr/bin/time -f '%U' -o "$work/time" "$1/bin/iprobe" trace --input "$file" --format "$2" >/dev/null
  awk -v e="$events" '{ printf "%.1f\n", $1 * 1e9 / e }' "$work/time"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "| format | base ns/event (median of $runs) | this ns/event | this/base | base runs | this runs |"
echo "|---|---|---|---|---|---|"
for format in text json; do
  b=() t=()
  for ((r = 0; r < runs; r++)); do
    b+=("$(convert "$base" "$format")")
    t+=("$(convert "$build" "$format")")
  done
  mb=$(printf '%s\n' "${b[@]}" | median)
  mt=$(printf '%s\n' "${t[@]}" | median)
  awk -v f="$format" -v mb="$mb" -v mt="$mt" -v bs="${b[*]}" -v ts="${t[*]}" \
    'BEGIN { printf "| %s | %s | %s | %.3f | %s | %s |\n", f, mb, mt, mt / mb, bs, ts }'
done
rm -f "$file"
