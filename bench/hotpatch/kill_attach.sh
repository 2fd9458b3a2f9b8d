#!/usr/bin/env bash
# SIGKILL of `iprobe attach` at random moments of its whole run, RUNS times
# (default 200), on kill_target: four threads, one of which checks its
# registers, vector state and signal mask after every sleep and aborts if any
# changed.  Prints target deaths (must be 0), how many runs left it untouched
# (and how many of those with the runtime loaded, inert) and how many
# attached, each detached back to exactly its code.
#   bench/hotpatch/kill_attach.sh [RUNS]      (root; after scripts/build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
runs="${1:-200}"
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "kill_attach: RUNS must be a positive number" >&2; exit 2; }
test="$root/build/tests/hotpatch_stress_test"
[[ -x $test ]] || { echo "kill_attach: $test missing; run scripts/build" >&2; exit 1; }
cd "$root/build"
IPROBE_KILL_ATTACH_RUNS="$runs" "$test" --gtest_filter=StressTest.AttacherKilledAnywhereNeverHarmsTheTarget
