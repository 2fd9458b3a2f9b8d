#!/usr/bin/env bash
# Probes off with gcc: one NOP per call and nothing else?  Instructions
# executed (valgrind callgrind: exact, independent of load) by builds of two
# real programs from Debian source, side by side:
#   native-gcc         gcc -O2
#   entry              iprobe-cc (default flow; the gcc plugin pads every
#                      function by attribute, IPA-RA kept, but leaves below
#                      its --pad-threshold, relocated entries instead)
#   entry-padall       iprobe-cc --pad-threshold=0 (every function padded)
#   entry-option       iprobe-cc with IPROBE_GCC_PLUGIN=0 (-fpatchable-function-entry=5,0,
#                      which turns gcc's IPA-RA off: the cost before the plugin)
#   native-gcc-noipara gcc -O2 -fno-ipa-ra  \  the lower bound: the NOP's own cost,
#   entry-noipara      iprobe-cc -fno-ipa-ra /  IPA-RA off on both sides
#   native-clang       clang-14 -O2
#   llvm               iprobe-cc --flow=llvm (clang has no IPA-RA)
# "NOPs" is the calls of padded functions (one NOP each), from callgrind's
# per-function call counts of the entry build.
#
#   bench/coldpatch/ipa_ra.sh [--lua-only] [--requests N] [--variants V,V,...]
#
# --variants runs only those builds (native-gcc, the base, always).
#
# lua5.4 runs bench/coldpatch/mixed.lua (scale 1) with its string-hash seed
# and sort pivots fixed (-Dluai_makeseed, -Dl_randomizePivot: lua 5.4 draws
# them from the clock and addresses) and
# address randomisation off (setarch -R: tables keyed by objects hash their
# addresses), so that a build executes the same instructions every run;
# redis-server 7.0 serves
# redis-benchmark -c 50 -P 16 -t set,get,incr,lpush,lpop -n N (default 50000,
# startup included, the same for every build).
set -euo pipefail

redis=1
requests=50000
only=()
while (($#)); do
  case $1 in
    --lua-only) redis=0; shift ;;
    --requests) requests=$2; shift 2 ;;
    --variants) IFS=, read -r -a only <<<"native-gcc,$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${IPROBE_BUILD_DIR:-$root/build}" && pwd)"
cc="$build/bin/iprobe-cc"
[[ -x $cc && -f $build/lib/IProbePass.so && -f $build/lib/iprobe/iprobe_pad.so ]] ||
  { echo "build iprobe first (iprobe-cc, IProbePass, the gcc plugin)" >&2; exit 7; }
work="$build/bench/ipa_ra"
mkdir -p "$work"
variants=(native-gcc entry entry-padall entry-option native-gcc-noipara entry-noipara native-clang llvm)
if ((${#only[@]})); then
  kept=()
  for v in "${variants[@]}"; do [[ " ${only[*]} " == *" $v "* ]] && kept+=("$v"); done
  variants=("${kept[@]}")
fi
declare -A compiler=(
  [native-gcc]="gcc" [entry]="$cc" [entry-padall]="$cc --pad-threshold=0" [entry-option]="env IPROBE_GCC_PLUGIN=0 $cc"
  [native-gcc-noipara]="gcc -fno-ipa-ra" [entry-noipara]="$cc -fno-ipa-ra"
  [native-clang]="clang-14" [llvm]="$cc --flow=llvm")
base_of() {
  case $1 in
    native-gcc-noipara|entry-noipara) echo native-gcc-noipara ;;
    native-clang|llvm) echo native-clang ;;
    *) echo native-gcc ;;
  esac
}
# Calls of the functions the entry build padded: one NOP executed each
# (relocated entries, small leaves left unpadded, have none).
nops_of() {  # callgrind output of the entry build, its binary
  local names
  names=$("$build/bin/iprobe" list "$2" --kind entry --json | grep -o '"relocated_entry":false,"function":"[^"]*"' |
    sort -u | sed 's/.*"function":"//; s/"$//')
  # calls= lines follow cfn= lines in the callgrind file; sum calls into padded functions
  awk -v list="$names" 'BEGIN { n = split(list, f, "\n"); for (i = 1; i <= n; i++) padded[f[i]] = 1 }
    /^c?fn=/ { s = $0; sub(/^c?fn=/, "", s); if (match(s, /^\([0-9]+\)/)) { id = substr(s, 1, RLENGTH); rest = substr(s, RLENGTH + 2); if (rest != "") name[id] = rest; s = name[id] } if ($0 ~ /^cfn=/) callee = s }
    /^calls=/ { split(substr($0, 7), c, " "); if (callee in padded) total += c[1] }
    END { print total + 0 }' "$1"
}
table_header() {
  echo "| build | instructions (callgrind) | vs its base | extra instructions | extra per NOP |"
  echo "|---|---:|---:|---:|---:|"
}
table_row() {  # variant, instructions, base instructions, nops
  awk -v v="$1" -v a="$2" -v b="$3" -v n="$4" 'BEGIN {
    printf "| %s | %d | %.4fx | %+d | %s |\n", v, a, a / b, a - b, (n > 0 && a != b) ? sprintf("%.2f", (a - b) / n) : "-" }'
}

# ------------------------------------------------------------------ lua
src="$("$root/scripts/fetch-source" lua5.4)/src"
script="$root/bench/coldpatch/mixed.lua"
sources=()
for f in "$src"/*.c; do [[ $(basename "$f") == luac.c ]] || sources+=("$f"); done
echo '#define DEB_HOST_MULTIARCH "x86_64-linux-gnu"' >"$work/lua5.4-deb-multiarch.h"
flags=(-O2 -std=gnu99 -DLUA_COMPAT_5_3 -DLUA_USE_LINUX -I"$work" -Wno-unknown-attributes '-Dluai_makeseed(L)=0u'
  '-Dl_randomizePivot()=(~0u)')
for v in "${variants[@]}"; do
  # shellcheck disable=SC2086
  IPROBE_CC_QUIET=1 ${compiler[$v]} "${flags[@]}" "${sources[@]}" -o "$work/lua-$v" -Wl,-E -ldl -lm
done
expected=$("$work/lua-native-gcc" "$script" 1)
declare -A ir
for v in "${variants[@]}"; do
  [[ $("$work/lua-$v" "$script" 1) == "$expected" ]] || { echo "lua-$v prints another result" >&2; exit 1; }
  setarch -R valgrind --tool=callgrind --callgrind-out-file="$work/lua-$v.cg" "$work/lua-$v" "$script" 1 >/dev/null 2>&1
  ir[$v]=$(awk '/^(summary|totals):/ { print $2; exit }' "$work/lua-$v.cg")
done
nops=$(nops_of "$work/lua-entry.cg" "$work/lua-entry")
echo "### lua5.4 (Debian source) running bench/coldpatch/mixed.lua, probes off; $nops calls of padded functions"
echo
table_header
for v in "${variants[@]}"; do table_row "$v" "${ir[$v]}" "${ir[$(base_of "$v")]}" "$nops"; done
rm -f "$work"/lua-*.cg

((redis)) || exit 0
# ---------------------------------------------------------------- redis
declare -A server
for v in "${variants[@]}"; do
  case $v in
    native-gcc) mode=native extra= env= ;;
    entry) mode=entry extra= env= ;;
    entry-padall) mode=entry extra= env=IPROBE_PAD_THRESHOLD=0 ;;
    entry-option) mode=entry extra= env=IPROBE_GCC_PLUGIN=0 ;;
    native-gcc-noipara) mode=native extra=-fno-ipa-ra env= ;;
    entry-noipara) mode=entry extra=-fno-ipa-ra env= ;;
    native-clang) continue ;;
    llvm) mode=llvm extra=-gdwarf-4 env= ;;  # valgrind 3.19 reads DWARF 4
  esac
  # shellcheck disable=SC2086
  server[$v]=$(env $env IPROBE_BUILD_DIR="$build" IPROBE_REDIS_CFLAGS="$extra" "$root/scripts/build-redis" --mode "$mode" \
    "$work/redis-$v")
done
rsrc="$("$root/scripts/fetch-source" redis)"
out="$work/redis-native-clang"
if [[ ! -f $out/.bench-done ]]; then
  rm -rf "$out" && mkdir -p "$out" && cp -a "$rsrc/." "$out/"
  make -C "$out" -j2 CC=clang-14 CFLAGS=-gdwarf-4 MALLOC=libc USE_SYSTEMD=no BUILD_TLS=no >"$out/build.log" 2>&1 ||
    { tail -20 "$out/build.log" >&2; exit 1; }
  touch "$out/.bench-done"
fi
server[native-clang]="$out/src/redis-server"
port=$((20000 + RANDOM % 20000))
declare -A rir
for v in "${variants[@]}"; do
  cg="$work/redis-$v.cg"
  valgrind --tool=callgrind --callgrind-out-file="$cg" "${server[$v]}" --port "$port" --save '' --appendonly no \
    --daemonize no --logfile /dev/null >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 600); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-benchmark -p "$port" -n "$requests" -c 50 -P 16 -t set,get,incr,lpush,lpop -q >/dev/null 2>&1
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$pid"
  wait "$pid" 2>/dev/null || true
  rir[$v]=$(awk '/^(summary|totals):/ { print $2; exit }' "$cg")
done
rnops=$(nops_of "$work/redis-entry.cg" "${server[entry]}")
echo
echo "### redis-server 7.0 (Debian source), redis-benchmark -n $requests -c 50 -P 16 -t set,get,incr,lpush,lpop, probes off; $rnops calls of padded functions"
echo
table_header
for v in "${variants[@]}"; do table_row "$v" "${rir[$v]}" "${rir[$(base_of "$v")]}" "$rnops"; done
rm -f "$work"/redis-*.cg
