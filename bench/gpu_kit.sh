#!/usr/bin/env bash
# gpu_kit.sh: bench/gpu_check.sh on a GPU machine that lacks paratrain's build dependencies
# (oneDNN, sentencepiece, CLI11, nlohmann-json, GoogleTest) and cannot install them, with the
# binaries built on a machine that has them and the CUDA toolkit.
#
#   bash bench/gpu_kit.sh pack [KIT]   here: builds build/gpu-kit for any x86-64 CPU
#                                      (-DPARATRAIN_NATIVE=OFF, the CUDA parts on, MPI off;
#                                      CMAKE_CUDA_ARCHITECTURES from the environment, 90 if
#                                      unset) and writes KIT (default build/gpu-kit.tar.xz):
#                                      paratrain, gpu_kernels_bench, example_custom_loop_ddp
#                                      (a GPU test runs it), tests/test_gpu with its CTest
#                                      files, and the shared libraries they need besides
#                                      glibc, libstdc++ and CUDA's (oneDNN, sentencepiece, ...)
#   bash bench/gpu_kit.sh check [KIT]  here or there: whether KIT was built from the sources
#                                      of this checkout (exit 0), or not (exit 2)
#   bash bench/gpu_kit.sh run [KIT]    there, in a checkout of the same sources (checked:
#                                      the kit holds the SHA-256 of every source file it was
#                                      built from, and `run` refuses a kit of others): unpacks KIT,
#                                      puts the checkout at the path the binaries were built
#                                      for (a symbolic link, if it lives elsewhere), finds the
#                                      CUDA runtime, cuBLAS(Lt) and NCCL (the toolkit's, the
#                                      system's or PyTorch's nvidia-* wheels) and runs
#                                      SKIP_BUILD=1 bench/gpu_check.sh on the kit's build;
#                                      with OUT set (the device tool's folder) it copies the
#                                      run's logs to $OUT/gpu-check.
# gpu_check.sh's variables (STEPS, CTEST_J, CTEST_TIMEOUT, TESTS_BUDGET_S, ...) pass through `run`;
# CHECK_BUDGET_S (seconds) stops gpu_check.sh there, and the logs are still copied.
# Exits 2 on bad usage or a missing piece, else gpu_check.sh's status.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-}
KIT=${2:-$ROOT/build/gpu-kit.tar.xz}
BUILD_REL=build/gpu-kit
die() { echo "gpu_kit.sh: $*" >&2; exit 2; }

# The files a kit is built from (CMake's inputs; no git needed on the GPU machine to check them).
KIT_SOURCES="CMakeLists.txt CMakePresets.json cmake include src tests examples bench"

# Writes the SHA-256 of every source file of this checkout that git tracks or would track.
source_sums() {
  (cd "$ROOT" && git ls-files -co --exclude-standard -- $KIT_SOURCES | sort | xargs -d '\n' sha256sum)
}

# Whether the unpacked kit in $1 was built from this checkout's sources; says which differ.
kit_matches() {
  local sums=$1/kit-sources.sha256 bad
  [ -f "$sums" ] || { echo "gpu_kit.sh: the kit holds no kit-sources.sha256 (pack it again)"; return 1; }
  bad=$(cd "$ROOT" && sha256sum --quiet -c "$sums" 2>&1 | sed -n 's/: FAILED.*//p' | head -5)
  [ -z "$bad" ] && return 0
  echo "gpu_kit.sh: the kit (commit $(cat "$1/kit-commit" 2> /dev/null || echo '?')) was built from other" \
       "sources than this checkout's: $(echo $bad)"
  return 1
}

require_kit() { [ -f "$KIT" ] || die "no kit at $KIT (make one with: bash bench/gpu_kit.sh pack)"; }

pack() {
  local build=$ROOT/$BUILD_REL stage
  cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
    -DPARATRAIN_CUDA=on -DPARATRAIN_NATIVE=OFF -DPARATRAIN_WITH_MPI=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" > "$build.configure.log" 2>&1 ||
    { tail -20 "$build.configure.log"; die "configure failed (the CUDA toolkit and NCCL are needed here)"; }
  cmake --build "$build" -j "$(nproc)" --target paratrain_cli test_gpu gpu_kernels_bench > "$build.build.log" 2>&1 ||
    { tail -30 "$build.build.log"; die "build failed"; }
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/$BUILD_REL/bin" "$stage/$BUILD_REL/tests" "$stage/$BUILD_REL/kit-lib"
  cp "$build/bin/paratrain" "$build/bin/gpu_kernels_bench" "$build/bin/example_custom_loop_ddp" "$stage/$BUILD_REL/bin/"
  cp "$build/tests/test_gpu" "$build/tests/test_gpu[1]_include.cmake" "$build/tests/test_gpu[1]_tests.cmake" \
    "$stage/$BUILD_REL/tests/"
  # CTest files that name the GPU tests only (the build's own list every test executable).
  printf 'subdirs("tests")\n' > "$stage/$BUILD_REL/CTestTestfile.cmake"
  printf 'include("%s/tests/test_gpu[1]_include.cmake")\n' "$build" > "$stage/$BUILD_REL/tests/CTestTestfile.cmake"
  echo "$build" > "$stage/$BUILD_REL/kit-built-at"
  source_sums > "$stage/$BUILD_REL/kit-sources.sha256" || die "cannot list the sources (git ls-files)"
  (cd "$ROOT" && echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- $KIT_SOURCES || echo ' with changes')") \
    > "$stage/$BUILD_REL/kit-commit"
  local lib
  for lib in $(ldd "$build/bin/paratrain" "$build/tests/test_gpu" | awk '/=> \//{print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so*|libm.so*|ld-linux*|libpthread*|libdl.so*|librt.so*|libstdc++*|libgcc_s*) ;;  # the system's
      libcuda*|libcublas*|libnccl*|libnvJitLink*) ;;                                          # the GPU machine's
      *) cp -L "$lib" "$stage/$BUILD_REL/kit-lib/" ;;
    esac
  done
  mkdir -p "$(dirname "$KIT")"
  tar -C "$stage" -cf - "$BUILD_REL" | xz -T0 -6 > "$KIT.tmp" && mv "$KIT.tmp" "$KIT" || die "cannot write $KIT"
  echo "gpu_kit.sh: wrote $KIT ($(du -h "$KIT" | cut -f1)); on the GPU machine: bash bench/gpu_kit.sh run ${KIT#$ROOT/}"
}

run() {
  require_kit
  tar -C "$ROOT" -xJf "$KIT" || die "cannot unpack $KIT"
  kit_matches "$ROOT/$BUILD_REL" || die "pack it again from this checkout: bash bench/gpu_kit.sh pack"
  echo "gpu_kit.sh: the kit of commit $(cat "$ROOT/$BUILD_REL/kit-commit"), built from this checkout's sources"
  local built_at build=$ROOT/$BUILD_REL
  built_at=$(cat "$build/kit-built-at") || die "$KIT holds no kit-built-at"
  if [ "$built_at" != "$build" ]; then  # the binaries' paths (PARATRAIN_BIN, the CTest files) are absolute
    local want_root=${built_at%/$BUILD_REL}
    if [ ! -e "$want_root" ]; then
      mkdir -p "$(dirname "$want_root")" && ln -s "$ROOT" "$want_root" || die "cannot link $want_root to $ROOT"
    elif [ "$(cd "$want_root" && pwd -P)" != "$(cd "$ROOT" && pwd -P)" ]; then
      die "the kit was built for $want_root, which is another folder here: run from a checkout there"
    fi
    build=$built_at
  fi
  # The libraries the binaries cannot find: the kit's, else CUDA's wherever this machine has them.
  local use=$build/kit-use site lib f extra="" pass
  mkdir -p "$use"
  site=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2> /dev/null || true)
  for pass in 1 2 3; do
    export LD_LIBRARY_PATH=$use${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    local missing
    missing=$(ldd "$build/bin/paratrain" "$build/tests/test_gpu" "$build/bin/gpu_kernels_bench" |
              awk '/not found/{print $1}' | sort -u)
    [ -z "$missing" ] && break
    for lib in $missing; do
      if [ -e "$build/kit-lib/$lib" ]; then ln -sf "$build/kit-lib/$lib" "$use/$lib"; continue; fi
      f=$(find /usr/local/cuda*/ /usr/local/nvidia ${site:+"$site/nvidia"} /usr/lib /opt -name "$lib" 2> /dev/null | head -1)
      [ -n "$f" ] && extra=${extra:+$extra:}$(dirname "$f")
    done
  done
  missing=$(ldd "$build/bin/paratrain" | awk '/not found/{print $1}')
  [ -z "$missing" ] || die "libraries not found on this machine: $missing"
  local rc=0
  # CHECK_BUDGET_S (seconds, unset: none) ends the check there, so that the logs below are still
  # copied when the device tool's limit would kill the whole command first.
  SKIP_BUILD=1 ${CHECK_BUDGET_S:+timeout "$CHECK_BUDGET_S"} bash "$ROOT/bench/gpu_check.sh" "$build" || rc=$?
  [ "$rc" -eq 124 ] && echo "gpu_kit.sh: the check was stopped at CHECK_BUDGET_S=$CHECK_BUDGET_S s"
  # Under the device tool, whose reply keeps only the output's tail: every log of the run
  # (the GPU tests', each training run's, the kernel and metrics tables) comes back in $OUT.
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    mkdir -p "$OUT/gpu-check"
    cp "$build"/*.log "$build"/*.jsonl "$OUT/gpu-check/" 2> /dev/null
    echo "gpu_kit.sh: the run's logs are in \$OUT/gpu-check ($(ls "$OUT/gpu-check" | wc -l) files)"
  fi
  return $rc
}

# Unpacks KIT's small files into a temporary folder and compares its sources with this checkout's.
check() {
  require_kit
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  tar -C "$tmp" -xJf "$KIT" "$BUILD_REL/kit-sources.sha256" "$BUILD_REL/kit-commit" 2> /dev/null
  kit_matches "$tmp/$BUILD_REL" || return 2
  echo "gpu_kit.sh: $KIT (commit $(cat "$tmp/$BUILD_REL/kit-commit")) was built from this checkout's sources"
}

case $MODE in
  pack) pack ;;
  check) check ;;
  run) run ;;
  *) die "usage: bash bench/gpu_kit.sh pack|check|run [KIT]" ;;
esac
