#!/usr/bin/env bash
# A trace event against the clock it reads (issue 32), side by side in one run:
# what a timestamp costs here (clocks.c: rdtsc, rdtscp, lfence;rdtsc,
# clock_gettime), the count handler (entries only, and --completed: entry and
# exit through the return trampoline), and the trace handler (timed
# aggregates + a record per event into its ring) on loop.c's empty function,
# entry flow.  Per event = per call / 2 for the handlers that see the exit.
#   ratio (entry count) = trace per event / (cheapest clock + count per call)
#   ratio (event count) = trace per event / (cheapest clock + count --completed per call / 2)
#   ratio (entries only) = trace --entry-only per call (one event, one clock
#     read a call, no exit hooked) / (cheapest clock + count per call)
#   ratio (no durations) = trace --no-durations per event (two events, one
#     clock read a call: the exit recorded without a time, no frame, no
#     times kept) / (cheapest clock + count --completed per call / 2)
# The first is the issue's wording; the second compares like with like (each
# traced event also pays its share of the exit's return trampoline, which
# count --completed pays too); the third is the trace that reads the clock
# once a call.
# usage: bench/hotpatch/trace_event.sh [BUILD_DIR]   (as root)
# env: MAX_EXP (default 6), REPEATS (default 3: rounds of every variant, each
#      variant's fastest kept),
#      BASELINE_RUNTIME=libiprobe-rt.so of another build: its trace handler
#      measured in the same run ("trace, baseline")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-6}
repeats=${REPEATS:-3}
iprobe="$build/bin/iprobe"
work="$build/bench-hotpatch"
mkdir -p "$work"
rm -f "$work"/result.*  # none of an earlier run (run.sh shares $work)
cmake --build "$build" --target iprobe iprobe-hotpatch iprobe-probes iprobe-cc iprobe_rt >/dev/null
. "$here/targets.sh"  # log, start, finish, ns_at, run_variant
export IPROBE_CC_QUIET=1
"$build/bin/iprobe-cc" --pad-threshold=0 -O2 -o "$work/loop_iprobe" "$here/loop.c" -lpthread
gcc -O2 -o "$work/clocks" "$here/clocks.c"

# Interleaved: each of $repeats rounds reads the clocks and runs every
# variant once, and each keeps its fastest round.  This VM's speed drifts by
# up to 30% over seconds (rdtsc 10.1 to 13.6 ns a read within minutes): a
# variant measured in its own stretch of time would be compared with the
# others at another speed.
variant_args() {  # name: sets args, the variant's attach arguments
  case $1 in
    count) args=(--functions empty --handler count) ;;
    count_completed) args=(--functions empty --handler count --completed) ;;
    trace) args=(--functions empty --ring-records 8388608) ;;
    trace_entry) args=(--functions empty --entry-only --ring-records 8388608) ;;
    trace_nodur) args=(--functions empty --no-durations --ring-records 8388608) ;;
    trace_baseline) args=(--functions empty --ring-records 8388608 --runtime "$BASELINE_RUNTIME") ;;
  esac
}
variants_run="count count_completed trace trace_entry trace_nodur"
[[ -n ${BASELINE_RUNTIME:-} ]] && variants_run+=" trace_baseline"
: >"$work/clocks.all"
for v in $variants_run; do : >"$work/result.$v.all"; done
for ((round = 0; round < repeats; round++)); do
  log "round $((round + 1))/$repeats: clocks, $variants_run"
  "$work/clocks" >>"$work/clocks.all"
  for v in $variants_run; do
    variant_args "$v"
    run_once "$v" "$work/loop_iprobe" "${args[@]}"
  done
done
for v in $variants_run; do keep_fastest "$v"; done
# each clock's fastest round, in clocks.c's table
awk -F'|' '/^\| [a-z]/ && $3 ~ /[0-9]/ { gsub(/ /, "", $3); if (!($2 in m) || $3 + 0 < m[$2]) m[$2] = $3 + 0
             if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
           /^constant_tsc/ { flags = $0 }
           END { print "| clock | ns per read |"; print "|---|---|"
                 for (i = 1; i <= k; i++) printf "|%s| %.2f |\n", order[i], m[order[i]]; print flags }' \
  "$work/clocks.all" | tee "$work/clocks.out"
clock_ns() { awk -F'|' -v n="$1" '$2 ~ "^ "n" $" { gsub(/ /, "", $3); print $3 }' "$work/clocks.out"; }
rdtsc=$(clock_ns rdtsc)

printf '\n| calls | count (entry) ns/call | count --completed ns/call | trace ns/call | trace ns/event |'
[[ -n ${BASELINE_RUNTIME:-} ]] && printf ' trace, baseline ns/event |'
printf ' rdtsc + count | ratio (entry count) | rdtsc + count --completed / 2 | ratio (event count) | trace --entry-only ns/event | ratio (entries only) | trace --no-durations ns/event | ratio (no durations) |\n|---|---|---|---|---|'
[[ -n ${BASELINE_RUNTIME:-} ]] && printf -- '---|'
printf -- '---|---|---|---|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  ((e < 3)) && continue  # the first rows carry the ring's one-time page faults
  c=$(ns_at "$work/result.count" "$n"); cc=$(ns_at "$work/result.count_completed" "$n"); t=$(ns_at "$work/result.trace" "$n")
  te=$(ns_at "$work/result.trace_entry" "$n"); tn=$(ns_at "$work/result.trace_nodur" "$n")
  b=; [[ -n ${BASELINE_RUNTIME:-} ]] && b=$(ns_at "$work/result.trace_baseline" "$n")
  awk -v n="$e" -v c="$c" -v cc="$cc" -v t="$t" -v te="$te" -v tn="$tn" -v b="$b" -v r="$rdtsc" 'BEGIN {
    printf "| 10^%d | %.2f | %.2f | %.2f | %.2f |", n, c, cc, t, t / 2
    if (b != "") printf " %.2f |", b / 2
    printf " %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r + c, t / 2 / (r + c), r + cc / 2, t / 2 / (r + cc / 2), te, te / (r + c), tn / 2, tn / 2 / (r + cc / 2) }'
done
echo "(CPU ns, fastest of $repeats interleaved rounds per size; clocks: ns per read, the fastest of 5 rounds of 10^7 in each of the $repeats rounds; goal: ratio <= 1.3)"
