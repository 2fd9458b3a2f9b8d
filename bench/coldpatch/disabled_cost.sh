#!/usr/bin/env bash
# Disabled cost of the -finstrument-functions flow (docs/design.md §9.1), side by
# side in one run, repetitions interleaved:
#   native        gcc, no instrumentation
#   finstrument   iprobe-cc's flags, hooks NOT patched: glibc's no-op
#                 __cyg_profile_func_enter/exit are called (IPROBE_COLDPATCH=0)
#   coldpatched   iprobe-cc: the hook calls are 5-byte NOPs
# on (a) the paper's micro-benchmark (ns per call of an empty function, thread
# CPU time) and (b) redis-server throughput (redis-benchmark, SET/GET, plain
# and pipelined) and the server's CPU time per request (/proc/PID/schedstat),
# which stays meaningful when other work shares the machine.
#
#   bench/coldpatch/disabled_cost.sh [--reps N] [--calls N] [--requests N] [--no-redis]
#
# Needs a built tree ($IPROBE_BUILD_DIR, default <repo>/build) with iprobe-cc.
# Prints a markdown table (paste it into bench/RESULTS.md with the command).
set -euo pipefail

reps=5
calls=100000000
requests=200000
redis=1
while (($#)); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --calls) calls=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --no-redis) redis=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${IPROBE_BUILD_DIR:-$root/build}" && pwd)"
cc="$build/bin/iprobe-cc"
[[ -x $cc ]] || { echo "build iprobe first: $cc missing" >&2; exit 7; }
work="$build/bench/coldpatch"
mkdir -p "$work"
variants=(native finstrument coldpatched)

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }'; }

# --- (a) micro-benchmark ---------------------------------------------------
src="$root/examples/microbench/microbench.c"
flags=(-O2 -std=gnu11)
gcc "${flags[@]}" "$src" -o "$work/micro-native"
IPROBE_COLDPATCH=0 "$cc" "${flags[@]}" "$src" -o "$work/micro-finstrument"
IPROBE_CC_QUIET=1 "$cc" "${flags[@]}" "$src" -o "$work/micro-coldpatched"

declare -A micro
for ((r = 1; r <= reps; r++)); do
  for v in "${variants[@]}"; do
    ns=$("$work/micro-$v" "$calls" | sed -n 's/.*ns_per_call=\([0-9.]*\).*/\1/p')
    micro[$v]+="$ns "
  done
done

echo "### micro-benchmark: empty function called $calls times, median of $reps interleaved runs"
echo
echo "| build | ns/call | vs native |"
echo "|---|---:|---:|"
base=$(tr ' ' '\n' <<<"${micro[native]}" | grep . | median)
for v in "${variants[@]}"; do
  m=$(tr ' ' '\n' <<<"${micro[$v]}" | grep . | median)
  echo "| $v | $m | $(pct "$m" "$base") |"
done
echo

# --- (b) redis ---------------------------------------------------------------
((redis)) || exit 0
declare -A dir
for v in "${variants[@]}"; do
  mode=$v
  [[ $v == finstrument ]] && mode=finstrument-unpatched
  [[ $v == coldpatched ]] && mode=finstrument
  server=$(IPROBE_BUILD_DIR=$build "$root/scripts/build-redis" --mode "$mode" "$build/redis/$mode")
  dir[$v]=$(dirname "$server")
done
client="${dir[native]}/redis-benchmark"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up
declare -A port
p=17400
for v in "${variants[@]}"; do
  port[$v]=$((p++))
  "${dir[$v]}/redis-server" --port "${port[$v]}" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize no --logfile /dev/null &
  pids+=($!)
done
for v in "${variants[@]}"; do
  for _ in $(seq 50); do "${dir[native]}/redis-cli" -p "${port[$v]}" PING >/dev/null 2>&1 && break; sleep 0.1; done
done

declare -A rps cpu
# CPU time the server's main thread spent (ns), from the scheduler: robust to
# other load on the machine, unlike throughput.
server_cpu_ns() { awk '{ print $1 }' "/proc/$1/schedstat"; }
declare -A pid_of
i=0
for v in "${variants[@]}"; do pid_of[$v]=${pids[$i]}; i=$((i + 1)); done
run_bench() {  # variant pipeline
  "$client" -p "${port[$1]}" -n "$requests" -t set,get -P "$2" -q 2>/dev/null | tr '\r' '\n' |
    awk -v v="$1" -v P="$2" '/requests per second/ { gsub(":", "", $1); print v, $1, P, $2 }'
}
for ((r = 1; r <= reps; r++)); do
  for v in "${variants[@]}"; do
    for P in 1 16; do
      before=$(server_cpu_ns "${pid_of[$v]}")
      while read -r var test pipe value; do
        rps[$var/$test/$pipe]+="$value "
      done < <(run_bench "$v" "$P")
      after=$(server_cpu_ns "${pid_of[$v]}")
      cpu[$v/$P]+="$(awk -v a="$after" -v b="$before" -v n="$requests" 'BEGIN { printf "%.1f", (a - b) / (2 * n) }') "
    done
  done
done

echo "### redis-server throughput: redis-benchmark -n $requests -t set,get (-P 1 and -P 16), median of $reps interleaved runs"
echo
echo "| build | SET rps | GET rps | SET -P16 rps | GET -P16 rps | throughput vs native (mean of 4) | server CPU ns/request | -P16 | CPU vs native | -P16 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for v in "${variants[@]}"; do
  row="| $v"
  sum=0
  for key in SET/1 GET/1 SET/16 GET/16; do
    t=${key%/*}
    P=${key#*/}
    m=$(tr ' ' '\n' <<<"${rps[$v/$t/$P]}" | grep . | median)
    b=$(tr ' ' '\n' <<<"${rps[native/$t/$P]}" | grep . | median)
    row+=" | $m"
    sum=$(awk -v s="$sum" -v m="$m" -v b="$b" 'BEGIN { print s + (m / b - 1) * 100 / 4 }')
  done
  row+=" | $(awk -v s="$sum" 'BEGIN { printf "%+.1f%%", s }')"
  for P in 1 16; do
    row+=" | $(tr ' ' '\n' <<<"${cpu[$v/$P]}" | grep . | median)"
  done
  for P in 1 16; do
    m=$(tr ' ' '\n' <<<"${cpu[$v/$P]}" | grep . | median)
    b=$(tr ' ' '\n' <<<"${cpu[native/$P]}" | grep . | median)
    row+=" | $(pct "$m" "$b")"
  done
  echo "$row |"
done
echo
probes=$("$build/bin/iprobe" list "${dir[coldpatched]}/redis-server" --count)
echo "redis-server coldpatched: $probes probes."
