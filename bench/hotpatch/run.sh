#!/usr/bin/env bash
# Hotpatch benchmarks (docs/design.md §9.2-9.4), side by side in one run:
#   1. enabled cost per call of an empty function, 10^1..10^8 calls:
#      native, NOPs (disabled), the iprobe count and trace handlers in each
#      flow: entry (iprobe-cc's default: one NOP per function, the exit through
#      a return trampoline), finstrument (hook calls: entry and exit sites of
#      their own) and llvm (clang-14 + the pass: a patchable entry, as entry),
#      the cheapest compiled-in hook (a plain global ++ in
#      __cyg_profile_func_enter/exit, plain_hooks.c = the floor), the same count
#      handler compiled in (hooks served by libiprobe-rt-hooks.so), XRay
#      patched, bpftrace uprobe
#   2. stop-the-world pause to enable/disable 1k, 10k, 100k probes (8 threads)
#   3. logger throughput, 1 and 2 threads, with drops
#   4. memory: resident cost of attaching (default handler and ring) to 8 and
#      64 threads; and what a timestamp costs (clocks.c)
# usage: bench/hotpatch/run.sh [BUILD_DIR]   (as root; builds what it needs)
# env: MAX_EXP (default 8), PAUSE_SIZES (default "1000 10000 100000"), SKIP_BPF=1,
#      REPEATS (default 3, fastest kept), SECTIONS (default "1 2 3 4"),
#      BASELINE=BUILD_DIR and LOAD=N for section 2 (see there),
#      VARIANTS (section 1: the columns to measure, default all)
#   5. instructions per call (callgrind) of native, NOPs, the plain ++ hook,
#      and of the count handler's path read from the live process (callgrind
#      cannot run a process iprobe attaches to): the NOP's count with the
#      NOP replaced by the site's jmp and the stub's fast path
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-8}
pause_sizes=${PAUSE_SIZES:-"1000 10000 100000"}
sections=" ${SECTIONS:-1 2 3 4 5} "
want() { [[ $sections == *" $1 "* ]]; }
iprobe="$build/bin/iprobe"
work="$build/bench-hotpatch"
mkdir -p "$work"
# a variant not run now shows "-", not an earlier run's result (trace_event.sh shares $work)
rm -f "$work"/result.*
cmake --build "$build" --target iprobe iprobe-hotpatch iprobe-probes iprobe-cc iprobe_rt iprobe_rt_hooks IProbePass >/dev/null

. "$here/targets.sh"  # log, start, finish, ns_at, run_variant

# ---- builds ----
export IPROBE_CC_QUIET=1
gcc -O2 -o "$work/loop_native" "$here/loop.c" -lpthread
# the default flow: entry; every function padded (loop.c's are small leaves,
# which by default would be relocated entries: bench/hotpatch/relocated.sh)
"$build/bin/iprobe-cc" --pad-threshold=0 -O2 -o "$work/loop_iprobe" "$here/loop.c" -lpthread
"$build/bin/iprobe-cc" --flow=finstrument -O2 -o "$work/loop_finstrument" "$here/loop.c" -lpthread
"$build/bin/iprobe-cc" --flow=llvm -O2 -o "$work/loop_llvm" "$here/loop.c" -lpthread
gcc -O2 -finstrument-functions -fno-optimize-sibling-calls -o "$work/loop_floor" "$here/loop.c" \
  -L"$build/lib" -liprobe-rt-hooks -Wl,-rpath,"$build/lib" -lpthread
gcc -O2 -c -o "$work/plain_hooks.o" "$here/plain_hooks.c"
gcc -O2 -finstrument-functions -fno-optimize-sibling-calls -o "$work/loop_plain" "$here/loop.c" \
  "$work/plain_hooks.o" -lpthread
gcc -O2 -o "$work/clocks" "$here/clocks.c"
# the compiled-in handler's probe list: coldpatch a copy (same build-id), run the original
cp "$work/loop_floor" "$work/loop_floor_list"
"$iprobe" coldpatch "$work/loop_floor_list" >/dev/null 2>&1
clang-14 -O2 -fxray-instrument -fxray-instruction-threshold=1 -DWITH_XRAY -o "$work/loop_xray" "$here/loop.c" -lpthread


repeats=${REPEATS:-3}
# The variants to run (VARIANTS: a subset); run_variant (targets.sh) skips the others.
variants=" ${VARIANTS:-native disabled count count_completed trace fi_count fi_trace llvm_count llvm_trace plain floor xray bpftrace} "

if want 1; then
log "1. enabled cost per call (each call = an entry and an exit event where instrumented)"
run_variant native "$work/loop_native"
run_variant disabled "$work/loop_iprobe"
run_variant count "$work/loop_iprobe" --functions empty --handler count
run_variant count_completed "$work/loop_iprobe" --functions empty --handler count --completed
run_variant trace "$work/loop_iprobe" --functions empty --ring-records 8388608
run_variant fi_count "$work/loop_finstrument" --functions empty --handler count
run_variant fi_trace "$work/loop_finstrument" --functions empty --ring-records 8388608
run_variant llvm_count "$work/loop_llvm" --functions empty --handler count
run_variant llvm_trace "$work/loop_llvm" --functions empty --ring-records 8388608
run_variant plain "$work/loop_plain"
run_variant floor "$work/loop_floor" --functions empty --handler count \
  --probes "$work/loop_floor_list.probes" --runtime "$build/lib/libiprobe-rt-hooks.so"
run_variant xray "$work/loop_xray"
if [[ -z ${SKIP_BPF:-} && $variants == *" bpftrace "* ]] && command -v bpftrace >/dev/null; then
  bpf_exp=$((max_exp < 5 ? max_exp : 5))
  bpftrace -e "uprobe:$work/loop_native:empty { @c = count(); }" >"$work/bpftrace.out" 2>&1 &
  bpf=$!
  sleep 4
  start "$work/loop_native" "$bpf_exp"
  finish
  cp "$out" "$work/result.bpftrace"
  kill -INT "$bpf"; wait "$bpf" || true
fi

printf '\n| calls | native | NOPs (disabled) | count | count --completed | trace | finstrument count | finstrument trace | llvm count | llvm trace | plain ++ hook (floor) | iprobe count compiled in | XRay patched | bpftrace uprobe | count / floor | trace ns/event |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  row="| 10^$e"
  for v in native disabled count count_completed trace fi_count fi_trace llvm_count llvm_trace plain floor xray bpftrace; do
    x=$(ns_at "$work/result.$v" "$n" 2>/dev/null || true)
    row+=" | ${x:--}"
  done
  c=$(ns_at "$work/result.count" "$n" 2>/dev/null || true); f=$(ns_at "$work/result.plain" "$n" 2>/dev/null || true)
  t=$(ns_at "$work/result.trace" "$n" 2>/dev/null || true)
  row+=" | $(awk -v c="$c" -v f="$f" 'BEGIN { if (c && f) printf "%.2f", c / f; else printf "-" }')"
  row+=" | $(awk -v t="$t" 'BEGIN { if (t) printf "%.1f", t / 2; else printf "-" }') |"
  echo "$row"
done
echo "(CPU ns per call of empty(), fastest of $repeats runs; instrumented variants fire an entry and an exit event per call;"
echo " count: the entry flow, iprobe-cc's default, entries only (exits untouched); count --completed and trace: the exit too, through a return trampoline; count / floor and trace ns/event are the entry flow's)"
echo "trace ring: 2^23 records per thread (its pages are faulted in at the first event: the 10^1 row carries that one-time cost); events beyond it in the largest runs are dropped (counted), not blocking"

fi

if want 2; then
log "2. stop-the-world pause"
# BASELINE=DIR measures another build's iprobe (e.g. the previous commit's) on
# the same target processes, interleaved; LOAD=N keeps N busy loops running.
tools=("$iprobe")
[[ -n ${BASELINE:-} ]] && tools=("$(cd "$BASELINE" && pwd)/bin/iprobe" "$iprobe")
load_pids=()
for ((l = 0; l < ${LOAD:-0}; l++)); do (while :; do :; done) & load_pids+=($!); done
trap '((${#load_pids[@]})) && kill "${load_pids[@]}" 2>/dev/null' EXIT
printf '\n(load: %s busy loops; %s)\n' "${LOAD:-0}" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '\n| iprobe | probes | functions | threads | enable pause, first (injects runtime) | enable pause | disable pause | of which stopping threads (enable / disable) |\n|---|---|---|---|---|---|---|---|\n'
get() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$2"; }
for probes in $pause_sizes; do
  fns=$((probes / 2))
  src="$work/many_$fns.c"
  [[ -x $work/many_$fns ]] || { python3 "$here/gen_functions.py" "$fns" >"$src";
    "$build/bin/iprobe-cc" -O1 -o "$work/many_$fns" "$src" -lpthread; }
  for tool in "${tools[@]}"; do
    start "$work/many_$fns"
    sleep 0.5
    # Entries and exits: --completed where the count handler takes it (a
    # build before it turned both on without it).
    both=(); "$tool" attach --help 2>/dev/null | grep -q -- --completed && both=(--completed)
    on=$("$tool" attach "$pid" --handler count "${both[@]}" --json)
    off=$("$tool" detach "$pid" --json)
    on2=$("$tool" attach "$pid" --handler count "${both[@]}" --json)
    off2=$("$tool" detach "$pid" --json)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    label=$([[ $tool == "$iprobe" ]] && echo "this build" || echo "baseline")
    echo "| $label | $(get total_enabled "$on") | $fns | 9 | $(get pause_us "$on") us | $(get pause_us "$on2") us | $(get pause_us "$off2") us | $(get stop_us "$on2") / $(get stop_us "$off2") us |"
  done
done
((${#load_pids[@]})) && kill "${load_pids[@]}" 2>/dev/null
load_pids=()
fi

if want 3; then
log "3. logger throughput"
printf '\n| threads | calls per thread | ring (records/thread) | reader | CPU ns per event per thread | events/s per thread (CPU) | events/s, all threads | recorded | dropped |\n|---|---|---|---|---|---|---|---|---|\n'
throughput() {  # threads exponent ring reader(none|trace)
  local threads=$1 exp=$2 ring=$3 reader=$4
  start "$work/loop_iprobe" "$exp" "$threads"
  "$iprobe" attach "$pid" --functions empty --ring-records "$ring" >/dev/null
  local rpid=
  if [[ $reader == trace ]]; then "$iprobe" trace "$pid" --format json >/dev/null 2>"$work/trace.err" & rpid=$!; sleep 0.2; fi
  kill -USR1 "$pid"
  while kill -0 "$pid" 2>/dev/null && ! grep -q '^[0-9]' <(grep -v ready "$out"); do sleep 0.01; done
  local report
  if [[ -n $rpid ]]; then kill -INT "$rpid"; wait "$rpid" || true; fi
  report=$("$iprobe" report "$pid" --json)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local calls ns
  read -r calls ns < <(grep -v ready "$out" | tail -n 1)
  local per_thread=$((calls / threads))
  local dropped recorded
  dropped=$(sed -n 's/.*"trace_dropped":\([0-9]*\).*/\1/p' <<<"$report")
  recorded=$(sed -n 's/.*"name":"empty","calls":\([0-9]*\).*/\1/p' <<<"$report"); recorded=$((${recorded:-0} * 2))
  if [[ $reader == trace ]]; then
    local d; d=$(sed -n 's/.*: \([0-9]*\) events dropped.*/\1/p' "$work/trace.err"); dropped=$((dropped + ${d:-0}))
    recorded="(streamed)"
  fi
  awk -v t="$threads" -v n="$per_thread" -v ns="$ns" -v ring="$ring" -v rd="$reader" -v rec="$recorded" -v dr="$dropped" \
    'BEGIN { printf "| %d | %d | %d | %s | %.2f | %.1fM | %.1fM | %s | %s |\n", t, n, ring, rd, ns / 2, 2e3 / ns, 2e3 * t / ns, rec, dr }'
}
throughput 1 6 4194304 none
throughput 2 6 4194304 none
throughput 1 7 65536 none
throughput 2 7 65536 none
throughput 1 7 65536 trace
throughput 2 7 65536 trace
fi

if want 4; then
log "4. memory"
# kB of a process's /proc status field
status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
printf '\n| threads | calls per thread | RSS without iprobe | RSS attached (default handler and ring) | of which the region (RssShmem) | region per thread | region size (sparse) |\n|---|---|---|---|---|---|---|\n'
for threads in 8 64; do
  declare -A rss=()
  for mode in plain attached; do
    start "$work/loop_iprobe" 6 "$threads"
    [[ $mode == attached ]] && "$iprobe" attach "$pid" --functions empty >/dev/null
    kill -USR1 "$pid"
    while ! grep -q '^[0-9]' <(grep -v ready "$out"); do sleep 0.05; done
    rss[$mode]=$(status_kb "$pid" VmRSS); rss[$mode.shmem]=$(status_kb "$pid" RssShmem)
    [[ $mode == attached ]] && rss[size]=$("$iprobe" status "$pid" --json | sed -n 's/.*"region_bytes":\([0-9]*\).*/\1/p')
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
  awk -v t="$threads" -v a="${rss[plain]}" -v b="${rss[attached]}" -v s="${rss[attached.shmem]}" -v z="${rss[size]}" \
    'BEGIN { printf "| %d | 10^6 | %.1f MiB | %.1f MiB | %.1f MiB | %.2f MiB | %.0f MiB |\n", t, a/1024, b/1024, s/1024, s/1024/t, z/1048576 }'
done
printf '\n'
"$work/clocks"
fi

if want 5; then
log "5. instructions per call"
# Instructions a binary executes for the 10^6 calls of its 10^6 round: the
# total under callgrind with MAX 6 minus with MAX 5 (startup cancels out).
collected() {  # binary max_exp
  start valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2"
  finish
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out"
}
per_call() { local a b; a=$(collected "$1" 5); b=$(collected "$1" 6); awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (b - a) / 1e6 }'; }
native_ir=$(per_call "$work/loop_native")
nops_ir=$(per_call "$work/loop_iprobe")
plain_ir=$(per_call "$work/loop_plain")
start "$work/loop_iprobe" 1
"$iprobe" attach "$pid" --functions empty --handler count >/dev/null
python3 "$here/site_path.py" "$pid" "$work/loop_iprobe" empty "$iprobe" >"$work/site_path.txt"
finish
site_ir=$(head -n 1 "$work/site_path.txt")
count_ir=$(awk -v n="$nops_ir" -v s="$site_ir" 'BEGIN { printf "%.2f", n - 1 + s }')
printf '\n| instructions per call of empty() | native | NOPs (disabled) | count (entry only) | plain ++ hook (floor) | count / floor |\n|---|---|---|---|---|---|\n'
awk -v a="$native_ir" -v b="$nops_ir" -v c="$count_ir" -v d="$plain_ir" 'BEGIN { printf "| | %s | %s | %s | %s | %.2f |\n", a, b, c, d, c / d }'
echo "(callgrind for native, NOPs and the plain hook; count = the NOPs' count with the NOP replaced by the site's path, read from the live process:)"
tail -n +2 "$work/site_path.txt"
fi
