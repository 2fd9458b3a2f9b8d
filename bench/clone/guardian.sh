#!/usr/bin/env bash
# What the clone's guardian (launcher/src/clone_guardian.cpp: one fork before
# anything is made, a record per helper, a release at the end) costs an
# `iprobe clone`: the same idle redis (10 MB) cloned N times by this build
# and by a base build without the guardian, alternating, each clone
# destroyed before the next.  Prints the medians of the command's wall time
# and of the total it reports (total_us), and this build's over the base's.
#
#   sudo BASE_BUILD_DIR=/path/to/base/build bench/clone/guardian.sh [N=20]
#   IPROBE_BUILD_DIR=build-x ...      this build (default: build)
#
# Needs root, both builds (scripts/build; the base's `iprobe` and
# `iprobe-launcher` targets are enough) and CRIU (scripts/setup).  Both use
# the same CRIU ($IPROBE_CRIU, default the private one scripts/setup installs).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
this="${IPROBE_BUILD_DIR:-$root/build}/bin/iprobe"
base="${BASE_BUILD_DIR:?set BASE_BUILD_DIR to a build without the guardian}/bin/iprobe"
runs="${1:-20}"
export IPROBE_CRIU="${IPROBE_CRIU:-$root/third_party/cache/criu/bin/criu}"

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, namespaces)" >&2; exit 4; }
for tool in "$this" "$base"; do [[ -x $tool ]] || { echo "no $tool: build it first" >&2; exit 5; }; done

ns="iprobe-bench-g-$$"
clone="iprobe-bench-gc-$$"
port=17381
work="$(mktemp -d)"
redis_pid=
cleanup() {
  "$this" clone --destroy "$clone" >/dev/null 2>&1 || true
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null || true
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

ip netns add "$ns"
ip -n "$ns" link set lo up
# shellcheck source=bench/clone/against_base.sh
. "$root/bench/clone/against_base.sh"
cli() { nsenter --net="/run/netns/$ns" redis-cli -p "$port" "$@"; }
(cd "$work" && exec setsid nsenter --net="/run/netns/$ns" redis-server --port "$port" --save '' --appendonly no \
  </dev/null >"$work/redis.log" 2>&1) &
redis_pid=$!
for _ in $(seq 100); do [[ $(cli PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
cli DEBUG POPULATE 10000 key 1000 >/dev/null

# One clone by build `$1` (base or this): "wall_us total_us".
clone_once() {
  local tool=${!1} start end out
  start=$(date +%s%N)
  out="$("$tool" clone "$redis_pid" --netns "$clone" --json)"
  end=$(date +%s%N)
  "$tool" clone --destroy "$clone" >/dev/null
  echo "$(((end - start) / 1000)) $(json_field "$out" total_us)"
}

against_base "$runs" wall total_us
