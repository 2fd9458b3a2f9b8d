#!/usr/bin/env bash
# Enabled cost per call of a function nobody prepared (issue 28): the same
# loop.c (built with FIVE_BYTE_BODY: empty() holds one 5-byte NOP, so a plain
# gcc build's entry can be relocated), side by side in one run:
#   native          plain gcc, nothing attached
#   entry count/trace   built with iprobe-cc (entry flow: a pad), attached
#   relocated count/trace  the plain gcc build, attached: entry relocated
#   bpftrace        uprobe + uretprobe counting on the plain gcc build
# Each call is an entry and an exit event.  CPU ns per call, fastest of
# REPEATS runs (fresh process each).
# usage: bench/hotpatch/relocated.sh [BUILD_DIR]   (as root)
# env: MAX_EXP (default 7), BPF_EXP (default 5), REPEATS (default 3), SKIP_BPF=1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
here="$root/bench/hotpatch"
max_exp=${MAX_EXP:-7}
bpf_exp=${BPF_EXP:-5}
repeats=${REPEATS:-3}
iprobe="$build/bin/iprobe"
work="$build/bench-relocated"
mkdir -p "$work"
. "$here/targets.sh"  # log, start, finish, ns_at
cmake --build "$build" --target iprobe iprobe-hotpatch iprobe-probes iprobe-cc iprobe_rt >/dev/null

export IPROBE_CC_QUIET=1
gcc -O2 -DFIVE_BYTE_BODY -o "$work/loop_plain" "$here/loop.c" -lpthread
# --pad-threshold=0: empty() is a small leaf, which iprobe-cc would otherwise
# leave unpadded (a relocated entry, as in the plain build)
"$build/bin/iprobe-cc" --pad-threshold=0 -O2 -DFIVE_BYTE_BODY -o "$work/loop_entry" "$here/loop.c" -lpthread
"$iprobe" list "$work/loop_plain" --functions empty --kind entry --json | grep -q '"selected":1' ||
  { log "empty() of the plain build is not probe-able"; exit 1; }


# Variants interleaved round by round, so a change in the machine's load
# touches all of them alike; per size the fastest run is kept.
variants=(native entry_count entry_trace reloc_count reloc_trace)
run_once() {  # variant
  case $1 in
    native) start "$work/loop_plain" "$max_exp" ;;
    entry_count) start "$work/loop_entry" "$max_exp"; "$iprobe" attach "$pid" --functions empty --handler count >/dev/null ;;
    entry_trace) start "$work/loop_entry" "$max_exp"; "$iprobe" attach "$pid" --functions empty --ring-records 8388608 >/dev/null ;;
    reloc_count) start "$work/loop_plain" "$max_exp"; "$iprobe" attach "$pid" --functions empty --handler count >/dev/null ;;
    reloc_trace) start "$work/loop_plain" "$max_exp"; "$iprobe" attach "$pid" --functions empty --ring-records 8388608 >/dev/null ;;
  esac
  finish
  grep -v ready "$out" >>"$work/result.$1.all"
}
for v in "${variants[@]}"; do : >"$work/result.$v.all"; done
for ((r = 0; r < repeats; r++)); do
  for v in "${variants[@]}"; do run_once "$v"; done
done
for v in "${variants[@]}"; do
  awk '!($1 in m) || $2 < m[$1] { m[$1] = $2 } END { for (n in m) print n, m[n] }' "$work/result.$v.all" |
    sort -n >"$work/result.$v"
done
: >"$work/result.bpftrace"
if [[ -z ${SKIP_BPF:-} ]] && command -v bpftrace >/dev/null; then
  bpftrace -e "uprobe:$work/loop_plain:empty { @entries = count(); } uretprobe:$work/loop_plain:empty { @exits = count(); }" \
    >"$work/bpftrace.out" 2>&1 &
  bpf=$!
  sleep 5
  start "$work/loop_plain" "$bpf_exp"
  finish
  grep -v ready "$out" >"$work/result.bpftrace"
  kill -INT "$bpf"; wait "$bpf" || true
fi

printf '\n| calls | native | entry flow count | relocated count | relocated / entry (count) | entry flow trace | relocated trace | relocated / entry (trace) | bpftrace uprobe+uretprobe |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
n=1
for ((e = 1; e <= max_exp; e++)); do
  n=$((n * 10))
  ((e >= 2)) || continue
  get() { ns_at "$work/result.$1" "$n" 2>/dev/null || true; }
  ec=$(get entry_count); rc=$(get reloc_count); et=$(get entry_trace); rt=$(get reloc_trace); b=$(get bpftrace)
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a && b) printf "%.2f", a / b; else printf "-" }'; }
  echo "| 10^$e | $(get native) | $ec | $rc | $(ratio "$rc" "$ec") | $et | $rt | $(ratio "$rt" "$et") | ${b:--} |"
done
echo "(CPU ns per call of empty() with a 5-byte NOP body, fastest of $repeats interleaved runs; attached variants fire an entry and an exit event per call)"
