#!/usr/bin/env bash
# Two `iprobe clone --container … --netns X` for one name: a first held
# mid-clone at STEP (IPROBE_TEST_PAUSE; default `exported`: production
# checkpointed, the archive written, the clone container not yet restored),
# then a second for the same name, by this build and by a base build
# without the name's claim (launcher/src/name_claim.cpp).  For each build,
# N rounds: how long the second takes to end and its exit code, whether it
# checkpointed production (froze it: "checkpointing" in its progress), how
# the first ends once let go, and whether a clone container of that name is
# left once both ended (the one clone the user asked for).  Each round's
# clone is destroyed before the next.
#
#   sudo BASE_BUILD_DIR=/path/to/base/build bench/clone/name_claim.sh [N=5] [STEP=exported]
#   IPROBE_BUILD_DIR=build-x ...      this build (default: build)
#
# Needs root, both builds (the base's `iprobe` and `iprobe-launcher` are
# enough), CRIU (scripts/setup) and podman with runc.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
this="${IPROBE_BUILD_DIR:-$root/build}/bin/iprobe"
base="${BASE_BUILD_DIR:?set BASE_BUILD_DIR to a build without the name claim}/bin/iprobe"
runs="${1:-5}" step="${2:-exported}"
image=localhost/iprobe-bench-redis:host
export IPROBE_CRIU="${IPROBE_CRIU:-$root/third_party/cache/criu/bin/criu}"

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, podman)" >&2; exit 4; }
for tool in "$this" "$base"; do [[ -x $tool ]] || { echo "no $tool: build it first" >&2; exit 5; }; done
command -v podman >/dev/null || { echo "no podman: run scripts/setup" >&2; exit 7; }

prod="iprobe-ncbench-prod-$$" clone="ipnc-$$"
work="$(mktemp -d)"
first=
cleanup() {
  [[ -n $first ]] && kill -CONT "$first" 2>/dev/null && wait "$first" 2>/dev/null || true
  "$this" clone --destroy "$clone" >/dev/null 2>&1 || true
  podman rm --force --time 1 "$clone" >/dev/null 2>&1 || true
  podman network rm --force "iprobe-$clone" >/dev/null 2>&1 || true
  podman rm --force --time 1 "$prod" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

# shellcheck source=bench/clone/redis_image.sh
. "$root/bench/clone/redis_image.sh"
redis_image "$image" "$work"
addr=$(redis_container "$prod" "$image")
static=$(podman inspect --format '{{.StaticDir}}' "$prod")
redis-cli -h "$addr" DEBUG POPULATE 10000 key 1000 | grep -qx OK || { echo "DEBUG POPULATE failed" >&2; exit 1; }

state_of() { awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null; }

# One round by `$1`: "second_ms second_exit second_checkpointed first_exit clone_left".
round() {
  local tool=$1 start end second_exit=0 checkpointed=0 kept=0 first_exit=0
  IPROBE_TEST_PAUSE=$step "$tool" clone --container "$prod" --netns "$clone" >"$work/first.out" 2>&1 &
  first=$!
  for _ in $(seq 6000); do [[ $(state_of "$first") == T ]] && break; sleep 0.01; done
  [[ $(state_of "$first") == T ]] || { echo "the first never paused: $(cat "$work/first.out")" >&2; exit 1; }
  start=$(date +%s%N)
  "$tool" clone --container "$prod" --netns "$clone" >"$work/second.out" 2>&1 || second_exit=$?
  end=$(date +%s%N)
  grep -q checkpointing "$work/second.out" && checkpointed=1
  kill -CONT "$first"
  wait "$first" || first_exit=$?
  first=
  podman container exists "$clone" && kept=1
  "$this" clone --destroy "$clone" >/dev/null 2>&1 || true
  podman rm --force --time 1 "$clone" >/dev/null 2>&1 || true
  podman network rm --force "iprobe-$clone" >/dev/null 2>&1 || true
  rm -rf "$static/checkpoint" "$static/devshm-checkpoint.tar" "$static/rootfs-diff.tar"
  [[ $(redis-cli -h "$addr" DBSIZE) == 10000 ]] || { echo "production lost its data" >&2; exit 1; }
  echo "$(((end - start) / 1000000)) $second_exit $checkpointed $first_exit $kept"
}

printf 'the first held at %s\n' "$step"
printf '%-6s %10s %12s %14s %11s %11s\n' build 'second ms' 'second exit' 'checkpointed' 'first exit' 'clone left'
for build in base this; do
  for _ in $(seq "$runs"); do
    read -r ms code cp first_code kept < <(round "${!build}")
    printf '%-6s %10s %12s %14s %11s %11s\n' "$build" "$ms" "$code" "$cp" "$first_code" "$kept"
  done
done
