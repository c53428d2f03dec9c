// The flash backward's first kernel, launched (flash_attention.cu, flash_attention_f32.cu: both
// kernel sets start their backward with it; the kernel: flash_kernel_common.cuh). CUDA code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/flash_kernel_common.cuh"
#include "kernels/cuda/launch.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda::detail {

// The flash backward's D = rowsum(dO * O) of (B,T,C) dout and out (the elements' rules E:
// detail::Elem<dtype>), B*NH*T f32 from the device's caching allocator, computed on the current
// stream (stream-ordered: the tensor may be dropped once the kernels that read it are queued).
template <int HS, typename E>
Tensor flash_rowdot(const typename E::S* dout, const typename E::S* out, int64_t B, int64_t T, int64_t C,
                    int64_t NH) {
  namespace k = flash_common;
  Tensor D = Tensor::empty({B * NH * T}, DType::F32, Device::CUDA, ::paratrain::cuda::current_device());
  k::rowdot_kernel<HS, E><<<ceil_div(B * NH * T, k::kRowdotRows), 32 * k::kRowdotRows, 0, stream()>>>(
      static_cast<float*>(D.data_ptr()), dout, out, B, T, C, static_cast<int>(NH));
  PT_CUDA_CHECK_LAUNCH();
  return D;
}

}  // namespace paratrain::kernels::cuda::detail
