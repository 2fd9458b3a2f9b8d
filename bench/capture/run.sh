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
#   capture-all-idle    the mirror under SCHED_IDLE too: production first; what
#                       the mirror then cannot read in time is capture loss
#   proxy-clone         clients -> iprobe mirror --listen -> production, the
#                       same live clone as the debug copy
# Redis under redis-benchmark (unpipelined and pipelined), then nginx under wrk.
# Reported per mode: throughput, p50/p99 latency, capture loss, and CPU time
# per request (user + system) of production, of the load generator, of the
# mirror and of the clone.  Throughput on a machine shared with other work
# moves with that work; CPU per request does not, and shows where each
# mode's cost lands (on loopback the kernel's receive path, the capture's tap
# included, runs in the sender's context: production's for its replies, the
# client's for its requests).
#
# usage: bench/capture/run.sh [BUILD_DIR]        (as root; alone on the machine, or under the flock(1) lock every benchmark there takes)
# env:   REQUESTS (100000), CLIENTS (50), PIPELINE (16), ROUNDS (9),
#        HTTP_SECONDS (3), HTTP_CONNECTIONS (32), SECTIONS ("redis http"),
#        MODES (default: all above)
set -euo pipefail

BUILD=${1:-build}
MIRROR="$BUILD/libexec/iprobe/iprobe-mirror"
REQUESTS=${REQUESTS:-100000}
CLIENTS=${CLIENTS:-50}
PIPELINE=${PIPELINE:-16}
ROUNDS=${ROUNDS:-9}
HTTP_SECONDS=${HTTP_SECONDS:-3}
HTTP_CONNECTIONS=${HTTP_CONNECTIONS:-32}
read -r -a SECTIONS <<<"${SECTIONS:-redis http}"
read -r -a MODES <<<"${MODES:-direct capture-only capture-sink capture-clone capture-clone-idle capture-all-idle proxy-clone}"
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
    "$@" nginx -p "$tmp" -c "$conf" >/dev/null 2>&1 &
    SERVICE_PID=$!; track "$SERVICE_PID"; wait_port "$SERVICE_PORT"
}

start_sink() {  # -> SERVICE_PORT SERVICE_PID
    SERVICE_PORT=$(free_port)
    python3 "$HERE/../proxy/sink.py" "$SERVICE_PORT" >/dev/null 2>&1 &
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

# Runs a load generator; prints its output, then "CPU-MS" and its user + system time.
with_cpu() {
    python3 -c '
import resource, subprocess, sys
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(out + "\nCPU-MS %.1f" % ((u.ru_utime + u.ru_stime) * 1000))' "$@"
}

redis_load() {  # port pipeline -> "rps p50 p99 requests client_cpu_ms"
    with_cpu redis-benchmark -p "$1" -t set -n "$REQUESTS" -c "$CLIENTS" -P "$2" -r 100000 -d 64 --csv |
        python3 -c '
import csv, sys
lines = [l for l in sys.stdin.read().splitlines() if l]
cpu = lines[-1].split()[1]
rows = list(csv.reader(lines[:-1])); h, r = rows[0], rows[1]
print(r[h.index("rps")], r[h.index("p50_latency_ms")], r[h.index("p99_latency_ms")], sys.argv[1], cpu)' "$REQUESTS"
}

http_load() {  # port -> "rps p50 p99 requests client_cpu_ms"
    with_cpu wrk -t 1 -c "$HTTP_CONNECTIONS" -d "${HTTP_SECONDS}s" --latency "http://127.0.0.1:$1/index.html" |
        python3 -c '
import re, sys
text = sys.stdin.read()
def ms(v):
    n, unit = re.match(r"([0-9.]+)(us|ms|s)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1, "s": 1000}[unit]
rps = re.search(r"Requests/sec:\s+([0-9.]+)", text).group(1)
pct = lambda p: ms(re.search(r"^\s+" + p + r"%\s+(\S+)", text, re.M).group(1))  # the distribution lines only
p50 = pct("50"); p99 = pct("99")
requests = re.search(r"([0-9]+) requests in", text).group(1)
cpu = re.search(r"CPU-MS ([0-9.]+)", text).group(1)
print(rps, p50, p99, requests, cpu)'
}

# One measurement: "rps p50 p99 requests client_ms production_ms mirror_ms clone_ms loss"
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
        capture-clone|capture-clone-idle|capture-all-idle)
            if [ "$mode" = capture-clone ]; then $start; else $start chrt --idle 0; fi
            copy_pid=$SERVICE_PID
            start_mirror --capture "lo:$prod" --debug "127.0.0.1:$SERVICE_PORT" --divergence "$protocol"
            [ "$mode" = capture-all-idle ] && chrt --idle -p 0 "$MIRROR_PID" ;;
        proxy-clone)
            $start; copy_pid=$SERVICE_PID
            start_mirror --listen 127.0.0.1:0 --production "127.0.0.1:$prod" --debug "127.0.0.1:$SERVICE_PORT" \
                --divergence "$protocol"
            target=$LISTEN_PORT ;;
    esac
    local result pcpu0 pcpu
    pcpu0=$(cpu_ms "$prod_pid")
    if [ "$section" = redis ]; then result=$(redis_load "$target" "$pipeline") || result="0 0 0 1 0"
    else result=$(http_load "$target") || result="0 0 0 1 0"; fi
    pcpu=$(python3 -c "print($(cpu_ms "$prod_pid") - $pcpu0)")
    sleep 0.3  # the copy finishes what it was sent
    local mcpu=- ccpu=- loss=-
    if [ -n "$MIRROR_PID" ]; then mcpu=$(cpu_ms "$MIRROR_PID"); loss=$(capture_loss); fi
    [ -n "$copy_pid" ] && ccpu=$(cpu_ms "$copy_pid")
    echo "$result $pcpu $mcpu $ccpu $loss"
    [ -n "$MIRROR_PID" ] && stop_pid "$MIRROR_PID"
    [ -n "$copy_pid" ] && stop_pid "$copy_pid"
    stop_pid "$prod_pid"
}

report() {  # title section pipeline
    local title=$1 section=$2 pipeline=$3
    declare -A RPS=() P50=() P99=() US=() LOSS=()
    for _ in $(seq "$ROUNDS"); do
        for mode in "${MODES[@]}"; do
            read -r rps p50 p99 requests client prod mirror clone loss < <(run_mode "$section" "$mode" "$pipeline")
            RPS[$mode]+="$rps "; P50[$mode]+="$p50 "; P99[$mode]+="$p99 "; LOSS[$mode]+="$loss "
            US[$mode]+="$requests,$prod,$client,$mirror,$clone "
        done
    done
    local direct; direct=$(median ${RPS[direct]})
    printf '\n## %s (median of %s rounds; load average %s)\n' "$title" "$ROUNDS" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf '%-19s %9s %8s %8s %8s | %-31s | %s\n' mode "req/s" "% direct" "p50 ms" "p99 ms" \
        "CPU us/req: prod client mirror clone" "lost/drops"
    for mode in "${MODES[@]}"; do
        local rps p50 p99
        rps=$(median ${RPS[$mode]}); p50=$(median ${P50[$mode]}); p99=$(median ${P99[$mode]})
        printf '%-19s %9.0f %7.1f%% %8.3f %8.3f | %-31s | %s\n' "$mode" "$rps" \
            "$(python3 -c "print($rps/$direct*100)")" "$p50" "$p99" "$(us_per_request ${US[$mode]})" \
            "$(echo "${LOSS[$mode]}" | tr ' ' ',' | sed 's/,$//')"
    done
}

# "requests,prod_ms,client_ms,mirror_ms,clone_ms" per round -> median CPU us per request of each
us_per_request() {
    python3 -c '
import statistics, sys
rows = [r.split(",") for r in sys.argv[1:]]
cols = []
for i in range(1, 5):
    v = [float(r[i]) * 1000 / float(r[0]) for r in rows if r[i] != "-"]
    cols.append("%7.2f" % statistics.median(v) if v else "      -")
print(" ".join(cols))' "$@"
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
