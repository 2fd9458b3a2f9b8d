#!/usr/bin/env bash
# Container clones against process clones (issue 13), side by side in one
# run: for redis holding 10 MB ... 1 GB, production's freeze (CRIU's
# frozen_time) and the time until the clone answers, for
#   process    `iprobe clone PID` of redis in a network namespace
#   container  `iprobe clone --container NAME` of the same redis in a podman
#              container (podman checkpoint --leave-running --export, then
#              restore --import under a new name)
# "serves" is measured from the command's start to the clone's first PONG.
#
#   sudo bench/clone/container.sh            # sizes 10 100 1000 (MB)
#   sudo bench/clone/container.sh 10 100
#
# Needs root, a built iprobe, CRIU and podman with runc (scripts/setup).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${IPROBE_BUILD_DIR:-$root/build}"
iprobe="$build/bin/iprobe"
sizes=("$@")
((${#sizes[@]})) || sizes=(10 100 1000)
image=localhost/iprobe-bench-redis:host

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces, podman)" >&2; exit 4; }
[[ -x $iprobe ]] || { echo "no $iprobe: build first (scripts/build)" >&2; exit 5; }
command -v podman >/dev/null || { echo "no podman: run scripts/setup" >&2; exit 7; }

ns="iprobe-cbench-$$"
prod="iprobe-cbench-prod-$$"
work="$(mktemp -d)"
redis_pid=
cleanup() {
  "$iprobe" clone --destroy "ipcb-proc-$$" >/dev/null 2>&1 || true
  "$iprobe" clone --destroy "ipcb-cont-$$" >/dev/null 2>&1 || true
  podman rm --force --time 1 "$prod" >/dev/null 2>&1 || true
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

now_ms() { date +%s%3N; }
# shellcheck source=bench/clone/redis_image.sh
. "$root/bench/clone/redis_image.sh"
json_field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | cut -d: -f2 | tr -d '"'; }

# The image: redis-server and the libraries it loads, from this host.
redis_image "$image" "$work"
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768

ip netns add "$ns"
ip -n "$ns" link set lo up

wait_pong() {  # address port deadline_ms
  while [[ $(redis-cli -h "$1" -p "$2" PING 2>/dev/null) != PONG ]]; do
    (( $(now_ms) < $3 )) || return 1
    sleep 0.005
  done
}
wait_pong_in() {  # netns address port deadline_ms
  nsenter --net="/run/netns/$1" bash -c "$(declare -f now_ms wait_pong); wait_pong $2 $3 $4"
}

printf '%-8s | %-32s | %-32s\n' "" "process clone" "container clone"
printf '%-8s | %10s %10s %10s | %10s %10s %10s\n' size_MB freeze_ms total_ms serves_ms freeze_ms total_ms serves_ms
for mb in "${sizes[@]}"; do
  keys=$((mb * 1000))
  # process: redis in a network namespace of its own
  nsenter --net="/run/netns/$ns" setsid redis-server --port 17380 --save '' --appendonly no --enable-debug-command yes --dir "$work" \
    </dev/null >"$work/redis.log" 2>&1 &
  redis_pid=$!
  wait_pong_in "$ns" 127.0.0.1 17380 $(( $(now_ms) + 10000 )) || { echo "redis did not start" >&2; exit 1; }
  nsenter --net="/run/netns/$ns" redis-cli -p 17380 DEBUG POPULATE "$keys" key 1000 | grep -qx OK || { echo "DEBUG POPULATE failed" >&2; exit 1; }
  start=$(now_ms)
  out=$("$iprobe" clone "$redis_pid" --netns "ipcb-proc-$$" --json)
  wait_pong_in "ipcb-proc-$$" 127.0.0.1 17380 $(( $(now_ms) + 60000 ))
  p_serves=$(( $(now_ms) - start ))
  p_freeze=$(json_field "$out" freeze_us); p_total=$(json_field "$out" total_us)
  "$iprobe" clone --destroy "ipcb-proc-$$" >/dev/null
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=

  # container: the same redis in a podman container
  podman --runtime runc run -d --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" --name "$prod" \
    "$image" /usr/bin/redis-server --save '' --appendonly no --protected-mode no --enable-debug-command yes --dir /data >/dev/null
  addr=$(podman inspect --format '{{.NetworkSettings.IPAddress}}' "$prod")
  wait_pong "$addr" 6379 $(( $(now_ms) + 10000 )) || { echo "container redis did not start" >&2; exit 1; }
  redis-cli -h "$addr" DEBUG POPULATE "$keys" key 1000 | grep -qx OK || { echo "DEBUG POPULATE failed" >&2; exit 1; }
  start=$(now_ms)
  out=$("$iprobe" clone --container "$prod" --netns "ipcb-cont-$$" --json)
  caddr=$(json_field "$out" address)
  wait_pong "$caddr" 6379 $(( $(now_ms) + 60000 ))
  c_serves=$(( $(now_ms) - start ))
  c_freeze=$(json_field "$out" freeze_us); c_total=$(json_field "$out" total_us)
  "$iprobe" clone --destroy "ipcb-cont-$$" >/dev/null
  podman rm --force --time 1 "$prod" >/dev/null

  printf '%-8s | %10.1f %10.1f %10d | %10.1f %10.1f %10d\n' "$mb" \
    "$(bc -l <<<"$p_freeze/1000")" "$(bc -l <<<"$p_total/1000")" "$p_serves" \
    "$(bc -l <<<"$c_freeze/1000")" "$(bc -l <<<"$c_total/1000")" "$c_serves"
done
