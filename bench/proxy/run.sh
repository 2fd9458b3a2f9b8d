#!/usr/bin/env bash
# Proxy benchmark (docs/design.md §9.7): redis-benchmark throughput and p50/p99
# latency direct vs proxy-only vs duplication, with the debug copy keeping up,
# stopped, or slowed by a SIGSTOP duty cycle; then the debug window vs the
# per-connection buffer size with a stopped and a slowed debug copy.
#
# usage: bench/proxy/run.sh [BUILD_DIR]      (default: ./build)
# env:   REQUESTS (default 100000), CLIENTS (50), ROUNDS (3), PIPELINE (16),
#        MODES (default: all below), WINDOWS=0 (skip the debug-window part),
#        BASELINE=BUILD_DIR: also run every mirrored mode with that build's
#        mirror (rows "MODE@base"), interleaved with this build's
set -euo pipefail

BUILD=${1:-build}
MIRROR="$BUILD/libexec/iprobe/iprobe-mirror"
BASE_MIRROR=${BASELINE:+$BASELINE/libexec/iprobe/iprobe-mirror}
REQUESTS=${REQUESTS:-100000}
CLIENTS=${CLIENTS:-50}
ROUNDS=${ROUNDS:-3}
PIPELINE=${PIPELINE:-16}
[ -x "$MIRROR" ] || { echo "no $MIRROR: build the iprobe-mirror target first" >&2; exit 7; }
[ -z "$BASE_MIRROR" ] || [ -x "$BASE_MIRROR" ] || { echo "no $BASE_MIRROR (BASELINE)" >&2; exit 7; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark missing (scripts/setup installs it)" >&2; exit 7; }

WORK=$(mktemp -d)
# Every background process goes into $WORK/pids (run_mode runs in subshells,
# so a shell array would not see them); cleanup ends exactly those.
track() { echo "$1" >> "$WORK/pids"; }
cleanup() {
    [ -f "$WORK/pids" ] && while read -r p; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done < "$WORK/pids"
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 130" INT TERM

. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

start_redis() {  # -> port in REDIS_PORT, pid in REDIS_PID
    REDIS_PORT=$(free_port)
    redis-server --port "$REDIS_PORT" --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
    REDIS_PID=$!
    track "$REDIS_PID"
    wait_port "$REDIS_PORT"
}

start_mirror() {  # args... -> MIRROR_PORT, STATS_PORT, MIRROR_PID
    local out; out=$(mktemp -p "$WORK")
    "${USE_MIRROR:-$MIRROR}" mirror --listen 127.0.0.1:0 --stats 127.0.0.1:0 --json --quiet "$@" > "$out" 2>&1 &
    MIRROR_PID=$!
    track "$MIRROR_PID"
    for _ in $(seq 1000); do grep -q '"listen"' "$out" 2>/dev/null && break; sleep 0.02; done
    MIRROR_PORT=$(sed -n 's/.*"listen":"[^"]*:\([0-9]*\)".*/\1/p' "$out" | head -1)
    STATS_PORT=$(sed -n 's/.*"stats":"[^"]*:\([0-9]*\)".*/\1/p' "$out" | head -1)
    [ -n "$MIRROR_PORT" ] || { echo "iprobe mirror did not start: $(cat "$out")" >&2; exit 1; }
}

stop_pid() { kill -CONT "$1" 2>/dev/null || true; kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

stats() { curl -s "http://127.0.0.1:$STATS_PORT/" 2>/dev/null || python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$STATS_PORT/').read().decode())"; }

# SIGSTOP duty cycle: the process runs 1/FACTOR of the time (10 ms slices).
slow_down() {  # pid factor
    local pid=$1 stopped_s
    stopped_s=$(python3 -c "print(0.01*($2-1))")
    ( while kill -0 "$pid" 2>/dev/null; do
          kill -CONT "$pid" 2>/dev/null; sleep 0.01
          kill -STOP "$pid" 2>/dev/null; sleep "$stopped_s"
      done ) &
    SLOWER_PID=$!
    track "$SLOWER_PID"
}

# redis-benchmark -> "rps p50 p99" (SET test)
bench() {  # port pipeline
    redis-benchmark -p "$1" -t set -n "$REQUESTS" -c "$CLIENTS" -P "$2" -r 100000 -d 64 --csv 2>/dev/null |
        python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin)]
h = rows[0]; r = rows[1]
print(r[h.index("rps")], r[h.index("p50_latency_ms")], r[h.index("p99_latency_ms")])'
}

median() { python3 -c 'import sys,statistics; v=[float(x) for x in sys.argv[1:]]; print(statistics.median(v))' "$@"; }

# One measurement of a mode; prints "rps p50 p99" and, for mirrored modes,
# the mirror's overflow count.
run_mode() {  # mode[@base] pipeline
    local mode=${1%@base} pipeline=$2
    local USE_MIRROR=$MIRROR
    [[ $1 == *@base ]] && USE_MIRROR=$BASE_MIRROR
    start_redis; local prod=$REDIS_PORT prod_pid=$REDIS_PID
    local debug_pid=""
    case $mode in
        direct)
            echo "$(bench "$prod" "$pipeline") - -"; stop_pid "$prod_pid"; return ;;
        proxy)
            start_mirror --production "127.0.0.1:$prod" ;;
        dup-sink)
            local sink_port; sink_port=$(free_port)
            python3 "$(dirname "$0")/sink.py" "$sink_port" & debug_pid=$!; track "$debug_pid"
            wait_port "$sink_port"
            start_mirror --production "127.0.0.1:$prod" --debug "127.0.0.1:$sink_port" --buffer 4M ;;
        dup|dup-resp|dup-stopped|dup-slow10|dup-slow100)
            start_redis; debug_pid=$REDIS_PID
            local extra=()
            [ "$mode" = dup-resp ] && extra=(--divergence resp)
            start_mirror --production "127.0.0.1:$prod" --debug "127.0.0.1:$REDIS_PORT" --buffer 4M "${extra[@]}"
            case $mode in
                dup-stopped) kill -STOP "$debug_pid" ;;
                dup-slow10) slow_down "$debug_pid" 10 ;;
                dup-slow100) slow_down "$debug_pid" 100 ;;
            esac ;;
    esac
    local result; result=$(bench "$MIRROR_PORT" "$pipeline")
    # CPU the proxy spent on the run: robust to other load on the machine
    local cpu_ms; cpu_ms=$(awk -v hz="$(getconf CLK_TCK)" '{print ($14+$15)*1000/hz}' "/proc/$MIRROR_PID/stat")
    local overflows; overflows=$(stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["buffer"]["overflows"])')
    echo "$result $overflows $cpu_ms"
    [ -n "${SLOWER_PID:-}" ] && { kill "$SLOWER_PID" 2>/dev/null || true; wait "$SLOWER_PID" 2>/dev/null || true; SLOWER_PID=""; }
    stop_pid "$MIRROR_PID"; stop_pid "$prod_pid"; [ -n "$debug_pid" ] && stop_pid "$debug_pid"
    return 0
}

echo "# modes: direct = redis-benchmark -> redis; proxy = through iprobe mirror without --debug;"
echo "#   dup-sink = duplication to a debug copy that only discards (isolates the proxy's cost);"
echo "#   dup = duplication to a second redis (on the same cores: it competes for CPU);"
echo "#   dup-resp = dup + --divergence resp; dup-stopped = debug redis SIGSTOPped;"
echo "#   dup-slowN = debug redis running 1/N of the time (SIGSTOP duty cycle, 10 ms slices)"
echo "# proxy benchmark: redis-benchmark -t set -n $REQUESTS -c $CLIENTS -r 100000 -d 64, median of $ROUNDS rounds (modes interleaved)"
echo "# $(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f1-3)"
read -r -a MODES <<<"${MODES:-direct proxy dup-sink dup dup-resp dup-stopped dup-slow10 dup-slow100}"
if [ -n "$BASE_MIRROR" ]; then
    with_base=()
    for m in "${MODES[@]}"; do with_base+=("$m"); [ "$m" != direct ] && with_base+=("$m@base"); done
    MODES=("${with_base[@]}")
fi
for pipeline in 1 "$PIPELINE"; do
    declare -A RPS=() P50=() P99=() OVF=() CPU=()
    for round in $(seq "$ROUNDS"); do
        for mode in "${MODES[@]}"; do
            read -r rps p50 p99 ovf cpu < <(run_mode "$mode" "$pipeline")
            RPS[$mode]+="$rps "; P50[$mode]+="$p50 "; P99[$mode]+="$p99 "; OVF[$mode]+="$ovf "; CPU[$mode]+="$cpu "
        done
    done
    proxy_rps=$(median ${RPS[proxy]})
    printf '\n## pipeline %s\n' "$pipeline"
    printf '%-16s %10s %9s %9s %14s %10s %14s\n' mode "req/s" "p50 ms" "p99 ms" "vs proxy-only" "overflows" "proxy CPU ms"
    for mode in "${MODES[@]}"; do
        rps=$(median ${RPS[$mode]}); p50=$(median ${P50[$mode]}); p99=$(median ${P99[$mode]})
        rel=$(python3 -c "print(f'{($rps/$proxy_rps-1)*100:+.1f}%')")
        ovf=$(echo "${OVF[$mode]}" | awk '{print $NF}')
        cpu=$(echo "${CPU[$mode]}" | awk '{print $NF}')
        [ "$cpu" != - ] && cpu=$(median ${CPU[$mode]})
        printf '%-16s %10.0f %9.3f %9.3f %14s %10s %14s\n' "$mode" "$rps" "$p50" "$p99" "$rel" "$ovf" "$cpu"
    done
    unset RPS P50 P99 OVF CPU
done

# Debug window vs buffer size: 10 pipelined connections writing SETs (~100 B
# values) as fast as production answers; the debug copy stopped or slowed.
window_run() {  # buffer slowdown(stopped|N)
    start_redis; local prod=$REDIS_PORT prod_pid=$REDIS_PID
    start_redis; local debug_pid=$REDIS_PID
    start_mirror --production "127.0.0.1:$prod" --debug "127.0.0.1:$REDIS_PORT" --buffer "$1" --buffer-total 4G
    if [ "$2" = stopped ]; then kill -STOP "$debug_pid"; else slow_down "$debug_pid" "$2"; fi
    redis-benchmark -p "$MIRROR_PORT" -t set -n 1000000 -c 10 -P 16 -r 100000 -d 100 -q >/dev/null 2>&1
    stats | python3 -c '
import json, sys
s = json.load(sys.stdin)
w = s["debug_windows_ms"]; b = s["bytes"]
up = s["uptime_s"]
print("%9d %12.1f %12.1f %12.1f %10.1f" % (w["count"], w["min"], w["mean"], w["max"], b["client_to_production"] / 1e6))'
    [ -n "${SLOWER_PID:-}" ] && { kill "$SLOWER_PID" 2>/dev/null || true; wait "$SLOWER_PID" 2>/dev/null || true; SLOWER_PID=""; }
    stop_pid "$MIRROR_PID"; stop_pid "$prod_pid"; stop_pid "$debug_pid"
}

[ "${WINDOWS:-1}" = 0 ] && exit 0
printf '\n## debug window vs buffer (10 connections, -P 16, 1M SETs of 100 B; window = connection start to overflow)\n'
printf '%-8s %-9s %9s %12s %12s %12s %10s\n' buffer debug overflows "min ms" "mean ms" "max ms" "MB sent"
for slow in stopped 10 100; do
    for buf in 64K 1M 16M 64M; do
        label=$([ "$slow" = stopped ] && echo stopped || echo "${slow}x slower")
        printf '%-8s %-9s %s\n' "$buf" "$label" "$(window_run "$buf" "$slow")"
    done
done
