#!/usr/bin/env bash
# How long `iprobe run --args --retval` takes to plan the values of every
# function of a program, against the function count: programs of N
# generated functions (gen_values_functions.py) probed from their symbols
# (plain gcc), in three shapes:
#   debug    all N in one unit built -g (the DWARF describes each)
#   mixed    N built without -g, plus $TYPED (1000) in a unit built -g: node's
#            shape (a static V8: 71 000 functions, DWARF for a few units)
#   nodebug  N without any DWARF
# node itself (every function of /usr/bin/node, a short script) when
# NODE=1, and each command of $EXTRA (';' between them, e.g. a redis-server
# built -g: "redis-server --version").  Per program: `iprobe run` without and with --args --retval, the
# wall time of each (the fastest of $REPEATS); their difference is what the
# values cost before the program starts (planning) and while it runs.
# With a second build directory, the same with its iprobe, side by side
# (e.g. the tree before a change).
# usage: bench/hotpatch/values_scale.sh [BUILD_DIR [OTHER_BUILD_DIR]]   (as root; under the flock(1)
#        lock every benchmark on the machine takes)
# env: SIZES ("2000 8000 32000"; "none": no generated program), TYPED (1000), REPEATS (3),
#      TIMEOUT (600 s a run), NODE (0), EXTRA ("")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-${IPROBE_BUILD_DIR:-$root/build}}" && pwd)"
other="${2:+$(cd "$2" && pwd)}"
here="$root/bench/hotpatch"
work="$build/bench-values-scale"
mkdir -p "$work"
sizes=${SIZES:-"2000 8000 32000"}
typed=${TYPED:-1000}
repeats=${REPEATS:-3}
limit=${TIMEOUT:-600}

# program SHAPE N: builds $work/SHAPE_N once; sets binary
program() {
  local shape=$1 n=$2
  binary="$work/${shape}_$n"
  [[ -x $binary ]] && return
  case $shape in
  debug) python3 "$here/gen_values_functions.py" "$n" f --main >"$binary.c"
    gcc -O2 -g -o "$binary" "$binary.c" ;;
  nodebug) python3 "$here/gen_values_functions.py" "$n" f --main >"$binary.c"
    gcc -O2 -o "$binary" "$binary.c" ;;
  mixed) python3 "$here/gen_values_functions.py" "$n" f --main "t:$typed" >"$binary.c"
    python3 "$here/gen_values_functions.py" "$typed" t >"$binary.typed.c"
    gcc -O2 -c -o "$binary.o" "$binary.c"
    gcc -O2 -g -c -o "$binary.typed.o" "$binary.typed.c"
    gcc -o "$binary" "$binary.o" "$binary.typed.o" ;;
  esac
}

# seconds IPROBE ARGS...: the fastest wall time of $repeats runs of `IPROBE run ARGS`
# (">LIMIT" when one is cut off, "failed(STATUS)" when iprobe fails); the program's output must be as without probes
seconds() {
  local iprobe=$1 best="" t
  shift
  for _ in $(seq 1 "$repeats"); do
    local start end
    start=$(date +%s.%N)
    local status=0
    timeout "$limit" "$iprobe" run "$@" >"$work/out" 2>"$work/err" || status=$?
    if ((status == 124)); then echo ">$limit"; return; fi
    if ((status)); then echo "failed($status)"; return; fi
    end=$(date +%s.%N)
    cmp -s "$work/out" "$work/expected" || { echo "output differs: $*" >&2; diff "$work/expected" "$work/out" >&2 || true; exit 1; }
    t=$(echo "$end - $start" | bc)
    [[ -z $best ]] || (($(echo "$t < $best" | bc))) && best=$t
  done
  printf '%.2f' "$best"
}

builds=("$build")
[[ -n $other ]] && builds+=("$other")
printf '%-8s %7s' shape functions
for b in "${builds[@]}"; do printf ' | %-22s' "$(basename "$(dirname "$b")")/$(basename "$b")"; done
printf '\n%-8s %7s' "" ""
for _ in "${builds[@]}"; do printf ' | %10s %11s' run_s values_s; done
printf '\n'
row() {  # shape count program args...
  local shape=$1 count=$2
  shift 2
  "$@" >"$work/expected"
  printf '%-8s %7s' "$shape" "$count"
  for b in "${builds[@]}"; do
    printf ' | %10s %11s' "$(seconds "$b/bin/iprobe" -- "$@")" "$(seconds "$b/bin/iprobe" --args --retval --buffer 64M -- "$@")"
  done
  printf '\n'
}
[[ $sizes == none ]] && sizes=""
for n in $sizes; do
  for shape in debug mixed nodebug; do
    program "$shape" "$n"
    count=$n
    [[ $shape == mixed ]] && count=$((n + typed))
    row "$shape" "$count" "$binary"
  done
done
if [[ ${NODE:-0} == 1 ]] && command -v node >/dev/null; then
  echo 'let s = 0; for (let i = 0; i < 100000; i++) s += Math.sqrt(i); console.log("sum", Math.round(s));' >"$work/n.js"
  row node "$(nm "$(command -v node)" 2>/dev/null | grep -c ' [tTwW] ')" node "$work/n.js"
fi
# the function symbols' count (.symtab, else .dynsym) beside each
IFS=';' read -r -a extra <<<"${EXTRA:-}"
for command in "${extra[@]}"; do
  read -r -a argv <<<"$command"
  path=$(command -v "${argv[0]}")
  count=$(nm "$path" 2>/dev/null | grep -c ' [tTwW] ' || true)
  ((count)) || count=$(nm -D "$path" | grep -c ' [tTwW] ' || true)
  row "$(basename "$path")" "$count" "${argv[@]}"
done
