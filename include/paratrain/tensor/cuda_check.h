// PT_CUDA_CHECK(call): for the CUDA parts only (it needs <cuda_runtime.h>). Throws
// cuda::CudaError naming the call, the CUDA error's name and text, and the current device,
// when `call` does not return cudaSuccess. PT_CUDA_CHECK_LAUNCH() checks the last kernel
// launch (a bad configuration; errors inside a kernel surface at the next sync).
// Thread-safety: the macros have no state of their own (CUDA errors are per thread).
#pragma once

#include <cuda_runtime.h>

#include "paratrain/tensor/cuda.h"

namespace paratrain::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
}  // namespace paratrain::cuda::detail

#define PT_CUDA_CHECK(call)                                                                       \
  do {                                                                                            \
    cudaError_t pt_cuda_err_ = (call);                                                            \
    if (pt_cuda_err_ != cudaSuccess)                                                              \
      ::paratrain::cuda::detail::throw_cuda_error(pt_cuda_err_, #call, __FILE__, __LINE__);       \
  } while (0)

#define PT_CUDA_CHECK_LAUNCH() PT_CUDA_CHECK(cudaGetLastError())
