#!/usr/bin/env bash
# `make bench`: every benchmark beside its peer, in one run. Each prints its own table and
# ratios and records its headline figures (bench/bench_results.py); the run ends with one
# summary table (each benchmark, our figure, the peer's, the ratio, the floor from its issue,
# pass/fail) written also as JSON to bench/results/latest.json (bench/summary.py).
# Benchmarks measure; they never fail on a number (machines here are shared).
#
#   bench/run_all.sh [BUILD_DIR]
set -uo pipefail
BUILD_DIR=${1:-build/release}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH_RESULTS_DIR=$(mktemp -d)
export BENCH_RESULTS_DIR
trap 'rm -rf "$BENCH_RESULTS_DIR"' EXIT
status=0
failed=()
run() {
  echo
  echo "################ $*"
  "$@" || { echo "(benchmark failed: $*)"; status=1; failed+=("$(basename "$1")"); }
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), flags:$(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_bf16)$' | tr '\n' ' ')"
run "$BUILD_DIR/bin/paratrain" bench compute --threads "$(nproc)"
run "$BUILD_DIR/bin/gemm_libs_bench" 1
run "$BUILD_DIR/bin/gemm_libs_bench" 2
run "$BUILD_DIR/bin/kernels_bench"
run "$BUILD_DIR/bin/split_backward_bench" 1
run "$HERE/train_gpt_mini.sh" "$BUILD_DIR" 2
run "$HERE/train_gpt_mini_precision.sh" "$BUILD_DIR" 2
run "$HERE/train_ddp_gpt_mini.sh" "$BUILD_DIR"
run "$HERE/train_tp_gpt_mini.sh" "$BUILD_DIR"
run "$HERE/train_zero_gpt_mini.sh" "$BUILD_DIR"
run "$HERE/train_pp_gpt_mini.sh" "$BUILD_DIR"
run "$HERE/comm_allreduce.sh" "$BUILD_DIR"
run "$HERE/telemetry_overhead.sh" "$BUILD_DIR"
/usr/bin/python3 "$HERE/summary.py" "$BENCH_RESULTS_DIR" "$HERE/results/latest.json" "${failed[@]}"
exit $status
