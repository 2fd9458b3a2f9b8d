#!/usr/bin/env bash
# Disabled cost of placeholders, side by side in one run (docs/design.md §9.1):
#   native gcc / native clang-14
#   finstrument+coldpatch   iprobe-cc (gcc -finstrument-functions, calls -> NOPs)
#   llvm-pass               iprobe-cc --mode=llvm (clang-14 + IProbePass.so)
#   xray                    clang-14 -fxray-instrument -fxray-instruction-threshold=1 (sleds unpatched)
# on the empty-function micro-benchmark (examples/microbench) and on redis
# (redis-benchmark throughput).  Prints a table per benchmark.
#
#   bench/llvm/run.sh [--calls N] [--rounds R] [--requests N] [--no-redis] [--enabled]
#
# --enabled also measures the enabled cost per call (iprobe attach, count and
# trace handlers) of the LLVM flow next to the -finstrument-functions flow,
# on bench/hotpatch/loop.c (as root; 10^7 calls, best of 3).
#
# Variants run interleaved, round after round.  The table shows the best
# round (least disturbed by other load on the machine) and the median.
# Server pinned to CPU 0 and client to CPU 1 when there are two CPUs.
# Needs a build with targets iprobe-cc, IProbePass, iprobe-probes ($IPROBE_BUILD_DIR, default build/).
set -euo pipefail

calls=100000000
rounds=5
requests=200000
redis=1
enabled=0
while (($#)); do
  case $1 in
    --calls) calls=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --no-redis) redis=0; shift ;;
    --enabled) enabled=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "usage: bench/llvm/run.sh [--calls N] [--rounds R] [--requests N] [--no-redis]" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${IPROBE_BUILD_DIR:-$root/build}"
build="$(cd "$build" && pwd)"
export IPROBE_BUILD_DIR=$build
work="$build/bench-llvm"
mkdir -p "$work"
log() { printf 'bench/llvm: %s\n' "$*" >&2; }
[[ -x $build/bin/iprobe-cc && -f $build/lib/IProbePass.so ]] ||
  { log "build iprobe-cc and IProbePass in $build first (scripts/build)"; exit 7; }

server_cpu=() client_cpu=()
if (($(nproc) >= 2)); then server_cpu=(taskset -c 0); client_cpu=(taskset -c 1); fi

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
lowest() { sort -g | head -1; }
highest() { sort -g | tail -1; }
samples() { tr ' ' '\n' <<<"$1" | grep .; }

variants=(native-gcc native-clang finstrument-coldpatched llvm-pass xray)

# ---------------------------------------------------------------- microbench
src="$root/examples/microbench/microbench.c"
mb="$work/microbench"
mkdir -p "$mb"
log "building microbench variants in $mb"
gcc -O2 "$src" -o "$mb/native-gcc"
clang-14 -O2 -Wno-unknown-attributes "$src" -o "$mb/native-clang"
IPROBE_CC_QUIET=1 "$build/bin/iprobe-cc" -O2 "$src" -o "$mb/finstrument-coldpatched"
"$build/bin/iprobe-cc" --mode=llvm -O2 -Wno-unknown-attributes "$src" -o "$mb/llvm-pass"
clang-14 -O2 -Wno-unknown-attributes -fxray-instrument -fxray-instruction-threshold=1 "$src" -o "$mb/xray"

declare -A mb_samples
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    ns=$("${server_cpu[@]}" "$mb/$v" "$calls" | sed -n 's/.*ns_per_call=\([0-9.]*\).*/\1/p')
    mb_samples[$v]+="$ns "
  done
done
echo
# Instructions executed per call, exact and immune to machine load:
# callgrind's Ir for 2M calls minus 1M calls, over 1M.
declare -A mb_ir
if command -v valgrind >/dev/null; then
  ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2" 2>&1 | sed -n 's/.*Collected : //p'; }
  for v in "${variants[@]}"; do
    mb_ir[$v]=$(awk -v a="$(ir "$mb/$v" 1000000)" -v b="$(ir "$mb/$v" 2000000)" 'BEGIN { printf "%.2f", (b - a) / 1000000 }')
  done
fi
echo "instructions per loop iteration (call + loop), exact (valgrind callgrind):"
for v in "${variants[@]}"; do
  case $v in native-gcc|finstrument-coldpatched) b=native-gcc ;; *) b=native-clang ;; esac
  [[ -n ${mb_ir[$v]:-} ]] && printf '  %-24s %6.2f  (%+.2f vs %s)\n' "$v" "${mb_ir[$v]}" \
    "$(awk -v a="${mb_ir[$v]}" -v b="${mb_ir[$b]}" 'BEGIN { print a - b }')" "$b"
done
echo
echo "empty-function micro-benchmark: $calls calls, $rounds rounds (ns per call; best round, and median)"
printf '%-26s %9s %12s %9s %12s\n' variant best "vs native" median "vs native"
for v in "${variants[@]}"; do
  case $v in native-gcc|finstrument-coldpatched) b=native-gcc ;; *) b=native-clang ;; esac
  best=$(samples "${mb_samples[$v]}" | lowest); best_base=$(samples "${mb_samples[$b]}" | lowest)
  med=$(samples "${mb_samples[$v]}" | median); med_base=$(samples "${mb_samples[$b]}" | median)
  printf '%-26s %9.3f %+9.3f ns %9.3f %+9.3f ns  (vs %s)\n' "$v" "$best" \
    "$(awk -v a="$best" -v b="$best_base" 'BEGIN { print a - b }')" "$med" \
    "$(awk -v a="$med" -v b="$med_base" 'BEGIN { print a - b }')" "$b"
done

# ------------------------------------------------------------ enabled cost
if ((enabled)); then
  loop="$root/bench/hotpatch/loop.c"
  IPROBE_CC_QUIET=1 "$build/bin/iprobe-cc" -O2 -o "$mb/loop-finstrument" "$loop" -lpthread
  "$build/bin/iprobe-cc" --mode=llvm -O2 -Wno-unknown-attributes -o "$mb/loop-llvm" "$loop" -lpthread
  enabled_ns() {  # binary handler|disabled -> ns per call at 10^7 calls, best of 3
    local best= out pid ns
    for _ in 1 2 3; do
      out="$mb/loop.out.$RANDOM"
      "${server_cpu[@]}" "$1" 7 >"$out" 2>&1 &
      pid=$!
      for _ in $(seq 500); do grep -q ready "$out" 2>/dev/null && break; sleep 0.01; done
      if [[ $2 != disabled ]]; then
        "$build/bin/iprobe" attach "$pid" --functions empty --handler "$2" --ring-records 8388608 >/dev/null
      fi
      kill -USR1 "$pid"; wait "$pid" || true
      ns=$(awk '$1 == 10000000 { print $2 }' "$out"); rm -f "$out"
      [[ -z $best ]] || awk -v a="$ns" -v b="$best" 'BEGIN { exit !(a < b) }' && best=$ns
    done
    echo "$best"
  }
  echo
  echo "enabled cost: bench/hotpatch/loop.c, 10^7 calls of empty(), best of 3 (ns per call = entry + exit event)"
  printf '%-26s %10s %10s %10s\n' flow disabled count trace
  for flow in finstrument llvm; do
    printf '%-26s %10s %10s %10s\n' "$flow" "$(enabled_ns "$mb/loop-$flow" disabled)" \
      "$(enabled_ns "$mb/loop-$flow" count)" "$(enabled_ns "$mb/loop-$flow" trace)"
  done
fi

((redis)) || exit 0

# --------------------------------------------------------------------- redis
rsrc="$("$root/scripts/fetch-source" redis)"
declare -A server
log "building redis variants (scripts/build-redis; xray/native-clang here), logs in $work/redis-*/build.log"
server[native-gcc]=$("$root/scripts/build-redis" --mode native "$work/redis-native-gcc")
server[finstrument-coldpatched]=$("$root/scripts/build-redis" --mode finstrument "$work/redis-finstrument")
server[llvm-pass]=$("$root/scripts/build-redis" --mode llvm "$work/redis-llvm")
build_with_cc() {  # name, compiler command
  local out="$work/redis-$1"
  if [[ ! -f $out/.bench-done ]]; then
    rm -rf "$out" && mkdir -p "$out" && cp -a "$rsrc/." "$out/"
    make -C "$out" -j2 CC="$2" MALLOC=libc USE_SYSTEMD=no BUILD_TLS=no >"$out/build.log" 2>&1 ||
      { tail -20 "$out/build.log" >&2; log "redis build ($1) failed"; exit 1; }
    touch "$out/.bench-done"
  fi
  server[$1]="$out/src/redis-server"
}
build_with_cc native-clang "clang-14"
build_with_cc xray "clang-14 -fxray-instrument -fxray-instruction-threshold=1"

tests=set,get,incr,lpush,lpop
port=$((20000 + RANDOM % 20000))
run_redis() {  # variant -> prints "TEST rps" lines
  local pid
  "${server_cpu[@]}" "${server[$1]}" --port "$port" --save '' --appendonly no --daemonize no \
    --logfile /dev/null >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  "${client_cpu[@]}" redis-benchmark -p "$port" -n "$requests" -c 50 -P 16 -t "$tests" --csv 2>/dev/null |
    awk -F'"' 'NR > 1 { print $2, $4 }'
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
declare -A rps
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    while read -r test value; do rps[$v,$test]+="$value "; done < <(run_redis "$v")
  done
done
echo
echo "redis-benchmark -n $requests -c 50 -P 16 -t $tests: $rounds rounds; requests/s of the best round, % vs native of the same compiler (median in brackets)"
printf '%-26s' variant
IFS=, read -ra names <<<"${tests^^}"
for t in "${names[@]}"; do printf '%26s' "$t"; done
echo
for v in "${variants[@]}"; do
  printf '%-26s' "$v"
  case $v in native-gcc|finstrument-coldpatched) b=native-gcc ;; *) b=native-clang ;; esac
  for t in "${names[@]}"; do
    best=$(samples "${rps[$v,$t]}" | highest); best_base=$(samples "${rps[$b,$t]}" | highest)
    med=$(samples "${rps[$v,$t]}" | median); med_base=$(samples "${rps[$b,$t]}" | median)
    printf '%9.0f %+6.1f%% (%+6.1f%%)' "$best" "$(awk -v a="$best" -v b="$best_base" 'BEGIN { print (a / b - 1) * 100 }')" \
      "$(awk -v a="$med" -v b="$med_base" 'BEGIN { print (a / b - 1) * 100 }')"
  done
  echo
done
