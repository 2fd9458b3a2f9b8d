#!/usr/bin/env bash
# The debug window, with and without `iprobe debug --adapt` (docs/debug-window.md).
#
# Production is redis built with iprobe-cc (scripts/build-redis --mode
# finstrument) in a network namespace of its own; the work is SORT of a
# 600-element list (thousands of probed calls per command, small requests
# and replies, so the clone's CPU is what limits it, not the network).
#
#  1. capacity: a clone of production, unprobed and then with every probe
#     on, loaded as fast as it answers (the paced client with no pacing):
#     C0 and C1 commands/s.  redis-benchmark gives the same C0 within a few
#     percent (printed for reference).
#  2. for each load (25, 50, 100% of C0) and each mode (every probe on all
#     the time; --adapt): `iprobe debug --functions '*' --no-trace --buffer B
#     --recloning on-overflow`, the paced client at that rate on one
#     connection for RUN_S seconds.  Measured: the first debug window (the
#     mirror's: a connection's start to its overflow), overflows, re-clones,
#     debug legs cut after their client left (cut), the share of
#     the bytes the clones were fed (mirrored), and the share of the selected
#     functions probed over the load (time-weighted, from the adapt events;
#     each generation starts with all).  Next to it, the model's window for
#     the fixed probe set, W = B' / (lambda - mu) in bytes, lambda the load
#     and mu = C1 (docs/debug-window.md).
#  3. the same at 50 and 100% with clients that come and go (a new
#     connection every CONN_S seconds, for MANY_S seconds): connections
#     opened after a re-clone reach the new clone, so re-clones repeat.
#
# usage: bench/debug-window/run.sh [BUILD_DIR]     (default: ./build; as root)
# env:   RUN_S (40), LOADS ("25 50 100"), BUFFER (1M), CONN_S (10), MANY_S (60),
#        MANY_LOADS ("50 100"), MODES ("fixed adapt"), KEEP=DIR (keep the sessions' output)
set -euo pipefail

BUILD=$(cd "${1:-build}" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IPROBE=$BUILD/bin/iprobe
HOTPATCH=$BUILD/libexec/iprobe/iprobe-hotpatch
PACED=$BUILD/tests/launcher_paced_client
RUN_S=${RUN_S:-40}
LOADS=${LOADS-25 50 100}
BUFFER=${BUFFER:-1M}
CONN_S=${CONN_S:-10}
MANY_S=${MANY_S:-60}
MANY_LOADS=${MANY_LOADS-50 100}
MODES=${MODES:-fixed adapt}
for tool in "$IPROBE" "$HOTPATCH" "$PACED"; do
    [ -x "$tool" ] || { echo "no $tool: build iprobe (scripts/build) first" >&2; exit 7; }
done
[ "$(id -u)" = 0 ] || { echo "needs root (CRIU, namespaces)" >&2; exit 4; }
SERVER=$(IPROBE_BUILD_DIR=$BUILD "$ROOT/scripts/build-redis" --mode finstrument "$BUILD/redis/finstrument")

WORK=$(mktemp -d)
NS=ipt-bdw-$$
CLONE_NS=ipt-bdwc-$$
cleanup() {
    [ -n "${SESSION:-}" ] && kill "$SESSION" 2>/dev/null && wait "$SESSION" 2>/dev/null
    "$IPROBE" clone --destroy "$CLONE_NS" >/dev/null 2>&1 || true
    [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null
    ip netns delete "$NS" 2>/dev/null || true
    [ -n "${KEEP:-}" ] && cp -r "$WORK" "$KEEP"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 130" INT TERM

ip netns add "$NS"
ip -n "$NS" link set lo up
PORT=7379
LISTEN=7380
in_ns() { nsenter --net=/run/netns/"$NS" "$@"; }
# Production gets none of this script's descriptors: under flock(1) one of
# them holds the lock, and a clone cannot be restored with a
# file lock that another process holds (CRIU takes it again).
(cd "$WORK"
 for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done 2>/dev/null
 exec nsenter --net=/run/netns/"$NS" setsid "$SERVER" --port "$PORT" --save '' --appendonly no \
    --daemonize no </dev/null >"$WORK/redis.log" 2>&1) &
sleep 0.5
REDIS_PID=$(ip netns pids "$NS" | head -1)
[ -n "$REDIS_PID" ] || { echo "redis did not start: $(cat "$WORK/redis.log")" >&2; exit 1; }
for batch in 0 1 2 3 4 5; do
    in_ns redis-cli -p "$PORT" RPUSH biglist $(seq -f "element-%g" $((batch * 100 + 1)) $((batch * 100 + 100))) >/dev/null
done
SORT=(SORT biglist ALPHA LIMIT 0 1)
REQUEST_BYTES=$(python3 -c "import sys; a=sys.argv[1:]; print(len('*%d\r\n' % len(a)) + sum(len('\$%d\r\n%s\r\n' % (len(x), x)) for x in a))" "${SORT[@]}")
json() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())$1)"; }

# 1. capacity of a clone, unprobed and fully probed
"$IPROBE" clone "$REDIS_PID" --netns "$CLONE_NS" --json > "$WORK/clone.json"
KEEPER=$(json "['keeper_pid']" < "$WORK/clone.json")
in_clone() { nsenter --net=/run/netns/"$CLONE_NS" "$@"; }
C0=$(in_clone "$PACED" 127.0.0.1:$PORT 1e9 20000 "${SORT[@]}" | json "['rate']")
RB=$(in_clone redis-benchmark -p "$PORT" -n 20000 -c 1 -P 32 -q "${SORT[@]}" 2>&1 | tr '\r' '\n' | tail -1)
nsenter --target "$KEEPER" --pid --mount -- "$HOTPATCH" attach "$REDIS_PID" --functions '*' >/dev/null
C1=$(in_clone "$PACED" 127.0.0.1:$PORT 1e9 3000 "${SORT[@]}" | json "['rate']")
"$IPROBE" clone --destroy "$CLONE_NS" >/dev/null
echo "# load: SORT of 600 strings, ${REQUEST_BYTES}-byte requests; buffer $BUFFER per connection"
echo "# clone capacity: unprobed C0 = $C0/s (redis-benchmark -P 32: ${RB##*: }), every probe on C1 = $C1/s"
echo "# uptime: $(uptime)"

# One run: LOAD (% of C0), MODE (fixed|adapt), RUN_S seconds of load, each
# client connection carrying CONN_S seconds of it; prints one row.
run_case() {
    local load=$1 mode=$2 run_s=$3 conn_s=$4
    local rate count per_conn out extra=()
    rate=$(python3 -c "print(round($C0 * $load / 100))")
    count=$(python3 -c "print(round($rate * $run_s))")
    per_conn=$(python3 -c "print(max(1, round($rate * $conn_s)))")
    out="$WORK/$load-$mode-$conn_s.out"
    [ "$mode" = adapt ] && extra=(--adapt)
    nsenter --net=/run/netns/"$NS" "$IPROBE" debug "$REDIS_PID" --listen 127.0.0.1:$LISTEN --production 127.0.0.1:$PORT --functions '*' \
        --no-trace --buffer "$BUFFER" --recloning on-overflow --json "${extra[@]}" > "$out" 2>"$out.err" &
    SESSION=$!
    for _ in $(seq 600); do grep -q '"event":"mirror"' "$out" 2>/dev/null && break; sleep 0.1; done
    in_ns "$PACED" -n "$per_conn" 127.0.0.1:$LISTEN "$rate" "$count" "${SORT[@]}" > "$out.load"
    kill -TERM "$SESSION"
    wait "$SESSION" || true
    SESSION=
    python3 "$(dirname "${BASH_SOURCE[0]}")/summarize.py" "$out" "$load" "$mode" "$rate" "$C1" "$REQUEST_BYTES" \
        "$BUFFER" "$run_s"
}

header() {
    echo
    echo "# $1"
    printf "%-6s %-6s %9s %12s %9s %9s %6s %10s %9s %12s\n" load mode "rate/s" "1st_window" overflows reclones cut \
        mirrored probed "model_W"
}

# 2. one client connection for the whole run: its debug window, against the model
header "one connection, ${RUN_S} s (model_W for fixed probes: the buffer alone .. plus 256K of kernel buffers)"
for load in $LOADS; do for mode in $MODES; do run_case "$load" "$mode" "$RUN_S" "$RUN_S"; done; done
# 3. clients that come and go: connections opened after a re-clone reach the new clone
header "a new connection every ${CONN_S} s, ${MANY_S} s"
for load in $MANY_LOADS; do for mode in $MODES; do run_case "$load" "$mode" "$MANY_S" "$CONN_S"; done; done
