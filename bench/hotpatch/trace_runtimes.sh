#!/usr/bin/env bash
# The trace handler's event on loop.c's empty function (entry flow) under
# several runtimes, in interleaved rounds: each round runs every runtime once
# (a fresh process each, `attach --runtime`), so a change of the machine's
# load falls on all of them alike.  For differences of a few tenths of a ns
# an event, where trace_event.sh's fastest of 3 cannot tell them apart.
# Prints per runtime and size the fastest and the mean ns an event (per call / 2)
# and, with INSTRUCTIONS=1, the instructions of one traced call (the
# 2001st, so the thread's claims are done), counted by gdb's stepi.
# usage: bench/hotpatch/trace_runtimes.sh BUILD_DIR RUNTIME.so...   (as root; run alone)
# env: ROUNDS (default 25), MAX_EXP (default 6; sizes 10^5 and up are printed),
#      ENTRY_ONLY=1: the entry-only trace (`attach --entry-only`: one event a call)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "$1" && pwd)"
shift
(($#)) || { echo "usage: $0 BUILD_DIR RUNTIME.so..." >&2; exit 2; }
here="$root/bench/hotpatch"
iprobe="$build/bin/iprobe"
work="$build/bench-hotpatch"
max_exp=${MAX_EXP:-6}
rounds=${ROUNDS:-25}
repeats=1
entry_only=(); events_a_call=2
[[ ${ENTRY_ONLY:-0} == 1 ]] && { entry_only=(--entry-only); events_a_call=1; }
mkdir -p "$work"
cmake --build "$build" --target iprobe iprobe-hotpatch iprobe-probes iprobe-cc iprobe_rt >/dev/null
. "$here/targets.sh"  # log, start, finish, run_variant
export IPROBE_CC_QUIET=1
"$build/bin/iprobe-cc" --pad-threshold=0 -O2 -o "$work/loop_iprobe" "$here/loop.c" -lpthread

all="$work/trace_runtimes.all"
: >"$all"
for ((k = 0; k < rounds; k++)); do
  i=0
  for rt in "$@"; do
    run_variant "runtime$i" "$work/loop_iprobe" --functions empty "${entry_only[@]}" --ring-records 8388608 --runtime "$rt"
    awk -v i="$i" -v e="$events_a_call" '$1 >= 100000 { print i, $1, $2 / e }' "$work/result.runtime$i" >>"$all"
    i=$((i + 1))
  done
done

count_instructions() {  # RUNTIME: instructions of the 2001st traced call, site to caller
  start "$work/loop_iprobe" "$max_exp"
  "$iprobe" attach "$pid" --functions empty "${entry_only[@]}" --ring-records 8388608 --runtime "$1" >/dev/null
  gdb -p "$pid" -batch -ex 'set pagination off' -ex 'hbreak empty' -ex 'ignore 1 2000' \
    -ex 'queue-signal SIGUSR1' -ex 'continue' -ex 'python
import gdb
ret = int(gdb.parse_and_eval("*(unsigned long*)$rsp"))
n = 0
while int(gdb.parse_and_eval("$pc")) != ret and n < 10000:
    gdb.execute("stepi", to_string=True)
    n += 1
print("instructions", n)
' -ex 'kill' 2>/dev/null | awk '$1 == "instructions" { print $2 }'
  wait "$pid" 2>/dev/null || true
}

printf '| runtime | calls | fastest ns/event | mean ns/event |'
[[ ${INSTRUCTIONS:-0} == 1 ]] && printf ' instructions a call |'
printf '\n|---|---|---|---|'
[[ ${INSTRUCTIONS:-0} == 1 ]] && printf -- '---|'
printf '\n'
i=0
for rt in "$@"; do
  ins=
  [[ ${INSTRUCTIONS:-0} == 1 ]] && ins=$(count_instructions "$rt")
  awk -v i="$i" -v rt="$rt" -v ins="$ins" '$1 == i {
      k = $2; if (!(k in m) || $3 < m[k]) m[k] = $3; s[k] += $3; c[k]++ }
    END { for (k in m) {
        printf "| %s | 10^%d | %.2f | %.2f |", rt, length(k) - 1, m[k], s[k] / c[k]
        if (ins != "") printf " %s |", ins
        printf "\n" } }' "$all" | sort -t'|' -k3
  i=$((i + 1))
done
echo "(thread CPU ns, $rounds interleaved rounds, one process per runtime per round)"
