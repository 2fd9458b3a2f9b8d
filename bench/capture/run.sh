#!/usr/bin/env bash
# Capture benchmark (issue 14): what production gives up when its traffic is
# mirrored by passive capture (`iprobe mirror --capture`, nothing in its path)
# instead of through the proxy (`iprobe mirror --listen`), side by side in one
# run, modes interleaved round by round:
#   direct              clients -> production
#   capture-only        the capture following every connection, no copy fed:
#                       the kernel's tap and ring plus the mirror's reassembly
#   capture-sink        capture feeding a copy that only discards: the
#                       capture's whole cost, the copy's own CPU aside
#   capture-clone       capture feeding a live clone (a second server on the
#                       same 2 cores: it competes with production for CPU)
#   capture-clone-idle  the same with the clone under SCHED_IDLE: it gets only
#                       CPU that production and its clients leave idle
#   proxy-clone         clients -> iprobe mirror --listen -> production, the
#                       same live clone as the debug copy
# Redis under redis-benchmark (unpipelined and pipelined), then nginx under wrk.
# Reported per mode: throughput, p50/p99 latency, the mirror's CPU (user +
# system, from /proc) and the clone's, capture loss.
#
# usage: bench/capture/run.sh [BUILD_DIR]        (as root; under flock /work/notes/bench.lock)
# env:   REQUESTS (200000), CLIENTS (50), PIPELINE (16), ROUNDS (5),
#        HTTP_SECONDS (5), HTTP_CONNECTIONS (32), SECTIONS ("redis http"),
#        MODES (default: all above)
set -euo pipefail

BUILD=${1:-build}
MIRROR="$BUILD/libexec/iprobe/iprobe-mirror"
REQUESTS=${REQUESTS:-200000}
CLIENTS=${CLIENTS:-50}
PIPELINE=${PIPELINE:-16}
ROUNDS=${ROUNDS:-5}
HTTP_SECONDS=${HTTP_SECONDS:-5}
HTTP_CONNECTIONS=${HTTP_CONNECTIONS:-32}
read -r -a SECTIONS <<<"${SECTIONS:-redis http}"
read -r -a MODES <<<"${MODES:-direct capture-only capture-sink capture-clone capture-clone-idle proxy-clone}"
[ -x "$MIRROR" ] || { echo "no $MIRROR: build the iprobe-mirror target first" >&2; exit 7; }
[ "$(id -u)" = 0 ] || { echo "packet capture needs root" >&2; exit 4; }
for tool in redis-server redis-benchmark nginx wrk chrt python3; do
    command -v "$tool" >/dev/null || { echo "$tool missing (scripts/setup, scripts/setup.d/proxy-bench)" >&2; exit 7; }
done
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/../proxy/ports.sh"

WORK=$(mktemp -d)
track() { echo "$1" >> "$WORK/pids"; }
cleanup() {
    [ -f "$WORK/pids" ] && while read -r p; do kill "$p" 2>/dev/null || true; done < "$WORK/pids"
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 130" INT TERM

stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14+$15)*1000/hz}' "/proc/$1/stat"; }
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

# --- the services: production, and the copy a mode feeds ---------------------

start_redis() {  # [chrt args...] -> SERVICE_PORT SERVICE_PID
    SERVICE_PORT=$(free_port)
    "$@" redis-server --port "$SERVICE_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
    SERVICE_PID=$!; track "$SERVICE_PID"; wait_port "$SERVICE_PORT"
}

mkdir -p "$WORK/www"
head -c 1024 /dev/zero | tr '\0' 'x' > "$WORK/www/index.html"
start_nginx() {  # [chrt args...] -> SERVICE_PORT SERVICE_PID
    SERVICE_PORT=$(free_port)
    local conf="$WORK/nginx-$SERVICE_PORT.conf" tmp="$WORK/nginx-$SERVICE_PORT"
    mkdir -p "$tmp"
    cat > "$conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
error_log $tmp/error.log error;
pid $tmp/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 100000000;
    client_body_temp_path $tmp; proxy_temp_path $tmp; fastcgi_temp_path $tmp; uwsgi_temp_path $tmp; scgi_temp_path $tmp;
    server { listen 127.0.0.1:$SERVICE_PORT; root $WORK/www; }
}
EOF
    "$@" nginx -p "$tmp" -c "$conf" &
    SERVICE_PID=$!; track "$SERVICE_PID"; wait_port "$SERVICE_PORT"
}

start_sink() {  # -> SERVICE_PORT SERVICE_PID
    SERVICE_PORT=$(free_port)
    python3 "$HERE/../proxy/sink.py" "$SERVICE_PORT" &
    SERVICE_PID=$!; track "$SERVICE_PID"; wait_port "$SERVICE_PORT"
}

start_mirror() {  # args... -> MIRROR_PID STATS_PORT [LISTEN_PORT]
    local out; out=$(mktemp -p "$WORK")
    "$MIRROR" mirror --stats 127.0.0.1:0 --json --quiet "$@" > "$out" 2>&1 &
    MIRROR_PID=$!; track "$MIRROR_PID"
    for _ in $(seq 1000); do grep -q '"stats"' "$out" 2>/dev/null && break; sleep 0.02; done
    STATS_PORT=$(sed -n 's/.*"stats":"[^"]*:\([0-9]*\)".*/\1/p' "$out" | head -1)
    LISTEN_PORT=$(sed -n 's/.*"listen":"[^"]*:\([0-9]*\)".*/\1/p' "$out" | head -1)
    [ -n "$STATS_PORT" ] || { echo "iprobe mirror did not start: $(cat "$out")" >&2; exit 1; }
}

# lost connections + kernel drops, from the mirror's stats
capture_loss() {
    python3 - "$STATS_PORT" <<'EOF'
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/"))
c = s.get("capture") or {}
print(f'{c.get("lost_connections", 0) + s["buffer"]["overflows"]}/{c.get("kernel_drops", 0)}')
EOF
}

# --- the loads ---------------------------------------------------------------

redis_load() {  # port pipeline -> "rps p50 p99"
    redis-benchmark -p "$1" -t set -n "$REQUESTS" -c "$CLIENTS" -P "$2" -r 100000 -d 64 --csv 2>/dev/null |
        python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin)); h, r = rows[0], rows[1]
print(r[h.index("rps")], r[h.index("p50_latency_ms")], r[h.index("p99_latency_ms")])'
}

http_load() {  # port -> "rps p50 p99"
    wrk -t 1 -c "$HTTP_CONNECTIONS" -d "${HTTP_SECONDS}s" --latency "http://127.0.0.1:$1/index.html" 2>/dev/null |
        python3 -c '
import re, sys
text = sys.stdin.read()
def ms(v):
    n, unit = re.match(r"([0-9.]+)(us|ms|s)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1, "s": 1000}[unit]
rps = re.search(r"Requests/sec:\s+([0-9.]+)", text).group(1)
pct = lambda p: ms(re.search(r"^\s+" + p + r"%\s+(\S+)", text, re.M).group(1))  # the distribution lines only
p50 = pct("50"); p99 = pct("99")
print(rps, p50, p99)'
}

# One measurement: "rps p50 p99 mirror_cpu_ms clone_cpu_ms loss"
run_mode() {  # section mode pipeline
    local section=$1 mode=$2 pipeline=$3 start protocol
    if [ "$section" = redis ]; then start=start_redis; protocol=resp; else start=start_nginx; protocol=http; fi
    $start; local prod=$SERVICE_PORT prod_pid=$SERVICE_PID
    local copy_pid="" target=$prod
    MIRROR_PID=""
    case $mode in
        direct) ;;
        capture-only)
            start_mirror --capture "lo:$prod" --join "$protocol" ;;
        capture-sink)
            start_sink; copy_pid=$SERVICE_PID
            start_mirror --capture "lo:$prod" --join "$protocol" --debug "127.0.0.1:$SERVICE_PORT" ;;
        capture-clone|capture-clone-idle)
            if [ "$mode" = capture-clone-idle ]; then $start chrt --idle 0; else $start; fi
            copy_pid=$SERVICE_PID
            start_mirror --capture "lo:$prod" --debug "127.0.0.1:$SERVICE_PORT" --divergence "$protocol" ;;
        proxy-clone)
            $start; copy_pid=$SERVICE_PID
            start_mirror --listen 127.0.0.1:0 --production "127.0.0.1:$prod" --debug "127.0.0.1:$SERVICE_PORT" \
                --divergence "$protocol"
            target=$LISTEN_PORT ;;
    esac
    local result
    if [ "$section" = redis ]; then result=$(redis_load "$target" "$pipeline"); else result=$(http_load "$target"); fi
    sleep 0.3  # the copy finishes what it was sent
    local mcpu=- ccpu=- loss=-
    if [ -n "$MIRROR_PID" ]; then mcpu=$(cpu_ms "$MIRROR_PID"); loss=$(capture_loss); fi
    [ -n "$copy_pid" ] && ccpu=$(cpu_ms "$copy_pid")
    echo "$result $mcpu $ccpu $loss"
    [ -n "$MIRROR_PID" ] && stop_pid "$MIRROR_PID"
    [ -n "$copy_pid" ] && stop_pid "$copy_pid"
    stop_pid "$prod_pid"
}

report() {  # title section pipeline
    local title=$1 section=$2 pipeline=$3
    declare -A RPS=() P50=() P99=() MCPU=() CCPU=() LOSS=()
    for _ in $(seq "$ROUNDS"); do
        for mode in "${MODES[@]}"; do
            read -r rps p50 p99 mcpu ccpu loss < <(run_mode "$section" "$mode" "$pipeline")
            RPS[$mode]+="$rps "; P50[$mode]+="$p50 "; P99[$mode]+="$p99 "
            MCPU[$mode]+="$mcpu "; CCPU[$mode]+="$ccpu "; LOSS[$mode]+="$loss "
        done
    done
    local direct; direct=$(median ${RPS[direct]})
    printf '\n## %s (median of %s rounds; load average %s)\n' "$title" "$ROUNDS" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf '%-19s %10s %8s %9s %9s %12s %11s %10s\n' mode "req/s" "% direct" "p50 ms" "p99 ms" "mirror CPU ms" "clone CPU ms" "lost/drops"
    for mode in "${MODES[@]}"; do
        local rps p50 p99 mcpu ccpu
        rps=$(median ${RPS[$mode]}); p50=$(median ${P50[$mode]}); p99=$(median ${P99[$mode]})
        mcpu=$(echo "${MCPU[$mode]}" | awk '{print $1}'); [ "$mcpu" != - ] && mcpu=$(median ${MCPU[$mode]})
        ccpu=$(echo "${CCPU[$mode]}" | awk '{print $1}'); [ "$ccpu" != - ] && ccpu=$(median ${CCPU[$mode]})
        printf '%-19s %10.0f %7.1f%% %9.3f %9.3f %12s %11s %10s\n' "$mode" "$rps" \
            "$(python3 -c "print($rps/$direct*100)")" "$p50" "$p99" "$mcpu" "$ccpu" "$(echo "${LOSS[$mode]}" | tr ' ' ',' | sed 's/,$//')"
    done
}

echo "# capture benchmark: $(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f1-3), $(nginx -v 2>&1), wrk $(wrk -v 2>&1 | head -1 | cut -d' ' -f2)"
echo "# lost/drops per round: connections whose copy was cut (capture loss or buffer overflow) / packets the kernel dropped"
for section in "${SECTIONS[@]}"; do
    case $section in
        redis)
            report "redis-benchmark -t set -n $REQUESTS -c $CLIENTS -d 64, unpipelined" redis 1
            report "redis-benchmark -t set -n $REQUESTS -c $CLIENTS -d 64, pipeline $PIPELINE" redis "$PIPELINE" ;;
        http)
            report "nginx (1 KiB file, one worker) under wrk -t 1 -c $HTTP_CONNECTIONS -d ${HTTP_SECONDS}s" http - ;;
    esac
done
