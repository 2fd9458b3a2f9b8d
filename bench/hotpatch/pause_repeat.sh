#!/usr/bin/env bash
# The stop-the-world pause of enabling and disabling N probes (count
# handler, entries and exits), R times on one target, for this build and
# optionally a baseline build, interleaved: median and p90 of the pause
# and of the pause less the time spent stopping the threads (what the tool
# does while the world is stopped; stopping 9 threads depends on the
# machine's load, not on the tool).
# usage: bench/hotpatch/pause_repeat.sh [BUILD_DIR]   env: BASELINE=BUILD_DIR, PROBES (10000), RUNS (9),
#   TARGET_PRIO (a prefix for the target, e.g. "nice -n -15": its threads win
#   the CPU from the machine's other load and reach their stops sooner, which
#   tells that load apart from the tool's own cost), THREADS (8: the target's
#   spinning threads; with more than the machine has cores, the stop waits
#   for each to be scheduled once)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
work="$build/bench-hotpatch"
mkdir -p "$work"
. "$here/targets.sh"
runs=${RUNS:-9}
pause_target
tools=("$build/bin/iprobe")
[[ -n ${BASELINE:-} ]] && tools=("$(cd "$BASELINE" && pwd)/bin/iprobe" "${tools[@]}")
get() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$2"; }
# median and p90 (nearest rank) of the numbers on stdin
stats() { sort -n | awk '{ v[NR] = $1 } END { m = v[int((NR + 1) / 2)]; p = v[int(NR * 0.9 + 0.999)]; printf "%d / %d", m, p }'; }
# shellcheck disable=SC2086
start ${TARGET_PRIO:-} "$many_binary"
# A run that fails (set -e) must not leave its spinning target behind.
trap 'kill "$pid" 2>/dev/null || true' EXIT
sleep 0.5
# The first attach injects the runtime: kept out of the runs.
first=$("${tools[-1]}" attach "$pid" --handler count --json $("${tools[-1]}" attach --help | grep -q -- --completed && echo --completed))
"${tools[-1]}" detach "$pid" >/dev/null
for i in "${!tools[@]}"; do : >"$work/pause.$i"; done
for ((r = 0; r < runs; r++)); do
  for i in "${!tools[@]}"; do
    tool=${tools[$i]}
    both=(); "$tool" attach --help 2>/dev/null | grep -q -- --completed && both=(--completed)
    on=$("$tool" attach "$pid" --handler count "${both[@]}" --json)
    off=$("$tool" detach "$pid" --json)
    echo "$(get pause_us "$on") $(get stop_us "$on") $(get pause_us "$off") $(get stop_us "$off") $(get total_enabled "$on")" \
      >>"$work/pause.$i"
  done
done
kill "$pid"; wait "$pid" 2>/dev/null || true
printf '\n(load: %s; %s runs each, interleaved, one target of %s functions and %s threads (%s spinning) on %s CPUs, %s)\n' "$(cut -d' ' -f1-3 /proc/loadavg)" "$runs" "$fns" "$((threads + 1))" "$threads" "$(nproc)" "${TARGET_PRIO:-at nice 0}"
printf '\n| iprobe | probes | enable pause median / p90 | enable less stopping | disable pause | disable less stopping |\n|---|---|---|---|---|---|\n'
for i in "${!tools[@]}"; do
  tool=${tools[$i]} f="$work/pause.$i"
  label=$([[ $tool == "$build/bin/iprobe" ]] && echo "this build" || echo "baseline ($BASELINE)")
  echo "| $label | $(awk 'NR == 1 { print $5 }' "$f") | $(awk '{ print $1 }' "$f" | stats) us | $(awk '{ print $1 - $2 }' "$f" | stats) us | $(awk '{ print $3 }' "$f" | stats) us | $(awk '{ print $3 - $4 }' "$f" | stats) us |"
done
