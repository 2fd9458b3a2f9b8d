#!/usr/bin/env bash
# What leaving nothing behind costs an `iprobe clone --container` (the
# clone's guardian forked by the command and told of the volume copy, the
# archive's directory, the clone container, its network and its record
# before each is made; the interrupt guard): the same idle redis (10 MB) in
# a podman container with a named volume, cloned N times by this build and
# by a base build without them, alternating, each clone destroyed before the
# next.  Prints the medians of the command's wall time, the total it reports
# (total_us), production's freeze (freeze_us) and what its clients waited
# through (unavailable_us: podman's stopping phase + frozen), and this
# build's over the base's.
#
#   sudo BASE_BUILD_DIR=/path/to/base/build bench/clone/container_guardian.sh [N=20]
#   IPROBE_BUILD_DIR=build-x ...      this build (default: build)
#
# Needs root, both builds (the base's `iprobe` and `iprobe-launcher` targets
# are enough), CRIU (scripts/setup) and podman with runc; both use the same
# CRIU.  Run it alone, or under the lock every benchmark on the machine takes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
this="${IPROBE_BUILD_DIR:-$root/build}/bin/iprobe"
base="${BASE_BUILD_DIR:?set BASE_BUILD_DIR to a build without the guardian of clone --container}/bin/iprobe"
runs="${1:-20}"
image=localhost/iprobe-bench-redis:host
export IPROBE_CRIU="${IPROBE_CRIU:-$root/third_party/cache/criu/bin/criu}"

[[ $(id -u) -eq 0 ]] || { echo "run as root (CRIU, podman)" >&2; exit 4; }
for tool in "$this" "$base"; do [[ -x $tool ]] || { echo "no $tool: build it first" >&2; exit 5; }; done
command -v podman >/dev/null || { echo "no podman: run scripts/setup" >&2; exit 7; }

prod="iprobe-cgbench-prod-$$" volume="iprobe-cgbench-vol-$$" clone="ipcg-$$"
work="$(mktemp -d)"
cleanup() {
  "$this" clone --destroy "$clone" >/dev/null 2>&1 || true
  podman rm --force --time 1 "$prod" >/dev/null 2>&1 || true
  podman volume rm --force "$volume" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that Ctrl-C or a timeout still cleans up

# shellcheck source=bench/clone/against_base.sh
. "$root/bench/clone/against_base.sh"
# shellcheck source=bench/clone/redis_image.sh
. "$root/bench/clone/redis_image.sh"
redis_image "$image" "$work"
podman volume create "$volume" >/dev/null
addr=$(redis_container "$prod" "$image" -v "$volume:/data")
static=$(podman inspect --format '{{.StaticDir}}' "$prod")
redis-cli -h "$addr" DEBUG POPULATE 10000 key 1000 | grep -qx OK || { echo "DEBUG POPULATE failed" >&2; exit 1; }

# One clone by build `$1` (base or this): "wall_us total_us freeze_us unavailable_us".
clone_once() {
  local tool=${!1} start end out
  start=$(date +%s%N)
  out="$("$tool" clone --container "$prod" --netns "$clone" --json)"
  end=$(date +%s%N)
  [[ $(redis-cli -h "$(json_field "$out" address)" DBSIZE) == 10000 ]] || { echo "the clone lacks production's data" >&2; exit 1; }
  "$tool" clone --destroy "$clone" >/dev/null
  # The base leaves podman's checkpoint files in production's storage; each
  # clone starts without them, as after one by this build.
  rm -rf "$static/checkpoint" "$static/devshm-checkpoint.tar" "$static/rootfs-diff.tar"
  echo "$(((end - start) / 1000)) $(json_field "$out" total_us) $(json_field "$out" freeze_us) $(json_field "$out" unavailable_us)"
}

against_base "$runs" wall total_us freeze_us unavailable_us
