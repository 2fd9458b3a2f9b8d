# Sourced by bench/hotpatch/run.sh, relocated.sh and values.sh (which set $work): the
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
# many_functions N [T]: $work/many_N (T threads: many_N_tT), built once with
# $build's iprobe-cc: N empty functions that T threads (default 8) call
# round-robin (gen_functions.py), the target of the stop-the-world pause
# benchmarks; sets many_binary
many_functions() {
  local threads=${2:-8} name="many_$1"
  ((threads == 8)) || name+="_t$threads"
  many_binary="$work/$name"
  [[ -x $many_binary ]] || { python3 "$here/gen_functions.py" "$1" "$threads" >"$many_binary.c";
    "$build/bin/iprobe-cc" -O1 -o "$many_binary" "$many_binary.c" -lpthread; }
}
# pause_target: builds the target both pause benchmarks stop (pause_repeat.sh,
# pause_breakdown.sh): PROBES (10000) probes, entries and exits, so
# PROBES/2 functions, called by THREADS (8) spinning threads; sets probes,
# fns, threads and many_binary
pause_target() {
  probes=${PROBES:-10000}
  fns=$((probes / 2))
  threads=${THREADS:-8}
  many_functions "$fns" "$threads"
}
ns_at() { awk -v n="$2" '$1 == n { print $2 }' "$1"; }
# run_variant NAME BINARY [ATTACH ARGS...]: runs BINARY $max_exp $repeats
# times (a fresh process each, attached with ATTACH ARGS by $iprobe when
# given) and keeps, per size, the fastest run in $work/result.NAME: the
# machine is shared, and preemption only ever adds time.  A name not in
# $variants (when the caller sets it) is skipped.
run_variant() {  # name binary [attach args...]
  [[ -z ${variants:-} || $variants == *" $1 "* ]] || return 0
  : >"$work/result.$1.all"
  for ((r = 0; r < repeats; r++)); do run_once "$@"; done
  keep_fastest "$1"
}
# run_once NAME BINARY [ATTACH ARGS...]: one run of the above, its sizes
# appended to $work/result.NAME.all.  Callers comparing variants with each
# other interleave them (a round of every variant, $repeats rounds), so that
# a VM whose speed drifts over seconds gives each the same moments.
run_once() {  # name binary [attach args...]
  local name=$1 binary=$2
  shift 2
  start "$binary" "$max_exp"
  # first_attach (words): an attach made before this variant's own
  # a failed attach ends the run, and takes its target with it (it would
  # wait for a SIGUSR1 for ever)
  if [[ -n ${first_attach:-} ]]; then "$iprobe" attach "$pid" $first_attach >/dev/null || { kill "$pid"; exit 1; }; fi
  if (($#)); then "$iprobe" attach "$pid" "$@" >/dev/null || { kill "$pid"; exit 1; }; fi
  finish
  grep -v ready "$out" >>"$work/result.$name.all"
}
# keep_fastest NAME: $work/result.NAME, per size the fastest of result.NAME.all
keep_fastest() {
  awk '!($1 in m) || $2 < m[$1] { m[$1] = $2 } END { for (n in m) print n, m[n] }' "$work/result.$1.all" |
    sort -n >"$work/result.$1"
}
