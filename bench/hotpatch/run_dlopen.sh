#!/usr/bin/env bash
# What `iprobe run`'s audit module (runtime/src/run_audit.c) costs a dlopen:
# ns per dlopen+dlclose of a small library (a fresh load each time), side by
# side in one run, ROUNDS rounds interleaved, the median of each:
#   plain       the program alone
#   audit idle  LD_AUDIT=libiprobe-run-audit.so, not watching (no channel)
#   run, exe    iprobe run of the executable's main (no module named: no
#               audit module; the runtime preloaded, one more object in the
#               scope each load's relocations search)
#   run, done   iprobe run --module LIB-LINKED-AT-START: every module there at
#               start, the watch ended (what a run whose modules are all
#               loaded at start pays per later dlopen)
#   run, wait   iprobe run --module libiprobe_never.so: every load asks iprobe
#               and waits for its answer (the wait a pending module costs)
# usage: bench/hotpatch/run_dlopen.sh [BUILD_DIR] [LOADS] [ROUNDS]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
loads=${2:-20000}
rounds=${3:-7}
dl=$build/tests/hotpatch-targets/dlopen
audit=$build/lib/libiprobe-run-audit.so
iprobe=$build/bin/iprobe
for f in "$dl/libiprobe_dl_a.so" "$dl/libiprobe_dl_start.so" "$audit" "$iprobe"; do
  [[ -e $f ]] || { echo "missing $f: build first (scripts/build)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/loop.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int start_work(int);
int main(int argc, char** argv) {
    const long n = atol(argv[2]);
    start_work(1);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        void* h = dlopen(argv[1], RTLD_NOW);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        dlclose(h);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
C
gcc -O2 -o "$work/loop" "$work/loop.c" -L"$dl" -liprobe_dl_start -Wl,-rpath,"$dl" -ldl
lib=$dl/libiprobe_dl_a.so
declare -A results
names=("plain" "audit idle" "run, exe" "run, done" "run, wait")
for ((r = 0; r < rounds; r++)); do
  results["plain"]+="$("$work/loop" "$lib" "$loads") "
  results["audit idle"]+="$(LD_AUDIT=$audit "$work/loop" "$lib" "$loads") "
  results["run, exe"]+="$("$iprobe" run --functions main --handler count --report "$work/r.json" -- "$work/loop" "$lib" "$loads") "
  results["run, done"]+="$("$iprobe" run --module libiprobe_dl_start.so --handler count --report "$work/r.json" -- "$work/loop" "$lib" "$loads") "
  results["run, wait"]+="$("$iprobe" run --module libiprobe_never.so --handler count --report "$work/r.json" -- "$work/loop" "$lib" "$loads" 2>/dev/null || true) "
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
plain=$(echo "${results["plain"]}" | median)
printf '%-12s %10s %8s   %s\n' variant "ns/load" ratio "rounds (ns per dlopen+dlclose)"
for name in "${names[@]}"; do
  m=$(echo "${results[$name]}" | median)
  printf '%-12s %10s %8s   %s\n' "$name" "$m" "$(awk -v a="$m" -v b="$plain" 'BEGIN {printf "%.3f", a / b}')" "${results[$name]}"
done
