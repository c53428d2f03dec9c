// The grid-stride loop of the CUDA kernels, in a header that compiles on the host too (the
// *_kernels.cuh headers and their emulated tests use it; launch.h's launch_each and
// launch_over launch it):
//   for (int64_t i = grid_first(); i < n; i += grid_step()) ...
// covers [0, n) once over the whole grid, with int64 indices, on grid_for(n) blocks of
// kThreads threads. grid_first and grid_step are device code and need only threadIdx,
// blockIdx, blockDim and gridDim, which an emulation may provide.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cuda::detail {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

// Blocks for a grid-stride loop over n elements (n >= 1).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ inline int64_t grid_first() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace paratrain::kernels::cuda::detail
