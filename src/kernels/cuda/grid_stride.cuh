// The grid-stride loop of the CUDA kernels that compile on the host too (the *_kernels.cuh
// headers; launch.h's launch_each is the nvcc-only form of the same loop):
//   for (int64_t i = grid_first(); i < n; i += grid_step()) ...
// covers [0, n) once over the whole grid, with int64 indices. Device code; needs only
// threadIdx, blockIdx, blockDim and gridDim, which an emulation may provide.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cuda::detail {

__device__ inline int64_t grid_first() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace paratrain::kernels::cuda::detail
