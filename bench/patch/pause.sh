#!/bin/sh
# The stop-the-world pause of `iprobe patch` (and --revert) beside that of
# `iprobe attach`/`detach` of one probe, interleaved round by round on the
# same service (tests/patch/targets/patch_service) while two clients keep it
# busy.  Prints median, p90 and max per operation, in microseconds.
# usage: bench/patch/pause.sh [ROUNDS]   (root; after scripts/build)
set -eu
ROUNDS=${1:-50}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=$ROOT/build
T=$B/tests/patch-targets
[ -x "$T/patch_service" ] || { echo "build first: scripts/build (target patch_test_targets)" >&2; exit 7; }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
OUT=$(mktemp -d)
"$T/patch_service" "$PORT" & SVC=$!
LOAD=""
cleanup() { kill $LOAD $SVC 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT INT TERM
sleep 0.3
for c in 1 2; do
  python3 - "$PORT" <<'PY' &
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
req = "".join("QUOTE %d\r\n" % i for i in range(64)).encode()
while True:
    s.sendall(req)
    got = 0
    while got < 64:
        got += s.recv(65536).count(b"\r\n")
PY
  LOAD="$LOAD $!"
done
sleep 0.5
"$B/bin/iprobe" attach $SVC --functions serve --handler count >/dev/null   # the runtime is loaded once, before
"$B/bin/iprobe" detach $SVC >/dev/null
pause() { sed -n 's/.*"pause_us":\([0-9]*\).*/\1/p'; }
i=0
while [ $i -lt "$ROUNDS" ]; do
  "$B/bin/iprobe" attach $SVC --functions serve --entry-only --handler count --json | pause >>"$OUT/attach"
  "$B/bin/iprobe" detach $SVC --json | pause >>"$OUT/detach"
  "$B/bin/iprobe" patch $SVC --function quote --with "$T/libquote_fix.so" --json | pause >>"$OUT/patch"
  "$B/bin/iprobe" patch $SVC --revert --json | pause >>"$OUT/revert"
  i=$((i + 1))
done
printf '%-28s %8s %8s %8s\n' "operation ($ROUNDS rounds)" median p90 max
for op in attach detach patch revert; do
  sort -n "$OUT/$op" | awk -v op="$op" '{v[NR]=$1} END {printf "%-28s %8d %8d %8d\n", op, v[int((NR+1)/2)], v[int(NR*0.9+0.5)], v[NR]}'
done
