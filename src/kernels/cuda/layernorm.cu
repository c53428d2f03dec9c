// LayerNorm on CUDA, f32 (kernels/cuda/layers.h; the contract is kernels/cpu/layernorm.h): the
// size checks and the launches of the kernels in layernorm_kernels.cuh. Forward and the dinp
// part of the backward: one warp per row. dweight/dbias: blocks of 32 columns x a chunk of at
// least 256 rows, each chunk's sums into a scratch row of partial sums (caching allocator),
// then a second kernel adds the chunks to the gradients in chunk order (+=): no atomics, the
// same bits every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda::ln {
using detail::warp_sum;
}  // namespace paratrain::kernels::cuda::ln

#include "kernels/cuda/layernorm_kernels.cuh"

namespace paratrain::kernels::cuda {
namespace {

unsigned row_blocks(int64_t N) { return detail::ceil_div(N, ln::kRowsPerBlock); }

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
  if (N < 0 || C <= 0) PT_THROW(InputError, "layernorm_forward (cuda): bad size N=", N, " C=", C);
  if (N == 0) return;
  ln::layernorm_forward_kernel<<<row_blocks(N), ln::kThreads, 0, detail::stream()>>>(out, mean, rstd, inp, weight,
                                                                                     bias, N, C, eps);
  PT_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (N < 0 || C <= 0) PT_THROW(InputError, "layernorm_backward (cuda): bad size N=", N, " C=", C);
  if (N == 0) return;
  if (dinp) {
    ln::layernorm_backward_dinp_kernel<<<row_blocks(N), ln::kThreads, 0, detail::stream()>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    PT_CUDA_CHECK_LAUNCH();
  }
  if (dweight || dbias) {
    // Chunks of at least 256 rows, and at most 65535 of them (the grid's y limit).
    const int64_t rows_per_chunk = std::max<int64_t>(256, (N + 65534) / 65535);
    const int64_t chunks = detail::ceil_div(N, rows_per_chunk);
    const dim3 grid(detail::ceil_div(C, 32), static_cast<unsigned>(chunks));
    Tensor partial = Tensor::empty({chunks * 2 * C}, DType::F32,
                                   DeviceSpec{Device::CUDA, ::paratrain::cuda::current_device()});
    auto* part = static_cast<float*>(partial.data_ptr());
    ln::layernorm_backward_params_kernel<<<grid, dim3(32, 8), 0, detail::stream()>>>(part, dout, inp, mean, rstd, N,
                                                                                    C, rows_per_chunk);
    PT_CUDA_CHECK_LAUNCH();
    ln::add_chunks_in_order<<<detail::ceil_div(C, 256), 256, 0, detail::stream()>>>(dweight, dbias, part, chunks, C);
    PT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace paratrain::kernels::cuda
