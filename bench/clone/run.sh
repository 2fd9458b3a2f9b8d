#!/usr/bin/env bash
# Clone freeze benchmark (docs/design.md §9.6): production freeze time and the
# worst latency a running redis-benchmark client sees while its redis is
# checkpointed, for redis holding 10 MB ... 1 GB.  Side by side in one run,
# on the same server:
#   base      the client alone (its own worst latency, no checkpoint)
#   criu-tcp  a plain `criu dump --leave-running --tcp-established` (CRIU's
#             live-migration mode: established connections are dumped and
#             the network is locked with iptables while frozen)
#   iprobe    `iprobe clone` (dump --leave-running --tcp-close: production's
#             connections are neither dumped nor blocked; restore included)
#   fork      what a copy-on-write snapshot would freeze production for: the
#             fork() of the same redis (BGSAVE; redis' latest_fork_usec)
#
#   sudo bench/clone/run.sh                 # sizes 10 100 1000 (MB)
#   sudo bench/clone/run.sh 10 100          # chosen sizes
#   IPROBE_BUILD_DIR=build-x bench/clone/run.sh
#   IPROBE_COMPARE_BUILD=/path/build bench/clone/run.sh
#             adds the `iprobe clone` of another build, on the same redis
#             right before this build's (e.g. one that drove CRIU by its
#             command line against this one's RPC): freeze = stopping +
#             frozen (unavailable_us), as clients feel it
#
# Needs root, a built iprobe (scripts/build) and CRIU (scripts/setup).  Under
# flock(1), use `flock -o`: a redis that inherits the lock's descriptor is
# cloned holding that lock, and the clone's restore waits for it forever
# (CRIU restores file locks).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${IPROBE_BUILD_DIR:-$root/build}"
iprobe="$build/bin/iprobe"
compare="${IPROBE_COMPARE_BUILD:+$IPROBE_COMPARE_BUILD/bin/iprobe}"
criu="${IPROBE_CRIU:-$root/third_party/cache/criu/bin/criu}"
sizes=("$@")
((${#sizes[@]})) || sizes=(10 100 1000)
value_size=1000          # bytes per value; keys = MB * 1000
clients=4

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces)" >&2; exit 4; }
[[ -x $iprobe ]] || { echo "no $iprobe: build first (scripts/build)" >&2; exit 5; }
[[ -x $criu ]] || criu="$(command -v criu || true)"
[[ -n $criu ]] || { echo "no CRIU: run scripts/setup" >&2; exit 7; }

ns="iprobe-bench-$$"
clone="iprobe-bench-clone-$$"
port=17379
work="$(mktemp -d)"
redis_pid=
cleanup() {
  "$iprobe" clone --destroy "$clone" >/dev/null 2>&1 || true
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "$work" /dev/shm/iprobe-bench-images-$$
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

ip netns add "$ns"
ip -n "$ns" link set lo up
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }
cli() { in_ns redis-cli -p "$port" "$@"; }

# redis-benchmark's CSV: "test","rps","avg","min","p50","p95","p99","max"
# redis-benchmark's latency histogram stops at 3 s: larger values read 3000.x.
bench_max() { awk -F'"' '/^"GET"/ { if ($16 + 0 >= 3000) print ">=3000"; else print $16 }' "$1"; }
bench_rps() { awk -F'"' '/^"GET"/ { print $4 }' "$1"; }

# frozen_time and freezing_time (ms) from CRIU's stats-dump image.
dump_stats() { python3 "$root/bench/clone/criu_stats.py" "$1"; }

# Runs redis-benchmark around command "$@" and prints its worst latency (ms).
max_latency_around() {
  in_ns redis-benchmark -p "$port" -t get -r "$keys" -n "$requests" -c "$clients" --csv \
    >"$work/during.csv" 2>"$work/during.err" &
  local bench=$!
  sleep 1
  "$@"
  wait "$bench"
  if grep -qi error "$work/during.err"; then echo "client error: $(head -n1 "$work/during.err")" >&2; fi
  bench_max "$work/during.csv"
}

criu_tcp_dump() {
  rm -rf "/dev/shm/iprobe-bench-images-$$"; mkdir -p "/dev/shm/iprobe-bench-images-$$"
  in_ns "$criu" dump -t "$redis_pid" -D "/dev/shm/iprobe-bench-images-$$" --leave-running --tcp-established \
    -o dump.log >/dev/null 2>&1 || { echo "criu dump failed" >&2; return 1; }
  dump_stats "/dev/shm/iprobe-bench-images-$$/stats-dump" >"$work/criu.stats"
  rm -rf "/dev/shm/iprobe-bench-images-$$"
}

iprobe_clone() {
  "${1:-$iprobe}" clone "$redis_pid" --netns "$clone" --no-default-snapshots --json >"$work/clone.json"
}

# "freeze_ms total_ms unavailable_ms" of the clone just made.
clone_times() {
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("%.1f %.1f %.1f" % (j["freeze_us"] / 1000, j["total_us"] / 1000, j["unavailable_us"] / 1000))' "$work/clone.json"
}

printf '%-7s %-7s | %-9s | %-21s | %-43s | %-8s' "" "" "base" "criu-tcp (dump only)" "iprobe clone (dump+restore)" "fork"
[[ -n $compare ]] && printf ' | %-43s' "iprobe clone of IPROBE_COMPARE_BUILD"
printf '\n%-7s %-7s | %9s | %10s %10s | %10s %10s %10s %10s | %8s' \
  "size_MB" "used_MB" "max_ms" "freeze_ms" "max_ms" "freeze_ms" "unavail_ms" "total_ms" "max_ms" "fork_ms"
[[ -n $compare ]] && printf ' | %10s %10s %10s %10s' "freeze_ms" "unavail_ms" "total_ms" "max_ms"
printf '\n'
for mb in "${sizes[@]}"; do
  keys=$((mb * 1000))
  setsid nsenter --net="/run/netns/$ns" /usr/bin/redis-server --port "$port" --save '' --appendonly no \
    --daemonize no --dir "$work" --logfile "$work/redis.log" --enable-debug-command yes </dev/null >/dev/null 2>&1 3>&- &
  redis_pid=$!
  for _ in $(seq 100); do [[ $(cli PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
  cli DEBUG POPULATE "$keys" key "$value_size" >/dev/null
  used=$(cli INFO memory | awk -F: '/^used_memory:/ { printf "%.0f", $2 / 1048576 }')

  # Baseline: calibrate the request rate and the client's own worst latency.
  in_ns redis-benchmark -p "$port" -t get -r "$keys" -n 100000 -c "$clients" --csv >"$work/base.csv" 2>/dev/null
  rps=$(bench_rps "$work/base.csv"); base_max=$(bench_max "$work/base.csv")
  # Long enough to cover the checkpoint (about 1 s per 100 MB here, plus margin).
  requests=$(awk -v r="$rps" -v mb="$mb" 'BEGIN { printf "%d", r * (3 + mb / 50) }')

  rm -f "$work/criu.stats"
  criu_max=$(max_latency_around criu_tcp_dump)
  # A dump that failed (said above) leaves its columns '-'; the rest goes on.
  criu_freeze=-
  [[ -s $work/criu.stats ]] && read -r criu_freeze _ <"$work/criu.stats"

  compared=
  if [[ -n $compare ]]; then
    compare_max=$(max_latency_around iprobe_clone "$compare")
    read -r c_freeze c_total c_unavailable < <(clone_times)
    "$iprobe" clone --destroy "$clone" >/dev/null
    compared=$(printf ' | %10s %10s %10s %10s' "$c_freeze" "$c_unavailable" "$c_total" "$compare_max")
  fi

  iprobe_max=$(max_latency_around iprobe_clone)
  read -r freeze total unavailable < <(clone_times)
  clone_keys=$(nsenter --net="/run/netns/$clone" redis-cli -p "$port" DBSIZE)
  [[ $clone_keys == "$keys" ]] || echo "warning: clone has $clone_keys keys, expected $keys" >&2
  "$iprobe" clone --destroy "$clone" >/dev/null

  cli BGSAVE >/dev/null
  for _ in $(seq 600); do
    [[ $(cli INFO persistence | tr -d '\r' | awk -F: '/^rdb_bgsave_in_progress:/ { print $2 }') == 0 ]] && break
    sleep 0.1
  done
  fork_ms=$(cli INFO stats | tr -d '\r' | awk -F: '/^latest_fork_usec:/ { printf "%.1f", $2 / 1000 }')

  printf '%-7s %-7s | %9s | %10s %10s | %10s %10s %10s %10s | %8s%s\n' \
    "$mb" "$used" "$base_max" "$criu_freeze" "$criu_max" "$freeze" "$unavailable" "$total" "$iprobe_max" "$fork_ms" \
    "$compared"
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=
done
