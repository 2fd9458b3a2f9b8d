#!/usr/bin/env bash
# A clone on a second host against a local clone (issue 13), side by side in
# one run: for redis holding 10 MB ... 1 GB, production's freeze (CRIU's
# frozen_time), the clone command's wall time, and the time until the clone
# answers, for
#   local    `iprobe clone PID` into a network namespace on production's host
#   remote   `iprobe clone PID --to B:PORT`, memory streamed to the CRIU page
#            server of an `iprobe clone-agent` on host B
# Hosts A (production) and B are two network namespaces joined by a veth
# pair; the agent keeps its state in a directory of its own.
# "serves" is measured from the command's start to the clone's first PONG.
#
#   sudo bench/clone/remote.sh            # sizes 10 100 1000 (MB)
#   sudo bench/clone/remote.sh 10 100
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${IPROBE_BUILD_DIR:-$root/build}"
iprobe="$build/bin/iprobe"
sizes=("$@")
((${#sizes[@]})) || sizes=(10 100 1000)

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces)" >&2; exit 4; }
[[ -x $iprobe ]] || { echo "no $iprobe: build first (scripts/build)" >&2; exit 5; }

a="iprobe-rbench-a-$$" b="iprobe-rbench-b-$$"
work="$(mktemp -d)"
redis_pid= agent_pid=
cleanup() {
  "$iprobe" clone --destroy "iprb-local-$$" >/dev/null 2>&1 || true
  [[ -n $agent_pid ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  ip netns delete "$a" 2>/dev/null || true
  ip netns delete "$b" 2>/dev/null || true
  [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

now_ms() { date +%s%3N; }
json_field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | cut -d: -f2 | tr -d '"'; }
in_a() { nsenter --net="/run/netns/$a" "$@"; }
wait_pong_in() {  # netns-path address port deadline_ms
  while [[ $(nsenter --net="$1" redis-cli -h "$2" -p "$3" PING 2>/dev/null) != PONG ]]; do
    (( $(now_ms) < $4 )) || return 1
    sleep 0.005
  done
}

mkdir -p "$work/redis"
# shellcheck source=bench/clone/two_hosts.sh
. "$root/bench/clone/two_hosts.sh"
two_hosts "$a" "$b" "irb$$" 10.232.0
nsenter --net="/run/netns/$b" "$iprobe" clone-agent --listen 10.232.0.2:17399 --state-dir "$work/agent" \
  2>"$work/agent.log" &
agent_pid=$!
sleep 0.3

printf '%-8s | %-32s | %-32s\n' "" "local clone" "remote clone (page server)"
printf '%-8s | %10s %10s %10s | %10s %10s %10s\n' size_MB freeze_ms total_ms serves_ms freeze_ms total_ms serves_ms
for mb in "${sizes[@]}"; do
  keys=$((mb * 1000))
  nsenter --net="/run/netns/$a" setsid redis-server --port 17381 --save '' --appendonly no --protected-mode no --enable-debug-command yes \
    --dir "$work/redis" </dev/null >"$work/redis.log" 2>&1 &
  redis_pid=$!
  wait_pong_in "/run/netns/$a" 127.0.0.1 17381 $(( $(now_ms) + 10000 )) || { echo "redis did not start" >&2; exit 1; }
  in_a redis-cli -p 17381 DEBUG POPULATE "$keys" key 1000 | grep -qx OK || { echo "DEBUG POPULATE failed" >&2; exit 1; }

  start=$(now_ms)
  out=$("$iprobe" clone "$redis_pid" --netns "iprb-local-$$" --json)
  wait_pong_in "/run/netns/iprb-local-$$" 127.0.0.1 17381 $(( $(now_ms) + 60000 ))
  l_serves=$(( $(now_ms) - start ))
  l_freeze=$(json_field "$out" freeze_us); l_total=$(json_field "$out" total_us)
  "$iprobe" clone --destroy "iprb-local-$$" >/dev/null

  start=$(now_ms)
  out=$(in_a "$iprobe" clone "$redis_pid" --to 10.232.0.2:17399 --netns "iprb-remote-$$" --json)
  wait_pong_in "/run/netns/$b" 127.0.0.1 17381 $(( $(now_ms) + 60000 ))
  r_serves=$(( $(now_ms) - start ))
  r_freeze=$(json_field "$out" freeze_us); r_total=$(json_field "$out" total_us)
  in_a "$iprobe" clone --destroy "iprb-remote-$$" --to 10.232.0.2:17399 >/dev/null
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=

  printf '%-8s | %10.1f %10.1f %10d | %10.1f %10.1f %10d\n' "$mb" \
    "$(bc -l <<<"$l_freeze/1000")" "$(bc -l <<<"$l_total/1000")" "$l_serves" \
    "$(bc -l <<<"$r_freeze/1000")" "$(bc -l <<<"$r_total/1000")" "$r_serves"
done
