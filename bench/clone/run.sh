#!/usr/bin/env bash
# Clone freeze benchmark (DESIGN.md §9.6): production freeze time and the
# worst latency a running redis-benchmark client sees while `iprobe clone`
# checkpoints a redis holding 10 MB ... 1 GB.  Side by side in one run: the
# same client against the same server without a clone (baseline).
#
#   sudo bench/clone/run.sh                 # sizes 10 100 1000 (MB)
#   sudo bench/clone/run.sh 10 100          # chosen sizes
#   IPROBE_BUILD_DIR=build-x bench/clone/run.sh
#
# Needs root, a built iprobe (scripts/build) and CRIU (scripts/setup).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${IPROBE_BUILD_DIR:-$root/build}"
iprobe="$build/bin/iprobe"
sizes=("$@")
((${#sizes[@]})) || sizes=(10 100 1000)
value_size=1000          # bytes per value; keys = MB * 1000
clients=4

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces)" >&2; exit 4; }
[[ -x $iprobe ]] || { echo "no $iprobe: build first (scripts/build)" >&2; exit 5; }

ns="iprobe-bench-$$"
clone="iprobe-bench-clone-$$"
port=17379
work="$(mktemp -d)"
redis_pid=
cleanup() {
  "$iprobe" clone --destroy "$clone" >/dev/null 2>&1 || true
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$ns"
ip -n "$ns" link set lo up
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }
cli() { in_ns redis-cli -p "$port" "$@"; }

# redis-benchmark's CSV: "test","rps","avg","min","p50","p95","p99","max"
bench_max() { awk -F'"' '/^"GET"/ { print $16 }' "$1"; }
bench_rps() { awk -F'"' '/^"GET"/ { print $4 }' "$1"; }

printf '%-8s %-10s %10s %10s %10s %10s %12s %12s %8s\n' \
  "size_MB" "used_MB" "freeze_ms" "stop_ms" "dump_ms" "total_ms" "max_lat_ms" "base_max_ms" "errors"
for mb in "${sizes[@]}"; do
  setsid nsenter --net="/run/netns/$ns" /usr/bin/redis-server --port "$port" --save '' --appendonly no \
    --daemonize no --dir "$work" --logfile "$work/redis.log" --enable-debug-command yes </dev/null >/dev/null 2>&1 &
  redis_pid=$!
  for _ in $(seq 100); do [[ $(cli PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
  cli DEBUG POPULATE $((mb * 1000)) key "$value_size" >/dev/null
  used=$(cli INFO memory | awk -F: '/^used_memory:/ { printf "%.0f", $2 / 1048576 }')

  # Baseline: calibrate the request rate and the client's own worst latency.
  in_ns redis-benchmark -p "$port" -t get -r $((mb * 1000)) -n 100000 -c "$clients" --csv >"$work/base.csv" 2>/dev/null
  rps=$(bench_rps "$work/base.csv"); base_max=$(bench_max "$work/base.csv")
  # Long enough to cover the clone (about 1 s per 100 MB here, plus margin).
  requests=$(awk -v r="$rps" -v mb="$mb" 'BEGIN { printf "%d", r * (3 + mb / 50) }')

  in_ns redis-benchmark -p "$port" -t get -r $((mb * 1000)) -n "$requests" -c "$clients" --csv \
    >"$work/during.csv" 2>"$work/during.err" &
  bench=$!
  sleep 1
  "$iprobe" clone "$redis_pid" --netns "$clone" --no-default-snapshots --json >"$work/clone.json"
  wait "$bench"
  max=$(bench_max "$work/during.csv")
  errors=$(grep -ci error "$work/during.err" || true)
  read -r freeze stop dump total < <(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(*("%.1f" % (j[k] / 1000) for k in ("freeze_us", "freezing_us", "dump_us", "total_us")))' "$work/clone.json")
  # The clone must really hold the data.
  clone_keys=$(nsenter --net="/run/netns/$clone" redis-cli -p "$port" DBSIZE)
  [[ $clone_keys == $((mb * 1000)) ]] || echo "warning: clone has $clone_keys keys, expected $((mb * 1000))" >&2
  printf '%-8s %-10s %10s %10s %10s %10s %12s %12s %8s\n' \
    "$mb" "$used" "$freeze" "$stop" "$dump" "$total" "$max" "$base_max" "$errors"
  "$iprobe" clone --destroy "$clone" >/dev/null
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=
done
