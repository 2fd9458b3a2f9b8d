#!/usr/bin/env bash
# Disabled cost of every placeholder flow, side by side in one run, on a real
# interpreter built from Debian source (lua5.4, scripts/fetch-source) running
# bench/coldpatch/mixed.lua:
#   native-gcc     gcc -O2
#   finstrument    iprobe-cc --flow=finstrument (-finstrument-functions, hooks coldpatched to NOPs)
#   entry          iprobe-cc (the default flow, --flow=entry: -fpatchable-function-entry=5,0,
#                  one 5-byte NOP per function; exits through return trampolines)
#   native-clang   clang-14 -O2
#   llvm           iprobe-cc --flow=llvm (clang-14 + IProbePass: a patchable entry per function)
#   xray           clang-14 -fxray-instrument -fxray-instruction-threshold=1 (sleds unpatched)
# Instructions executed (valgrind callgrind, exact and independent of machine
# load) and CPU time (user+sys, median of --reps interleaved runs).  Nothing is
# attached: probes off.
#
#   bench/coldpatch/flows.sh [--reps N] [--scale N] [--redis|--redis-only] [--requests N]
#                            [--on [--on-scale N] [--on-requests N]]
#
# --on also measures probes on, in CPU time: every probe of each flow enabled
# (iprobe attach --handler count, then --handler trace, before the work
# starts), and XRay with every sled patched to a counting handler
# (xray_count.c, linked into the XRay builds).  Its runs use --on-scale
# (default 4) and --on-requests (default 500000): probes on cost several
# times more, and their ratios need no finer resolution.
#
# --redis also measures redis-server (scripts/build-redis; clang/xray builds
# here) under redis-benchmark -P 16 -c 50 -t set,get,incr,lpush,lpop: the
# server's CPU time (utime+stime from /proc) for --requests requests (median
# of --reps interleaved runs) and its instructions under callgrind for a
# tenth of them (startup included, the same for every variant).
#
# --scale repeats the script for the timed runs (default 4); callgrind runs it once.
#
# Needs a built tree ($IPROBE_BUILD_DIR, default <repo>/build) with iprobe-cc and IProbePass.
set -euo pipefail

reps=9
scale=4
redis=0
lua=1
on=0
requests=500000
on_scale=4
on_requests=500000
while (($#)); do
  case $1 in
    --redis) redis=1; shift ;;
    --redis-only) redis=1; lua=0; shift ;;
    --requests) requests=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --on) on=1; shift ;;
    --on-scale) on_scale=$2; shift 2 ;;
    --on-requests) on_requests=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${IPROBE_BUILD_DIR:-$root/build}" && pwd)"
cc="$build/bin/iprobe-cc"
[[ -x $cc && -f $build/lib/IProbePass.so ]] || { echo "build iprobe first (iprobe-cc, IProbePass)" >&2; exit 7; }
src="$("$root/scripts/fetch-source" lua5.4)/src"
work="$build/bench/flows"
mkdir -p "$work"
script="$root/bench/coldpatch/mixed.lua"
variants=(native-gcc finstrument entry native-clang llvm xray)
# probes on: variant:handler
on_variants=(finstrument:count entry:count llvm:count xray:count finstrument:trace entry:trace llvm:trace)
iprobe="$build/bin/iprobe"
clang-14 -O2 -c "$root/bench/coldpatch/xray_count.c" -o "$work/xray_count.o"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
base_of() { case $1 in native-gcc|finstrument|entry) echo native-gcc ;; *) echo native-clang ;; esac; }
# A table row: variant, probe sites, its and its native build's instruction counts, CPU-time samples.
row() {
  local m mb
  m=$(tr ' ' '\n' <<<"$5" | grep . | median)
  mb=$(tr ' ' '\n' <<<"$6" | grep . | median)
  printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" \
    "$(awk -v a="$3" -v b="$4" 'BEGIN { printf "%.3fx", a / b }')" "$m" \
    "$(awk -v a="$m" -v b="$mb" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }')"
}
# The probes-on table's rows: names of the arrays of CPU-time samples with
# probes on (by variant:handler) and off (by variant).
on_rows() {
  local -n samples_on=$1 samples_off=$2
  local vh v b m mb mo
  for vh in "${on_variants[@]}"; do
    v=${vh%%:*}; b=$(base_of "$v")
    m=$(tr ' ' '\n' <<<"${samples_on[$vh]}" | grep . | median)
    mb=$(tr ' ' '\n' <<<"${samples_off[$b]}" | grep . | median)
    mo=$(tr ' ' '\n' <<<"${samples_off[$v]}" | grep . | median)
    printf '| %s | %s | %s | %s | %s |\n' "$v" "${vh##*:}" "$m" \
      "$(awk -v a="$m" -v b="$mb" 'BEGIN { printf "%.2fx", a / b }')" \
      "$(awk -v a="$m" -v b="$mo" 'BEGIN { printf "%.2fx", a / b }')"
  done
}
# Probe sites of a build: the probe list's (an exit served by its entry's
# return trampoline has no site of its own), or XRay's sleds (32-byte
# xray_instr_map entries).
sites_of() {
  case $1 in
    native-*) echo - ;;
    xray) echo $(($(objdump -h "$2" | awk '$2 == "xray_instr_map" { print "0x" $3 }') / 32)) ;;
    *) "$build/bin/iprobe" list "$2" --json | grep -o '"form":"[a-z_0-9]*"' | grep -vc '"return"' ;;
  esac
}

if ((lua)); then
# lua's own Makefile flags (-O2, LUA_COMPAT_5_3, LUA_USE_LINUX), one compile+link step.
sources=()
for f in "$src"/*.c; do [[ $(basename "$f") == luac.c ]] || sources+=("$f"); done
# Debian's patched luaconf.h includes a header debian/rules generates.
echo '#define DEB_HOST_MULTIARCH "x86_64-linux-gnu"' >"$work/lua5.4-deb-multiarch.h"
flags=(-O2 -std=gnu99 -DLUA_COMPAT_5_3 -DLUA_USE_LINUX -I"$work" -Wno-unknown-attributes)
libs=(-Wl,-E -ldl -lm)
declare -A compiler=(
  [native-gcc]="gcc" [finstrument]="$cc --flow=finstrument" [entry]="$cc --flow=entry"
  [native-clang]="clang-14" [llvm]="$cc --flow=llvm"
  [xray]="clang-14 -fxray-instrument -fxray-instruction-threshold=1")
for v in "${variants[@]}"; do
  extra=()
  [[ $v == xray ]] && extra=("$work/xray_count.o")
  # shellcheck disable=SC2086
  IPROBE_CC_QUIET=1 ${compiler[$v]} "${flags[@]}" "${sources[@]}" "${extra[@]}" -o "$work/lua-$v" "${libs[@]}"
done
expected=$("$work/lua-native-gcc" "$script" "$scale")
for v in "${variants[@]}"; do
  [[ $("$work/lua-$v" "$script" "$scale") == "$expected" ]] || { echo "lua-$v prints another result" >&2; exit 1; }
done


declare -A ir
for v in "${variants[@]}"; do
  ir[$v]=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$work/lua-$v" "$script" 1 2>&1 >/dev/null |
    sed -n 's/.*Collected : //p')
done

declare -A cpu
for ((r = 1; r <= reps; r++)); do
  for v in "${variants[@]}"; do
    t=$( { /usr/bin/time -f '%U %S' "$work/lua-$v" "$script" "$scale" >/dev/null; } 2>&1 | awk '{ print $1 + $2 }')
    cpu[$v]+="$t "
  done
done

echo "### lua5.4 (Debian source) running bench/coldpatch/mixed.lua: probes off (instructions: scale 1; CPU: scale $scale)"
echo
echo "| build | probe sites | instructions (callgrind) | vs native | CPU s (median of $reps) | vs native |"
echo "|---|---:|---:|---:|---:|---:|"
for v in "${variants[@]}"; do
  b=$(base_of "$v")
  row "$v" "$(sites_of "$v" "$work/lua-$v")" "${ir[$v]//,/}" "${ir[$b]//,/}" "${cpu[$v]}" "${cpu[$b]}"
done

if ((on)); then
  # One run with every probe on: lua waits on a FIFO (LUA_INIT) while
  # iprobe attaches, then runs the script; prints its CPU seconds.
  lua_on() {  # variant handler
    local v=$1 h=$2 gate="$work/gate" tpid lpid
    if [[ $v == xray ]]; then
      { XRAY_COUNT=1 /usr/bin/time -f '%U %S' "$work/lua-$v" "$script" "$on_scale" >/dev/null; } 2>&1 | awk '{ print $1 + $2 }'
      return
    fi
    rm -f "$gate"; mkfifo "$gate"
    LUA_INIT="io.open('$gate'):read('l')" /usr/bin/time -f '%U %S' -o "$work/time.out" \
      "$work/lua-$v" "$script" "$on_scale" >/dev/null &
    tpid=$!
    for _ in $(seq 500); do lpid=$(pgrep -P "$tpid" || true); [[ -n $lpid ]] && break; sleep 0.01; done
    "$iprobe" attach "$lpid" --handler "$h" --ring-records 65536 >/dev/null
    echo go >"$gate"
    wait "$tpid"
    awk '{ print $1 + $2 }' "$work/time.out"
  }
  declare -A cpu_on cpu_off
  for ((r = 1; r <= reps; r++)); do
    for v in "${variants[@]}"; do
      cpu_off[$v]+="$( { /usr/bin/time -f '%U %S' "$work/lua-$v" "$script" "$on_scale" >/dev/null; } 2>&1 |
        awk '{ print $1 + $2 }') "
    done
    for vh in "${on_variants[@]}"; do cpu_on[$vh]+="$(lua_on "${vh%%:*}" "${vh##*:}") "; done
  done
  echo
  echo "### lua5.4 running bench/coldpatch/mixed.lua: probes on (every probe of the build; CPU: scale $on_scale, median of $reps, probes-off runs interleaved)"
  echo
  echo "| build | handler | CPU s | vs native | vs the same build, probes off |"
  echo "|---|---|---:|---:|---:|"
  on_rows cpu_on cpu_off
fi
fi

((redis)) || exit 0

# ----------------------------------------------------------------------- redis
rsrc="$("$root/scripts/fetch-source" redis)"
declare -A server
for v in native-gcc finstrument entry; do
  mode=${v#native-}; [[ $mode == gcc ]] && mode=native
  server[$v]=$(IPROBE_BUILD_DIR=$build "$root/scripts/build-redis" --mode "$mode" "$build/redis/$mode")
done
# valgrind 3.19 cannot read clang-14's default DWARF 5: clang builds use DWARF 4.
server[llvm]=$(IPROBE_BUILD_DIR=$build IPROBE_REDIS_CFLAGS=-gdwarf-4 "$root/scripts/build-redis" --mode llvm \
  "$build/redis/llvm-dwarf4")
build_with_cc() {  # variant, compiler command[, object to link in]
  local out="$work/redis-$1"
  if [[ ! -f $out/.bench-done ]]; then
    rm -rf "$out" && mkdir -p "$out" && cp -a "$rsrc/." "$out/"
    make -C "$out" -j2 CC="$2" CFLAGS=-gdwarf-4 LDFLAGS="${3:-}" MALLOC=libc USE_SYSTEMD=no BUILD_TLS=no >"$out/build.log" 2>&1 ||
      { tail -20 "$out/build.log" >&2; echo "redis build ($1) failed" >&2; exit 1; }
    touch "$out/.bench-done"
  fi
  server[$1]="$out/src/redis-server"
}
build_with_cc native-clang clang-14
build_with_cc xray "clang-14 -fxray-instrument -fxray-instruction-threshold=1" "$work/xray_count.o"

server_cpu=() client_cpu=()
if (($(nproc) >= 2)); then server_cpu=(taskset -c 0); client_cpu=(taskset -c 1); fi
tests=set,get,incr,lpush,lpop
port=$((20000 + RANDOM % 20000))
wait_ping() { for _ in $(seq 600); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }
serve() {  # variant n [wrapper...] -> prints the server's CPU seconds; $handler set: probes on
  local v=$1 n=$2 pid ticks; shift 2
  XRAY_COUNT=$([[ -n ${handler:-} && $v == xray ]] && echo 1 || echo 0) \
    "${server_cpu[@]}" "$@" "${server[$v]}" --port "$port" --save '' --appendonly no --daemonize no \
    --logfile /dev/null >/dev/null 2>&1 &
  pid=$!
  wait_ping || { echo "redis ($v) did not start" >&2; kill "$pid"; exit 1; }
  if [[ -n ${handler:-} && $v != xray ]]; then
    "$iprobe" attach "$pid" --handler "$handler" --ring-records 65536 >/dev/null
  fi
  "${client_cpu[@]}" redis-benchmark -p "$port" -n "$n" -c 50 -P 16 -t "$tests" -q >/dev/null 2>&1
  ticks=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$pid"
  wait "$pid" 2>/dev/null || true
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f\n", t / hz }'
}
rvariants=(native-gcc finstrument entry native-clang llvm xray)
declare -A rir rcpu
for v in "${rvariants[@]}"; do
  out="$work/redis-cg.$v"
  serve "$v" $((requests / 10)) valgrind --tool=callgrind --callgrind-out-file="$out" >/dev/null
  rir[$v]=$(awk '/^(summary|totals):/ { print $2; exit }' "$out"); rm -f "$out"
done
for ((r = 1; r <= reps; r++)); do
  for v in "${rvariants[@]}"; do rcpu[$v]+="$(serve "$v" "$requests") "; done
done
echo
echo "### redis-server 7.0 (Debian source), redis-benchmark -c 50 -P 16 -t $tests: probes off"
echo
echo "| build | probe sites | instructions ($((requests / 10)) req, callgrind) | vs native | server CPU s ($requests req, median of $reps) | vs native |"
echo "|---|---:|---:|---:|---:|---:|"
for v in "${rvariants[@]}"; do
  b=$(base_of "$v")
  row "$v" "$(sites_of "$v" "${server[$v]}")" "${rir[$v]}" "${rir[$b]}" "${rcpu[$v]}" "${rcpu[$b]}"
done

((on)) || exit 0
declare -A rcpu_on rcpu_off
for ((r = 1; r <= reps; r++)); do
  for v in "${rvariants[@]}"; do rcpu_off[$v]+="$(serve "$v" "$on_requests") "; done
  for vh in "${on_variants[@]}"; do rcpu_on[$vh]+="$(handler=${vh##*:} serve "${vh%%:*}" "$on_requests") "; done
done
echo
echo "### redis-server 7.0, redis-benchmark -c 50 -P 16 -t $tests: probes on (every probe of the build; server CPU s, $on_requests req, median of $reps, probes-off runs interleaved)"
echo
echo "| build | handler | server CPU s | vs native | vs the same build, probes off |"
echo "|---|---|---:|---:|---:|"
on_rows rcpu_on rcpu_off
