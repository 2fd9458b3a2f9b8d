#!/usr/bin/env bash
# `--when` cost per call (issue 29), side by side in one run: an empty
# function of two integer arguments (when_loop.c, iprobe-cc's entry flow,
# 10^EXP calls) with probes off, the count handler, the trace handler, and
# the trace handler under conditions that never hold: decided at entry on an
# argument (`n == -1`), at exit on the duration (`duration > 1s`) and
# `--min-duration 1s`; and bpftrace with the same filter on a uprobe and a
# uretprobe (10^BPF_EXP calls: a trap per event).  Each variant REPEATS
# times (fresh process), fastest kept; ratios against the count handler.
# usage: bench/hotpatch/when.sh [BUILD_DIR]   (as root; alone on the machine)
# env: EXP (default 7), REPEATS (default 5), BPF_EXP (default 5), SKIP_BPF=1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
exp=${EXP:-7}
repeats=${REPEATS:-5}
iprobe="$build/bin/iprobe"
work="$build/bench-when"
mkdir -p "$work"
cmake --build "$build" --target iprobe iprobe-cc iprobe_rt >/dev/null
. "$here/targets.sh"  # log, start, finish
IPROBE_CC_QUIET=1 "$build/bin/iprobe-cc" -O2 -g -o "$work/when_loop" "$here/when_loop.c"

best() {  # name [attach args...]: the fastest ns per call of $repeats runs
  local name=$1 fastest=""
  shift
  for ((r = 0; r < repeats; r++)); do
    start "$work/when_loop" "$exp"
    if (($#)); then "$iprobe" attach "$pid" --functions work "$@" >/dev/null; fi
    finish
    local ns
    ns=$(awk '$1 ~ /^[0-9]+$/ { print $2 }' "$out")
    if [[ -z $fastest ]] || awk -v a="$ns" -v b="$fastest" 'BEGIN { exit !(a < b) }'; then fastest=$ns; fi
  done
  echo "$name $fastest"
}

log "10^$exp calls of work(n, m), fastest of $repeats runs, thread CPU ns per call"
{
  best off
  best count --handler count
  best trace --ring-records 64
  best when_entry_nomatch --when 'n == -1'
  best when_exit_nomatch --when 'duration > 1s'
  best min_duration_nomatch --min-duration 1s
  if [[ -z ${SKIP_BPF:-} ]] && command -v bpftrace >/dev/null; then
    # the filter the kernel checks per hit, as --when n == -1 (entry) and a return probe
    bpftrace -e "uprobe:$work/when_loop:work /arg0 == -1/ { @c = count(); } uretprobe:$work/when_loop:work /retval == -1/ { @r = count(); }" \
      >"$work/bpftrace.out" 2>&1 &
    bpf=$!
    sleep 5
    start "$work/when_loop" "${BPF_EXP:-5}"
    finish
    echo "bpftrace_nomatch $(awk '$1 ~ /^[0-9]+$/ { print $2 }' "$out")"
    kill -INT "$bpf"; wait "$bpf" || true
  fi
} >"$work/results"
count=$(awk '$1 == "count" { print $2 }' "$work/results")
printf '%-22s %10s %10s\n' variant "ns/call" "x count"
awk -v c="$count" '{ printf "%-22s %10.2f %10.2f\n", $1, $2, $2 / c }' "$work/results"
