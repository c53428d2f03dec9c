#!/usr/bin/env bash
# Runs the whole test suite of a build directory with CTest. Every test carries a timeout.
set -euo pipefail
BUILD_DIR=${1:-build/release}
cd "$BUILD_DIR"
# Two cores: multi-process tests spawn their own ranks, so run tests two at a time at most.
ctest --output-on-failure --timeout 600 -j 2
