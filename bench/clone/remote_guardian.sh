#!/usr/bin/env bash
# What leaving nothing behind costs an `iprobe clone --to` (the clone's
# guardian forked by the command, the agent holding the connection as the
# clone's lifeline until the command's 'keep'/'kept' round trip): the same
# idle redis (10 MB) on host A cloned N times onto host B by this build and
# by a base build without them, alternating, each with its own build's
# agent on B, each clone destroyed before the next.  Prints the medians of
# the command's wall time, the total it reports (total_us) and production's
# freeze (freeze_us), and this build's over the base's.  Hosts A and B are
# two network namespaces joined by a veth pair (bench/clone/two_hosts.sh).
#
#   sudo BASE_BUILD_DIR=/path/to/base/build bench/clone/remote_guardian.sh [N=20]
#   IPROBE_BUILD_DIR=build-x ...      this build (default: build)
#
# Needs root, both builds (the base's `iprobe` and `iprobe-launcher` targets
# are enough) and CRIU (scripts/setup); both use the same CRIU.  Run it
# alone, or under the lock every benchmark on the machine takes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
this="${IPROBE_BUILD_DIR:-$root/build}/bin/iprobe"
base="${BASE_BUILD_DIR:?set BASE_BUILD_DIR to a build without the guardian of clone --to}/bin/iprobe"
runs="${1:-20}"
export IPROBE_CRIU="${IPROBE_CRIU:-$root/third_party/cache/criu/bin/criu}"

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces)" >&2; exit 4; }
for tool in "$this" "$base"; do [[ -x $tool ]] || { echo "no $tool: build it first" >&2; exit 5; }; done

a="iprobe-rgbench-a-$$" b="iprobe-rgbench-b-$$"
clone="iprgb-$$"
work="$(mktemp -d)"
redis_pid= base_agent= this_agent=
cleanup() {
  for agent in $base_agent $this_agent; do kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null || true; done
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  "$this" clone --destroy "$clone" >/dev/null 2>&1 || true
  ip netns delete "$a" 2>/dev/null || true
  ip netns delete "$b" 2>/dev/null || true
  [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

in_a() { nsenter --net="/run/netns/$a" "$@"; }
# shellcheck source=bench/clone/against_base.sh
. "$root/bench/clone/against_base.sh"
# shellcheck source=bench/clone/two_hosts.sh
. "$root/bench/clone/two_hosts.sh"
two_hosts "$a" "$b" "irg$$" 10.233.0
nsenter --net="/run/netns/$b" "$base" clone-agent --listen 10.233.0.2:17398 --state-dir "$work/base-agent" \
  2>"$work/base-agent.log" &
base_agent=$!
nsenter --net="/run/netns/$b" "$this" clone-agent --listen 10.233.0.2:17399 --state-dir "$work/this-agent" \
  2>"$work/this-agent.log" &
this_agent=$!
sleep 0.3
mkdir -p "$work/redis"
nsenter --net="/run/netns/$a" setsid redis-server --port 17381 --save '' --appendonly no --protected-mode no --enable-debug-command yes \
  --dir "$work/redis" </dev/null >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do [[ $(in_a redis-cli -p 17381 PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
in_a redis-cli -p 17381 DEBUG POPULATE 10000 key 1000 >/dev/null

# One clone by build `$1` (base or this) onto its own agent: "wall_us total_us freeze_us".
clone_once() {
  local tool=${!1} port start end out
  port=$([[ $1 == base ]] && echo 17398 || echo 17399)
  start=$(date +%s%N)
  out="$(in_a "$tool" clone "$redis_pid" --to "10.233.0.2:$port" --netns "$clone" --json)"
  end=$(date +%s%N)
  in_a "$tool" clone --destroy "$clone" --to "10.233.0.2:$port" >/dev/null
  echo "$(((end - start) / 1000)) $(json_field "$out" total_us) $(json_field "$out" freeze_us)"
}

against_base "$runs" wall total_us freeze_us
