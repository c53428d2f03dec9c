// cuda::DeviceGuard: makes GPU `d` the calling thread's current device for a scope and
// restores the previous one on exit. For the CUDA parts only (it needs <cuda_runtime.h>).
// Thread-safety: CUDA's current device is per thread, so a guard affects its thread only.
#pragma once

#include "paratrain/tensor/cuda_check.h"

namespace paratrain::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int d) {
    PT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (d != prev_) PT_CUDA_CHECK(cudaSetDevice(d));
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace paratrain::cuda
