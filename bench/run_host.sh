#!/usr/bin/env bash
# Measures libte's host overhead on a CPU context and writes bench/host_overhead.json.
# Builds the `release` preset's te_bench_host first if needed. Extra arguments go to the
# benchmark (e.g. --benchmark_filter=Autocast --benchmark_repetitions=5).
# Run it on a quiet machine: other load inflates every number.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir=build/release
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake --preset release
fi
cmake --build --preset release --target te_bench_host

out=bench/host_overhead.json
# Host overhead is a one-thread measurement: keep OpenBLAS from starting threads that compete.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
"$build_dir/bench/te_bench_host" --benchmark_format=json \
  --benchmark_out="$out" --benchmark_out_format=json "$@"
echo "wrote $out" >&2
