# Sourced by bench/hotpatch/run.sh and relocated.sh (which set $work): the
# benchmark targets' start and finish, and reading their "N ns" lines.
log() { printf '%s\n' "$*" >&2; }
# start BINARY ARGS... : runs it in the background, waits for "ready"; sets $pid, $out
start() {
  out="$work/out.$RANDOM"
  "$@" >"$out" 2>&1 &
  pid=$!
  for _ in $(seq 1 500); do grep -q ready "$out" 2>/dev/null && return 0; sleep 0.01; done
  log "$1 did not start"; cat "$out" >&2; exit 1
}
finish() { kill -USR1 "$pid"; wait "$pid"; }
ns_at() { awk -v n="$2" '$1 == n { print $2 }' "$1"; }
