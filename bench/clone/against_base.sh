# Sourced by the bench/clone scripts that measure this build against a base
# build (guardian.sh, remote_guardian.sh, container_guardian.sh).
#   json_field JSON KEY        a field of the command's --json output
#   against_base RUNS COLUMN...
#       runs `clone_once BUILD` (the script's: BUILD is base or this; it
#       prints one line of µs, a number per COLUMN) RUNS times for each build,
#       alternating, into $work/BUILD; then prints each build's medians in ms
#       under the COLUMN headers, and this build's over the base's.
json_field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | cut -d: -f2 | tr -d '"'; }

median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.1f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

against_base() {
  local runs=$1 b i
  shift
  : >"$work/base"
  : >"$work/this"
  for _ in $(seq "$runs"); do
    clone_once base >>"$work/base"
    clone_once this >>"$work/this"
  done
  local -A at
  printf '%-10s' build
  for i in "$@"; do printf ' %16s' "$i (ms)"; done
  printf '\n'
  for b in base this; do
    printf '%-10s' "$b"
    for ((i = 1; i <= $#; i++)); do
      at[$b,$i]=$(awk -v i="$i" '{ print $i }' "$work/$b" | median)
      printf ' %16.2f' "$(bc -l <<<"${at[$b,$i]} / 1000")"
    done
    printf '\n'
  done
  printf '%-10s' this/base
  for ((i = 1; i <= $#; i++)); do printf ' %16.3f' "$(bc -l <<<"${at[this,$i]} / ${at[base,$i]}")"; done
  printf '\n(%s clones each, alternating; medians)\n' "$runs"
}
