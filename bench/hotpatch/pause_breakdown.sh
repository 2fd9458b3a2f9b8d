#!/usr/bin/env bash
# Where the stop-the-world pause of enabling and disabling N probes goes,
# seen from outside (bpftrace, pause_breakdown.bt): the tool's seize,
# interrupt, waits, sleeps, /proc/PID/mem writes and detaches, and each
# target thread's gap (its ptrace stop until it next runs).  RUNS
# attach/detach cycles per build, interleaved, one target of PROBES/2
# functions and THREADS + 1 threads (THREADS, default 8, calling them
# round-robin).
# usage: bench/hotpatch/pause_breakdown.sh [BUILD_DIR]
#   env: BASELINE=BUILD_DIR, PROBES (10000), RUNS (9), THREADS (8),
#        TARGET_PRIO (a prefix for the target, e.g. "nice -n -15": its
#        threads then win the CPU from other load and reach their stops
#        sooner; the tool runs SCHED_FIFO while the world is stopped anyway)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
work="$build/bench-hotpatch"
mkdir -p "$work"
. "$here/targets.sh"
runs=${RUNS:-9}
pause_target
# bpftrace's tracepoints need tracefs: mounted here if it is not, and
# unmounted again at the end; the target never outlives a failed run.
mounted=0
if [[ ! -d /sys/kernel/tracing/events ]]; then
  mount -t tracefs nodev /sys/kernel/tracing
  mounted=1
fi
trap 'if [[ -n ${pid:-} ]]; then kill "$pid" 2>/dev/null || true; fi; ((mounted == 0)) || umount /sys/kernel/tracing' EXIT
tools=("$build/bin/iprobe") names=("this build")
[[ -n ${BASELINE:-} ]] && tools=("$(cd "$BASELINE" && pwd)/bin/iprobe" "${tools[@]}") names=("baseline" "${names[@]}")
# shellcheck disable=SC2086
start ${TARGET_PRIO:-} "$many_binary"
sleep 0.5
"${tools[-1]}" attach "$pid" --handler count --completed >/dev/null  # the first attach injects the runtime
"${tools[-1]}" detach "$pid" >/dev/null
events="$work/pause_breakdown.events"
bpftrace "$here/pause_breakdown.bt" >"$events" 2>"$events.err" &
tracer=$!
for _ in $(seq 1 200); do grep -q Attaching "$events" 2>/dev/null && break; sleep 0.1; done
# Each stop is told by the pid of the tool that made it (iprobe execs its
# tool): "PID LABEL" lines.
labels="$work/pause_breakdown.labels"
: >"$labels"
run_labelled() {  # label command...
  local label=$1
  shift
  "$@" >/dev/null &
  echo "$! $label" >>"$labels"
  wait $!
}
for ((r = 0; r < runs; r++)); do
  for i in "${!tools[@]}"; do
    run_labelled "${names[$i]} enable" "${tools[$i]}" attach "$pid" --handler count --completed
    run_labelled "${names[$i]} disable" "${tools[$i]}" detach "$pid"
  done
done
sleep 0.1
kill -INT "$tracer"; wait "$tracer" || true
kill "$pid"; wait "$pid" 2>/dev/null || true
printf '\n(load: %s; %s runs each, interleaved; target %s)\n\n' "$(cut -d' ' -f1-3 /proc/loadavg)" "$runs" "${TARGET_PRIO:-at nice 0}"
python3 "$here/pause_breakdown.py" "$events" "$pid" "$labels"
