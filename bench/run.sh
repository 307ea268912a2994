#!/usr/bin/env bash
# Runs skim's benchmark programs with 5 repetitions, medians only, JSON into build/bench-results/.
#
#   bench/run.sh [program ...] [-- extra Google Benchmark arguments]
#     program: executors, block_size, density (default: all three)
#   SKIM_BENCH_BUILD=<dir>   where the programs were built (default build/release, scripts/test's)
#   SKIM_BENCH_OUT=<dir>     where the JSON goes (default build/bench-results)
#   SKIM_BENCH_REPS=<n>      repetitions (default 5)
# e.g. bench/run.sh density -- --benchmark_filter=decode --skim_max_n=65536
# Then: python3 bench/plot.py build/bench-results (PNG plots into docs/img/, tables on stdout).
# A full run takes about 10 minutes on the 2-core machine; run it when nobody is compiling.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SKIM_BENCH_BUILD:-$root/build/release}"
out="${SKIM_BENCH_OUT:-$root/build/bench-results}"
reps="${SKIM_BENCH_REPS:-5}"

programs=()
while (($#)) && [[ "$1" != "--" ]]; do
  programs+=("$1")
  shift
done
[[ "${1:-}" == "--" ]] && shift
((${#programs[@]})) || programs=(executors block_size density)

mkdir -p "$out"
for name in "${programs[@]}"; do
  exe="$build/bench/skim_bench_$name"
  if [[ ! -x "$exe" ]]; then
    echo "run.sh: $exe not built (cmake --build --preset release --target skim_bench_$name)" >&2
    exit 1
  fi
  # The conditions of the run go beside its numbers: a loaded machine gives noisy figures.
  {
    echo "program: $name"
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -n) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "command: $exe --benchmark_repetitions=$reps --benchmark_report_aggregates_only=true" \
      "--benchmark_enable_random_interleaving=true $*"
  } > "$out/$name.txt"
  echo "== $name" >&2
  # Random interleaving: the repetitions of all rows run in a random order, so a burst of load on a
  # shared machine hits the peers and the rows they are compared with alike.
  "$exe" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_enable_random_interleaving=true \
    --benchmark_out="$out/$name.json" --benchmark_out_format=json "$@"
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/$name.txt"
done
echo "run.sh: results in $out" >&2
