#!/usr/bin/env bash
# Side by side: a keep-alive HTTP client behind nginx's `mirror` and behind
# `iprobe mirror`, with the mirror target (debug copy) healthy and SIGSTOPped.
# nginx finishes a request only when its mirror subrequest is done, so a slow
# mirror stalls the next request on a keep-alive connection; iprobe mirror
# must not care.  Production: an nginx server block answering 200.
#
# usage: bench/proxy/nginx_mirror.sh [BUILD_DIR]   (needs nginx, curl; scripts/setup.d/proxy-bench)
# env:   REQUESTS per client connection (default 50), MIRROR_TIMEOUT nginx's
#        proxy_read_timeout for the mirror subrequest (default 1s; nginx's own default is 60s)
set -euo pipefail
BUILD=${1:-build}
MIRROR="$BUILD/libexec/iprobe/iprobe-mirror"
REQUESTS=${REQUESTS:-50}
MIRROR_TIMEOUT=${MIRROR_TIMEOUT:-1s}
command -v nginx >/dev/null || { echo "nginx not installed (scripts/setup.d/proxy-bench)" >&2; exit 7; }
command -v curl >/dev/null || { echo "curl not installed" >&2; exit 7; }
[ -x "$MIRROR" ] || { echo "no $MIRROR: build the iprobe-mirror target first" >&2; exit 7; }

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 130" INT TERM
. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

PROD=$(free_port); FRONT=$(free_port); DEBUG=$(free_port); IPROBE=$(free_port)
mkdir -p "$WORK/tmp"
cat > "$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon on;
pid $WORK/nginx.pid;
error_log $WORK/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $WORK/tmp; proxy_temp_path $WORK/tmp; fastcgi_temp_path $WORK/tmp;
    uwsgi_temp_path $WORK/tmp; scgi_temp_path $WORK/tmp;
    upstream production { server 127.0.0.1:$PROD; keepalive 16; }
    server {   # production
        listen 127.0.0.1:$PROD;
        location / { return 200 "hello from production\n"; }
    }
    server {   # nginx mirror in front of production
        listen 127.0.0.1:$FRONT;
        location / {
            mirror /mirror;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://production;
        }
        location = /mirror {
            internal;
            proxy_connect_timeout $MIRROR_TIMEOUT;
            proxy_read_timeout $MIRROR_TIMEOUT;
            proxy_send_timeout $MIRROR_TIMEOUT;
            proxy_pass http://127.0.0.1:$DEBUG\$request_uri;
        }
    }
}
EOF
nginx -c "$WORK/nginx.conf" -p "$WORK" 2>"$WORK/nginx.err" || { cat "$WORK/nginx.err" >&2; exit 1; }
wait_port "$PROD"; wait_port "$FRONT"

# The debug copy: a python HTTP server (answers every GET with 200).
python3 -m http.server "$DEBUG" --bind 127.0.0.1 --directory "$WORK/tmp" >/dev/null 2>&1 &
DEBUG_PID=$!; PIDS+=("$DEBUG_PID"); wait_port "$DEBUG"

"$MIRROR" mirror --listen "127.0.0.1:$IPROBE" --production "127.0.0.1:$PROD" --debug "127.0.0.1:$DEBUG" \
    --divergence http --quiet >/dev/null 2>&1 &
PIDS+=("$!"); wait_port "$IPROBE"

# One keep-alive connection, REQUESTS sequential GETs: per-request seconds.
client() {
    local urls=()
    for i in $(seq "$REQUESTS"); do urls+=(-o /dev/null "http://127.0.0.1:$1/item/$i"); done
    curl -s --max-time 600 -w '%{time_total}\n' "${urls[@]}" |
        python3 -c '
import sys, statistics
t = [float(x) for x in sys.stdin.read().split()]
# curl reports time_total from the start of each transfer
print("%8d %10.2f %10.2f %10.2f %10.2f" % (len(t), statistics.median(t)*1e3, sorted(t)[int(len(t)*0.99)-1]*1e3, max(t)*1e3, sum(t)))'
}

echo "# keep-alive client: curl, $REQUESTS sequential GETs on one connection; nginx mirror timeouts $MIRROR_TIMEOUT"
printf '%-34s %8s %10s %10s %10s %10s\n' setup requests "p50 ms" "p99 ms" "max ms" "total s"
printf '%-34s %s\n' "direct (production)" "$(client "$PROD")"
printf '%-34s %s\n' "nginx mirror, debug healthy" "$(client "$FRONT")"
printf '%-34s %s\n' "iprobe mirror, debug healthy" "$(client "$IPROBE")"
kill -STOP "$DEBUG_PID"
printf '%-34s %s\n' "nginx mirror, debug SIGSTOPped" "$(client "$FRONT")"
printf '%-34s %s\n' "iprobe mirror, debug SIGSTOPped" "$(client "$IPROBE")"
kill -CONT "$DEBUG_PID"
