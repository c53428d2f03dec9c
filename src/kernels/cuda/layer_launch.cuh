// Launch helpers of the CUDA layer kernels: the stream they run on (the current device's
// compute stream, paratrain/tensor/cuda.h) and grid arithmetic. Host code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "paratrain/tensor/cuda.h"

namespace paratrain::kernels::cuda::detail {

inline cudaStream_t layer_stream() { return static_cast<cudaStream_t>(paratrain::cuda::compute_stream()); }

inline unsigned ceil_div(int64_t n, int64_t d) { return static_cast<unsigned>((n + d - 1) / d); }

}  // namespace paratrain::kernels::cuda::detail
