#!/usr/bin/env bash
# Production's freeze as a client feels it (issue 26): a client sending PING
# every millisecond on its own connection (bench/clone/pinger.py) records its
# longest wait for a reply while production is checkpointed, side by side
# with what the tool reports, for redis holding 10 MB ... 1 GB, in the three
# ways of cloning, each against the same checkpoint done by hand:
#   local      `criu dump --leave-running --tcp-close ...` from production's
#              network namespace (what iprobe clone runs) | `iprobe clone PID`
#   container  `podman container checkpoint --leave-running --export` with
#              CRIU 4.2 (tcp-close) in front of runc | `iprobe clone --container`
#   remote     `criu page-server` on B + `criu dump --page-server` on A
#              (memory over the link) | `iprobe clone PID --to B:PORT`
# Reported: the pinger's worst wait (client_ms) and the tool's own number:
# CRIU's frozen_time (frozen_ms) and freezing_time + frozen_time
# (unavailable_ms, what iprobe now reports).  By hand only the dump is done
# (no restore: it does not touch production).
#
#   sudo bench/clone/pinger.sh                                          # 10 100 1000 MB, 3 rounds
#   sudo bench/clone/pinger.sh 10 100                                   # chosen sizes
#   ROUNDS=5 MODES="local remote" bench/clone/pinger.sh 100
#
# Needs root, a built iprobe (scripts/build), CRIU (scripts/setup), podman.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${IPROBE_BUILD_DIR:-$root/build}"
iprobe="$build/bin/iprobe"
criu="${IPROBE_CRIU:-$root/third_party/cache/criu/bin/criu}"
pinger="$root/bench/clone/pinger.py"
sizes=("$@")
((${#sizes[@]})) || sizes=(10 100 1000)
rounds=${ROUNDS:-3}
modes=${MODES:-local container remote}
image=localhost/iprobe-bench-redis:host

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces, podman)" >&2; exit 4; }
[[ -x $iprobe ]] || { echo "no $iprobe: build first (scripts/build)" >&2; exit 5; }
[[ -x $criu ]] || { echo "no CRIU at $criu: run scripts/setup" >&2; exit 7; }

a="iprobe-pbench-a-$$" b="iprobe-pbench-b-$$"
prod="iprobe-pbench-prod-$$" clone="iprobe-pbench-clone-$$"
work="$(mktemp -d /dev/shm/iprobe-pbench-XXXXXX)"  # the checkpoints by hand, on tmpfs as iprobe's
rdir="$(mktemp -d)"  # redis' directory: not in /dev/shm, which a clone gets a private one of
redis_pid= agent_pid= page_server=
cleanup() {
  "$iprobe" clone --destroy "$clone" >/dev/null 2>&1 || true
  podman rm --force --time 1 "$prod" >/dev/null 2>&1 || true
  [[ -n $agent_pid ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  [[ -n $page_server ]] && kill "$page_server" 2>/dev/null || true
  ip netns delete "$a" 2>/dev/null || true
  ip netns delete "$b" 2>/dev/null || true
  [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work" "$rdir"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

now_ms() { date +%s%3N; }
json_field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | cut -d: -f2 | tr -d '"'; }
in_a() { nsenter --net="/run/netns/$a" "$@"; }

# CRIU's stats-dump image: "frozen_ms unavailable_ms".
dump_stats() {
  if [[ -f $1 ]]; then python3 "$root/bench/clone/criu_stats.py" "$1" | awk '{ printf "%.1f %.1f\n", $1, $1 + $2 }'
  else echo "- -"; fi  # CRIU left no stats-dump (seen with --page-server at 100 MB)
}

# Runs "$@" while the pinger ($ping_ns, $ping_host, $ping_port) watches;
# prints its worst wait (ms).
client_ms_around() {
  local out="$work/pinger.out"
  ${ping_ns:+nsenter --net="$ping_ns"} python3 "$pinger" "$ping_host" "$ping_port" >"$out" 2>"$work/pinger.err" &
  local p=$!
  while [[ $(head -n1 "$out" 2>/dev/null) != ready ]]; do kill -0 "$p" 2>/dev/null || { cat "$work/pinger.err" >&2; return 1; }; sleep 0.01; done
  sleep 0.3
  "$@" >"$work/op.out" 2>"$work/op.err" || { echo "failed: $* ($(tail -n3 "$work/op.err"))" >&2; kill "$p"; return 1; }
  sleep 0.3
  kill -TERM "$p"; wait "$p" || true
  tail -n1 "$out" | cut -d' ' -f1
}

# Container: CRIU 4.2 and tcp-close in front of runc, as iprobe does.
shim="$work/shim"; mkdir -p "$shim"
echo tcp-close >"$shim/criu.conf"
printf '#!/bin/sh\nCRIU_CONFIG_FILE=%s/criu.conf exec %s "$@"\n' "$shim" "$criu" >"$shim/criu"; chmod +x "$shim/criu"
# shellcheck source=bench/clone/redis_image.sh
. "$root/bench/clone/redis_image.sh"
[[ $modes != *container* ]] || redis_image "$image" "$rdir"
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768

# Hosts A (production) and B (the agent) joined by a veth pair.
# shellcheck source=bench/clone/two_hosts.sh
. "$root/bench/clone/two_hosts.sh"
two_hosts "$a" "$b" "ipb$$" 10.233.0
if [[ $modes == *remote* ]]; then
  nsenter --net="/run/netns/$b" "$iprobe" clone-agent --listen 10.233.0.2:17398 --state-dir "$rdir/agent" 2>"$work/agent.log" &
  agent_pid=$!
fi

populate() {  # host port MB [netns]
  ${4:+nsenter --net="$4"} redis-cli -h "$1" -p "$2" DEBUG POPULATE "$(( $3 * 1000 ))" key 1000 | grep -qx OK
}
start_process_redis() {
  nsenter --net="/run/netns/$a" setsid redis-server --port 17382 --save '' --appendonly no --protected-mode no \
    --enable-debug-command yes --dir "$rdir" </dev/null >/dev/null 2>&1 3>&- &  # not flock(1)'s lock: CRIU would restore it
  redis_pid=$!
  for _ in $(seq 200); do [[ $(in_a redis-cli -p 17382 PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
  ping_ns="/run/netns/$a" ping_host=127.0.0.1 ping_port=17382
}
stop_process_redis() { kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=; }

by_hand_local() {
  rm -rf "$work/images"; mkdir -p "$work/images"
  in_a "$criu" dump -t "$redis_pid" -D "$work/images" --leave-running --tcp-close --ext-unix-sk --file-locks \
    --shell-job -o dump.log
}
by_hand_remote() {
  rm -rf "$work/images" "$work/remote-images"; mkdir -p "$work/images" "$work/remote-images"
  nsenter --net="/run/netns/$b" "$criu" page-server --daemon --pidfile "$work/ps.pid" -D "$work/remote-images" \
    --address 10.233.0.2 --port 17397 -o ps.log
  page_server=$(cat "$work/ps.pid")
  in_a "$criu" dump -t "$redis_pid" -D "$work/images" --leave-running --tcp-close --ext-unix-sk --file-locks \
    --shell-job --page-server --address 10.233.0.2 --port 17397 -o dump.log
  for _ in $(seq 600); do kill -0 "$page_server" 2>/dev/null || break; sleep 0.05; done
  page_server=
  rm -rf "$work/remote-images"
}
by_hand_container() {
  rm -f "$work/ck.tar"
  PATH="$shim:$PATH" podman container checkpoint --leave-running --print-stats --compress none \
    --export "$work/ck.tar" "$prod"
}

printf '%-9s %-7s %-5s | %-28s | %-28s\n' "" "" "" "by hand (checkpoint only)" "iprobe clone"
printf '%-9s %-7s %-5s | %8s %8s %10s | %8s %8s %10s\n' mode size_MB round client_ms frozen_ms unavail_ms \
  client_ms frozen_ms unavail_ms
for mb in "${sizes[@]}"; do
  for mode in $modes; do
    if [[ $mode == container ]]; then
      podman --runtime runc run -d --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" --name "$prod" \
        "$image" /usr/bin/redis-server --save '' --appendonly no --protected-mode no --enable-debug-command yes \
        --dir /data >/dev/null
      addr=$(podman inspect --format '{{.NetworkSettings.IPAddress}}' "$prod")
      for _ in $(seq 200); do [[ $(redis-cli -h "$addr" PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
      populate "$addr" 6379 "$mb"
      ping_ns= ping_host=$addr ping_port=6379
    else
      start_process_redis
      populate 127.0.0.1 17382 "$mb" "/run/netns/$a"
    fi
    for round in $(seq "$rounds"); do
      case $mode in
        local)
          hand_client=$(client_ms_around by_hand_local)
          read -r hand_frozen hand_unavail < <(dump_stats "$work/images/stats-dump")
          tool_client=$(client_ms_around "$iprobe" clone "$redis_pid" --netns "$clone" --no-default-snapshots --json)  # no --ping: the bench's pinger measures
          out=$(cat "$work/op.out") ;;
        remote)
          hand_client=$(client_ms_around by_hand_remote)
          read -r hand_frozen hand_unavail < <(dump_stats "$work/images/stats-dump")
          tool_client=$(client_ms_around in_a "$iprobe" clone "$redis_pid" --to 10.233.0.2:17398 --netns "$clone" \
            --no-default-snapshots --json)
          out=$(cat "$work/op.out") ;;
        container)
          hand_client=$(client_ms_around by_hand_container)
          stats=$(cat "$work/op.out")
          read -r hand_frozen hand_unavail < <(python3 -c '
import json, sys
c = json.loads(sys.argv[1])["container_statistics"][0]["criu_statistics"]
print("%.1f %.1f" % (c["frozen_time"] / 1000, (c["frozen_time"] + c["freezing_time"]) / 1000))' "$stats")
          tool_client=$(client_ms_around "$iprobe" clone --container "$prod" --netns "$clone" --json)
          out=$(cat "$work/op.out") ;;
      esac
      tool_frozen=$(json_field "$out" freeze_us); tool_unavail=$(json_field "$out" unavailable_us)
      if [[ $mode == remote ]]; then in_a "$iprobe" clone --destroy "$clone" >/dev/null  # from A: the agent is reached there
      else "$iprobe" clone --destroy "$clone" >/dev/null; fi
      printf '%-9s %-7s %-5s | %8s %8s %10s | %8s %8.1f %10.1f\n' "$mode" "$mb" "$round" "$hand_client" \
        "$hand_frozen" "$hand_unavail" "$tool_client" "$(bc -l <<<"$tool_frozen/1000")" \
        "$(bc -l <<<"$tool_unavail/1000")"
    done
    if [[ $mode == container ]]; then podman rm --force --time 1 "$prod" >/dev/null; else stop_process_redis; fi
  done
done
