#!/usr/bin/env bash
# Values (issue 29), side by side in one run: the cost per call of
# recording two integer arguments and the return value of
# `long add2(long, long)` (values_loop.c), 10^1..10^MAX_EXP calls:
#   trace           iprobe attach --functions add2 (the trace handler: entry and exit events)
#   values          iprobe attach --functions add2 --args --retval (the same, plus a values
#                   record after each: rdi, rsi at entry; rax, rdx, xmm0, xmm1 at exit)
#   bpftrace        uprobe + uretprobe printing arg0, arg1 and retval (up to 10^5 calls)
#   uftrace         uftrace record -A add2@arg1,arg2 -R add2@retval on a -pg build (up to 10^6)
#   fin_trace, fin_values  the same two in the -finstrument-functions flow (iprobe-cc
#                   --flow=finstrument): the arguments from the site's recipe (registers
#                   after the prologue), the return through a hook of the return slot
#   fin_inl_trace, fin_inl_values  add2 inlined into the loop (-DINLINED_COPY), the same flow:
#                   trace, and --args (the copy's arguments from its DW_TAG_inlined_subroutine;
#                   an inlined copy has no return value); fin_inl_count (the count handler) and
#                   fin_inl_when (--when 'a == -1', which never holds: decided at the copy's entry,
#                   its exit decided by the verdict the entry kept in the frame)
# usage: bench/hotpatch/values.sh [BUILD_DIR]   (as root; alone on the machine, or under the flock(1) lock every benchmark there takes)
# env: MAX_EXP (default 6), REPEATS (default 3, fastest kept), SKIP_BPF=1, SKIP_UFTRACE=1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-6}
repeats=${REPEATS:-3}
iprobe="$build/bin/iprobe"
work="$build/bench-values"
mkdir -p "$work"
cmake --build "$build" --target iprobe iprobe-hotpatch iprobe-cc iprobe_rt >/dev/null
. "$here/targets.sh"  # log, start, finish, ns_at, run_variant

export IPROBE_CC_QUIET=1
"$build/bin/iprobe-cc" --flow=entry -O2 -g -o "$work/values_loop" "$here/values_loop.c"
"$build/bin/iprobe-cc" --flow=finstrument -O2 -g -o "$work/values_loop_fin" "$here/values_loop.c"
"$build/bin/iprobe-cc" --flow=finstrument -O2 -g -DINLINED_COPY -o "$work/values_loop_fin_inl" "$here/values_loop.c"
gcc -O2 -g -o "$work/values_loop_native" "$here/values_loop.c"
gcc -O2 -g -pg -o "$work/values_loop_pg" "$here/values_loop.c"

# 2^23 records per thread (256 MiB): a values call is 4 records, so 10^6 calls fit.
ring=(--ring-records 8388608)

# Interleaved, so both see the same machine.
: >"$work/result.trace.all"; : >"$work/result.values.all"
run_variant native "$work/values_loop_native"
run_variant trace "$work/values_loop" --functions add2 "${ring[@]}"
run_variant values "$work/values_loop" --functions add2 --args --retval "${ring[@]}"
run_variant trace2 "$work/values_loop" --functions add2 "${ring[@]}"
run_variant fin_trace "$work/values_loop_fin" --functions add2 "${ring[@]}"
run_variant fin_values "$work/values_loop_fin" --functions add2 --args --retval "${ring[@]}"
run_variant fin_trace2 "$work/values_loop_fin" --functions add2 "${ring[@]}"
# attached with values, then again without: the exit hook stays a checked exit
first_attach="--functions add2 --args --retval ${ring[*]}" run_variant fin_checked "$work/values_loop_fin" --functions add2 "${ring[@]}"
run_variant fin_inl_trace "$work/values_loop_fin_inl" --functions add2 "${ring[@]}"
run_variant fin_inl_values "$work/values_loop_fin_inl" --functions add2 --args "${ring[@]}"
run_variant fin_inl_trace2 "$work/values_loop_fin_inl" --functions add2 "${ring[@]}"
run_variant fin_inl_count "$work/values_loop_fin_inl" --functions add2 --handler count
run_variant fin_inl_when "$work/values_loop_fin_inl" --functions add2 --when 'a == -1' "${ring[@]}"

if [[ -z ${SKIP_BPF:-} ]] && command -v bpftrace >/dev/null; then
  bpf_exp=$((max_exp < 5 ? max_exp : 5))
  bpftrace -e "uprobe:$work/values_loop_native:add2 { printf(\"%d %d\\n\", arg0, arg1); }
               uretprobe:$work/values_loop_native:add2 { printf(\"%d\\n\", retval); }" >"$work/bpftrace.out" 2>&1 &
  bpf=$!
  sleep 5
  start "$work/values_loop_native" "$bpf_exp"
  finish
  grep -v ready "$out" >"$work/result.bpftrace"
  kill -INT "$bpf"; wait "$bpf" || true
fi
if [[ -z ${SKIP_UFTRACE:-} ]] && command -v uftrace >/dev/null; then
  uf_exp=$((max_exp < 6 ? max_exp : 6))
  rm -rf "$work/uftrace.data"
  out="$work/out.uftrace"
  uftrace record -d "$work/uftrace.data" -A add2@arg1,arg2 -R add2@retval "$work/values_loop_pg" "$uf_exp" >"$out" 2>&1 &
  upid=$!
  for _ in $(seq 1 500); do grep -q ready "$out" 2>/dev/null && break; sleep 0.01; done
  kill -USR1 "$(pgrep -P "$upid" -f values_loop_pg || pgrep -f "^$work/values_loop_pg")"
  wait "$upid" || true
  grep -E '^[0-9]+ [0-9.]+$' "$out" >"$work/result.uftrace" || true
fi

# faster RESULT1 RESULT2 N: the lower ns per call of two runs at N calls
faster() { awk -v a="$(ns_at "$1" "$3")" -v b="$(ns_at "$2" "$3")" 'BEGIN { print (a < b ? a : b) }'; }
ratio() { awk -v v="$1" -v t="$2" 'BEGIN { printf "%.2f", v / t }'; }

# versus_trace HEADER PREFIX: a table of PREFIX_values against the faster of PREFIX_trace and PREFIX_trace2
versus_trace() {
  printf '\n| calls | %s |\n|---|---|---|---|\n' "$1"
  local n=1 t v
  for ((e = 1; e <= max_exp; e++)); do
    n=$((n * 10))
    t=$(faster "$work/result.$2_trace" "$work/result.$2_trace2" "$n")
    v=$(ns_at "$work/result.$2_values" "$n")
    echo "| 10^$e | $t | $v | $(ratio "$v" "$t") |"
  done
}

printf '\n| calls | native | iprobe trace | iprobe --args --retval | values / trace | bpftrace uprobe+uretprobe | uftrace -A -R |\n'
printf '|---|---|---|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  t=$(faster "$work/result.trace" "$work/result.trace2" "$n")
  v=$(ns_at "$work/result.values" "$n")
  row="| 10^$e | $(ns_at "$work/result.native" "$n") | $t | $v | $(ratio "$v" "$t")"
  for x in bpftrace uftrace; do
    y=$(ns_at "$work/result.$x" "$n" 2>/dev/null || true)
    row+=" | ${y:--}"
  done
  echo "$row |"
done
echo "(CPU ns per call of add2() in the calling thread, fastest of $repeats runs; iprobe: the entry flow, exit through a return trampoline;"
echo " trace = fastest of two runs placed before and after the values runs; bpftrace/uftrace: one run, the CPU the traced thread spends,"
echo " not counting bpftrace's or uftrace's own processes)"

printf '\n| calls | finstrument: iprobe trace | finstrument: iprobe --args --retval | values / trace | trace after values | / trace |\n'
printf '|---|---|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  t=$(faster "$work/result.fin_trace" "$work/result.fin_trace2" "$n")
  v=$(ns_at "$work/result.fin_values" "$n")
  c=$(ns_at "$work/result.fin_checked" "$n")
  echo "| 10^$e | $t | $v | $(ratio "$v" "$t") | $c | $(ratio "$c" "$t") |"
done
echo "(the -finstrument-functions flow: the hooks' calls after the prologue; trace = an entry and an exit hook's"
echo " call each; values = the entry's call to the recipe's entry point, a hooked return, the exit hook's call to"
echo " a checked exit, which leaves the exit to the hooked return; trace after values = attached with"
echo " --args --retval, then again without: the exit hook stays a checked exit, which records the exit)"

versus_trace "finstrument, inlined copy: iprobe trace | inlined copy: iprobe --args | args / trace" fin_inl
echo "(add2 inlined into the loop, its hooks there: trace = the copy's entry and exit hook's calls; --args = the"
echo " entry's call to the recipe's entry point (a from a register, b the constant 7), no return to hook)"

printf '\n| calls | inlined copy: count handler | inlined copy: --when a == -1 (never holds) | when / count |\n|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  c=$(ns_at "$work/result.fin_inl_count" "$n")
  w=$(ns_at "$work/result.fin_inl_when" "$n")
  echo "| 10^$e | $c | $w | $(ratio "$w" "$c") |"
done
