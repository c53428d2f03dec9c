// Whether this build's GPU code runs on a device (tensor/cuda.h: kernel_image_problem,
// built_architectures). The CUDA runtime gives a kernel's attributes on a device only when the
// binary holds code for it: a cubin of its architecture (or an older one of the same major
// version) or PTX that the driver compiles for it. Every .cu file of paratrain is compiled with
// the same CMAKE_CUDA_ARCHITECTURES, so one empty kernel stands for them all.
#include <cuda_runtime.h>

#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/cuda_device_guard.h"

#ifndef PARATRAIN_CUDA_ARCHITECTURES
#error "cmake/cuda.cmake defines PARATRAIN_CUDA_ARCHITECTURES (the build's CUDA architectures) for this file"
#endif

namespace paratrain::cuda {
namespace {
__global__ void kernel_image_probe() {}
}  // namespace

std::string built_architectures() { return PARATRAIN_CUDA_ARCHITECTURES; }

std::string kernel_image_problem(int d) {
  DeviceGuard guard(d);
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel_image_probe);
  if (e == cudaSuccess) return "";
  cudaGetLastError();  // not sticky; cleared so that the next call does not report it
  if (e != cudaErrorNoKernelImageForDevice && e != cudaErrorInvalidDeviceFunction &&
      e != cudaErrorUnsupportedPtxVersion && e != cudaErrorInvalidPtx)
    PT_CUDA_CHECK(e);  // an error of another kind: the device itself
  cudaDeviceProp p{};
  PT_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return detail::no_kernel_image_message(d, p.name, p.major, p.minor, built_architectures(),
                                         std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

}  // namespace paratrain::cuda
