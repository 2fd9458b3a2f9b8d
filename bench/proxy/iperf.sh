#!/usr/bin/env bash
# Raw TCP throughput through iprobe mirror (iperf3, one stream, loopback):
# direct vs proxy-only vs duplication to a discarding debug copy vs
# duplication to a stopped debug copy (its connections overflow, production
# goes on).  Median of ROUNDS runs per mode, modes interleaved.
#
# usage: bench/proxy/iperf.sh [BUILD_DIR]   env: SECONDS_PER_RUN (5), ROUNDS (3),
#        BASELINE=BUILD_DIR: the same mirrored modes with that build's mirror too ("MODE@base")
set -euo pipefail
BUILD=${1:-build}
MIRROR="$BUILD/libexec/iprobe/iprobe-mirror"
SECS=${SECONDS_PER_RUN:-5}
ROUNDS=${ROUNDS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v iperf3 >/dev/null || { echo "iperf3 not installed (scripts/setup.d/proxy-bench)" >&2; exit 7; }
[ -x "$MIRROR" ] || { echo "no $MIRROR: build the iprobe-mirror target first" >&2; exit 7; }

# Background processes are listed in $PIDFILE (start_mirror runs in a
# command substitution, a subshell); cleanup ends exactly those.
PIDFILE=$(mktemp)
track() { echo "$1" >> "$PIDFILE"; }
cleanup() {
    while read -r p; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done < "$PIDFILE"
    wait 2>/dev/null || true
    rm -f "$PIDFILE"
}
trap cleanup EXIT
trap "exit 130" INT TERM
. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

SERVER=$(free_port)
iperf3 -s -p "$SERVER" >/dev/null 2>&1 & track "$!"; wait_port "$SERVER"
SINK=$(free_port)
python3 "$HERE/sink.py" "$SINK" & track "$!"; wait_port "$SINK"
STOPPED=$(free_port)
python3 "$HERE/sink.py" "$STOPPED" & STOPPED_PID=$!; track "$STOPPED_PID"; wait_port "$STOPPED"
kill -STOP "$STOPPED_PID"

start_mirror() {
    local port; port=$(free_port)
    "${USE_MIRROR:-$MIRROR}" mirror --listen "127.0.0.1:$port" --production "127.0.0.1:$SERVER" --quiet "$@" >/dev/null 2>&1 &
    track "$!"; wait_port "$port"; echo "$port"
}
PROXY=$(start_mirror)
DUP=$(start_mirror --debug "127.0.0.1:$SINK")
DUP_STOPPED=$(start_mirror --debug "127.0.0.1:$STOPPED" --buffer 4M)
declare -A PORT=([direct]=$SERVER [proxy]=$PROXY [dup-sink]=$DUP [dup-stopped]=$DUP_STOPPED)
MODES=(direct proxy dup-sink dup-stopped)
if [ -n "${BASELINE:-}" ]; then
    USE_MIRROR=$BASELINE/libexec/iprobe/iprobe-mirror
    PORT[proxy@base]=$(start_mirror)
    PORT[dup-sink@base]=$(start_mirror --debug "127.0.0.1:$SINK")
    PORT[dup-stopped@base]=$(start_mirror --debug "127.0.0.1:$STOPPED" --buffer 4M)
    MODES=(direct proxy proxy@base dup-sink dup-sink@base dup-stopped dup-stopped@base)
fi

gbps() { iperf3 -c 127.0.0.1 -p "$1" -t "$SECS" -J 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)'; }
median() { python3 -c 'import sys,statistics; print("%.2f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

declare -A R=()
for _ in $(seq "$ROUNDS"); do
    for m in "${MODES[@]}"; do R[$m]+="$(gbps "${PORT[$m]}") "; done
done
echo "# iperf3 -t $SECS, 1 stream, loopback, median of $ROUNDS"
printf '%-17s %10s %14s\n' mode Gbit/s "vs proxy-only"
p=$(median ${R[proxy]})
for m in "${MODES[@]}"; do
    v=$(median ${R[$m]})
    printf '%-17s %10s %14s\n' "$m" "$v" "$(python3 -c "print(f'{($v/$p-1)*100:+.1f}%')")"
done
