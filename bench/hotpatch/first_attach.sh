#!/usr/bin/env bash
# The pauses of a FIRST attach (the runtime injected, the region and stub
# areas made) to a fresh target each run, this build beside BASELINE builds,
# interleaved: the longest pause, each stop's (prepare_pause_us,
# write_pause_us; one stop: prepare 0) and the attach's wall time.  Then a
# detach, and the target is killed.
# usage: bench/hotpatch/first_attach.sh [BUILD_DIR]
#   env: BASELINE="DIR..." (builds to compare), RUNS (5), TARGET=many|node,
#        PROBES (10000: many's functions are PROBES/2, 8 spinning threads),
#        FUNCTIONS (a --functions glob; empty: every function), ATTACH_ARGS (e.g. --completed),
#        NODE_SCRIPT (node: a script that keeps running; default: a timer doing work)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
work="$build/bench-hotpatch"
mkdir -p "$work"
. "$here/targets.sh"
runs=${RUNS:-5}
tools=()
for b in ${BASELINE:-}; do tools+=("$(cd "$b" && pwd)/bin/iprobe"); done
tools+=("$build/bin/iprobe")
# a number field of a JSON line; 0 when absent (a build before the field)
get() { local v; v=$(sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$2"); echo "${v:-0}"; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
max() { sort -n | tail -1; }
select=(); [[ -n ${FUNCTIONS:-} ]] && select=(--functions "$FUNCTIONS")
# shellcheck disable=SC2206
select+=(${ATTACH_ARGS:-})
case ${TARGET:-many} in
  many) pause_target; launch() { start "$many_binary"; } ;;
  node)
    script=${NODE_SCRIPT:-$work/keeps_running.js}
    [[ -n ${NODE_SCRIPT:-} ]] || cat >"$script" <<'JS'
let n = 0;
console.log('ready');
setInterval(() => { let s = 0; for (let i = 0; i < 20000; i++) s += Math.sqrt(i); if (++n % 100 == 0) console.log(n, s); }, 10);
JS
    launch() { start node "$script"; } ;;
  *) log "TARGET is many or node"; exit 2 ;;
esac
trap 'kill "$pid" 2>/dev/null || true' EXIT
for i in "${!tools[@]}"; do : >"$work/first.$i"; done
for ((r = 0; r < runs; r++)); do
  for i in "${!tools[@]}"; do
    launch
    sleep 0.5
    t0=$(date +%s%N)
    on=$("${tools[$i]}" attach "$pid" --handler count "${select[@]}" --json)
    t1=$(date +%s%N)
    "${tools[$i]}" detach "$pid" >/dev/null
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "$(get pause_us "$on") $(get prepare_pause_us "$on") $(get write_pause_us "$on") $(((t1 - t0) / 1000)) $(get total_enabled "$on")" \
      >>"$work/first.$i"
  done
done
printf '\n(load: %s; %s first attaches each, interleaved, a fresh %s each; --functions %s %s)\n' \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$runs" "${TARGET:-many}" "${FUNCTIONS:-(all)}" "${ATTACH_ARGS:-}"
printf '\n| iprobe | probes | longest pause median / max | preparation stop | write stop | attach wall time |\n|---|---|---|---|---|---|\n'
for i in "${!tools[@]}"; do
  f="$work/first.$i"
  col() { awk -v c="$1" '{ print $c }' "$f"; }
  echo "| ${tools[$i]%/bin/iprobe} | $(awk 'NR == 1 { print $5 }' "$f") | $(col 1 | median) / $(col 1 | max) us | $(col 2 | median) us | $(col 3 | median) us | $(($(col 4 | median) / 1000)) ms |"
done
