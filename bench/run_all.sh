#!/usr/bin/env bash
# `make bench`: every benchmark beside its peer, in one run. Each prints its own table and
# ratios. Benchmarks measure; they never fail on a number (machines here are shared).
#
#   bench/run_all.sh [BUILD_DIR]
set -uo pipefail
BUILD_DIR=${1:-build/release}
HERE=$(cd "$(dirname "$0")" && pwd)
status=0
run() {
  echo
  echo "################ $*"
  "$@" || { echo "(benchmark failed: $*)"; status=1; }
}
run "$BUILD_DIR/bin/gemm_libs_bench" 1
run "$BUILD_DIR/bin/gemm_libs_bench" 2
run "$BUILD_DIR/bin/kernels_bench"
run "$HERE/train_gpt_mini.sh" "$BUILD_DIR" 2
run "$HERE/train_ddp_gpt_mini.sh" "$BUILD_DIR"
run "$HERE/comm_allreduce.sh" "$BUILD_DIR"
exit $status
