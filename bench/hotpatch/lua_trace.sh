#!/usr/bin/env bash
# A complete trace of a real program, side by side with uftrace: lua 5.4
# (Debian source) running bench/coldpatch/mixed.lua with every function
# traced, entries and exits, to a file.
#   plain        lua built with iprobe-cc, no probe on
#   iprobe       the same binary, every probe on (trace handler), written by
#                `iprobe trace --output FILE --lossless`
#   uftrace      lua built with gcc -pg, `uftrace record` (every function)
# Each lua waits on its stdin before running the script (lua -e 'io.read()'),
# so the probes and the writer are in place first; the wall time is from
# then until the trace file is complete.
# usage: bench/hotpatch/lua_trace.sh [BUILD_DIR]   env: SCALE (mixed.lua's, default 1), RUNS (default 1),
#   BASELINE_RUNTIME=libiprobe-rt.so of another build: its iprobe leg run too, just before this build's
#   (the file must be named libiprobe-rt.so: `iprobe trace` finds the region by the runtime's name)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
iprobe="$build/bin/iprobe"
work="$build/bench/lua_trace"
mkdir -p "$work"
scale=${SCALE:-1}
runs=${RUNS:-1}
script="$root/bench/coldpatch/mixed.lua"
src="$("$root/scripts/fetch-source" lua5.4)/src"
sources=()
for f in "$src"/*.c; do [[ $(basename "$f") == luac.c ]] || sources+=("$f"); done
echo '#define DEB_HOST_MULTIARCH "x86_64-linux-gnu"' >"$work/lua5.4-deb-multiarch.h"
flags=(-O2 -std=gnu99 -DLUA_COMPAT_5_3 -DLUA_USE_LINUX -I"$work" -Wno-unknown-attributes)
[[ -x $work/lua-entry ]] || IPROBE_CC_QUIET=1 "$build/bin/iprobe-cc" "${flags[@]}" "${sources[@]}" -o "$work/lua-entry" -Wl,-E -ldl -lm
[[ -x $work/lua-pg ]] || gcc -pg "${flags[@]}" "${sources[@]}" -o "$work/lua-pg" -Wl,-E -ldl -lm
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# iprobe_leg [ATTACH ARGS...]: lua with every probe on, the lossless writer
# draining into a file; sets traced (wall s), events, dropped, bytes, probes,
# lua_ms and writer_ms (CPU).
iprobe_leg() {
  rm -f "$work/go" "$work/iprobe.trace"; mkfifo "$work/go"
  "$work/lua-entry" -e 'io.read()' "$script" "$scale" <"$work/go" >/dev/null &
  lua=$!
  exec 3>"$work/go"
  "$iprobe" attach "$lua" --buffer 4M --json "$@" >"$work/attach.json"
  # The CPU each side spent (perf stat's task-clock): the writer's per event,
  # and the target's, which with a writer that keeps up is the floor.
  perf stat -x, -e task-clock -o "$work/writer.cpu" -- "$iprobe" trace "$lua" --output "$work/iprobe.trace" --lossless 2>"$work/trace.err" &
  writer=$!
  perf stat -x, -e task-clock -o "$work/lua.cpu" -p "$lua" &
  lua_cpu=$!
  sleep 0.5
  t0=$(now); echo >&3; exec 3>&-
  wait "$lua"; wait "$writer"
  traced=$(elapsed "$t0" "$(now)")
  wait "$lua_cpu" || true
  cpu_ms() { awk -F, '/task-clock/ { printf "%.0f", $1 }' "$1"; }
  writer_ms=$(cpu_ms "$work/writer.cpu"); lua_ms=$(cpu_ms "$work/lua.cpu")
  events=$(sed -n 's/^iprobe: \([0-9]*\) events written.*/\1/p' "$work/trace.err")
  dropped=$(sed -n 's/.* \([0-9]*\) events dropped.*/\1/p' "$work/trace.err"); dropped=${dropped:-0}
  bytes=$(stat -c %s "$work/iprobe.trace")
  probes=$(sed -n 's/.*"total_enabled":\([0-9]*\).*/\1/p' "$work/attach.json")
}

for ((r = 0; r < runs; r++)); do
  # plain
  t0=$(now); "$work/lua-entry" "$script" "$scale" >/dev/null; plain=$(elapsed "$t0" "$(now)")

  # the baseline runtime first (when given), then this build's, each keeping its numbers
  b_traced= b_events= b_dropped= b_lua_ms=
  if [[ -n ${BASELINE_RUNTIME:-} ]]; then
    iprobe_leg --runtime "$BASELINE_RUNTIME"
    b_traced=$traced b_events=$events b_dropped=$dropped b_lua_ms=$lua_ms
  fi
  iprobe_leg

  # uftrace: the -pg build, every function
  rm -rf "$work/uftrace.data"
  t0=$(now)
  uftrace record --no-libcall -d "$work/uftrace.data" "$work/lua-pg" "$script" "$scale" >/dev/null
  uf=$(elapsed "$t0" "$(now)")
  ufbytes=$(du -cb "$work"/uftrace.data/*.dat | tail -n 1 | cut -f1)
  ufevents=$((ufbytes / 16))  # uftrace's records: 16 bytes an entry or exit (struct uftrace_record, no arguments)

  printf '\n| run | plain lua | iprobe trace --lossless (%s probes) | uftrace record | iprobe events written | dropped | bytes/event | events/s written | uftrace events (data / 16 B) | uftrace events/s | iprobe / uftrace events/s | lua CPU | writer CPU | writer ns/event |' "$probes"
  [[ -n $b_traced ]] && printf ' baseline runtime: iprobe wall | events (dropped) | iprobe / uftrace events/s | lua CPU |'
  printf '\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|'
  [[ -n $b_traced ]] && printf -- '---|---|---|---|'
  echo
  awk -v r="$r" -v p="$plain" -v t="$traced" -v u="$uf" -v e="$events" -v d="$dropped" -v b="$bytes" -v ue="$ufevents" -v lc="$lua_ms" -v wc="$writer_ms" \
    -v bt="$b_traced" -v be="$b_events" -v bd="$b_dropped" -v blc="$b_lua_ms" \
    'BEGIN { printf "| %d | %.2f s | %.2f s | %.2f s | %d | %d | %.1f | %.1fM | %d | %.1fM | %.2f | %.2f s | %.2f s | %.1f |", r, p, t, u, e, d, b / e, e / t / 1e6, ue, ue / u / 1e6, (e / t) / (ue / u), lc / 1e3, wc / 1e3, wc * 1e6 / e
             if (bt != "") printf " %.2f s | %d (%d) | %.2f | %.2f s |", bt, be, bd, (be / bt) / (ue / u), blc / 1e3
             printf "\n" }'
  rm -rf "$work/uftrace.data" "$work/iprobe.trace"
done
