// Fused softmax + cross-entropy over the vocabulary on CUDA, f32, bf16 and f16 logits
// (kernels/cuda/layers.h; the contract is kernels/cpu/softmax.h): the size checks and the
// launches, one block of 256 threads per row, of the kernels in crossentropy_kernels.cuh.
// losses, lse and dlosses are f32; half logits are read as f32 and a half dlogits is rounded
// once from the f32 result (detail::Elem: the CPU's rounding and NaN rules).
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda::xent {
using detail::block_max;
using detail::block_sum;
}  // namespace paratrain::kernels::cuda::xent

#include "kernels/cuda/crossentropy_kernels.cuh"

namespace paratrain::kernels::cuda {
namespace {

using detail::Elem;

static_assert(xent::kIgnore == cpu::kIgnoreIndex, "the kernels' ignored target is the CPU's");

bool check(int64_t N, int64_t V, int64_t ld, const char* who) {
  if (N < 0 || V <= 0) PT_THROW(InputError, who, " (cuda): bad size N=", N, " V=", V);
  if (ld < V) PT_THROW(InputError, who, " (cuda): row stride ld=", ld, " is below the row length V=", V);
  if (N > 0x7fffffff) PT_THROW(InputError, who, " (cuda): N=", N, " rows is more than one launch takes (2^31-1)");
  return N > 0;
}

template <DType D>
void forward(float* losses, float* lse, const void* logits, const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  if (!check(N, V, ld, "crossentropy_forward")) return;
  using S = typename Elem<D>::S;
  xent::forward_kernel<Elem<D>><<<static_cast<unsigned>(N), xent::kThreads, 0, detail::stream()>>>(
      losses, lse, static_cast<const S*>(logits), targets, V, ld);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType D>
void backward(void* dlogits, const float* dlosses, const void* logits, const float* lse, const int32_t* targets,
              int64_t N, int64_t V, int64_t ld) {
  if (!check(N, V, ld, "crossentropy_backward")) return;
  using S = typename Elem<D>::S;
  xent::backward_kernel<Elem<D>><<<static_cast<unsigned>(N), xent::kThreads, 0, detail::stream()>>>(
      static_cast<S*>(dlogits), dlosses, static_cast<const S*>(logits), lse, targets, V, ld);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t ld) {
  forward<DType::F32>(losses, lse, logits, targets, N, V, ld);
}
void crossentropy_forward_bf16(float* losses, float* lse, const uint16_t* logits, const int32_t* targets,
                               int64_t N, int64_t V, int64_t ld) {
  forward<DType::BF16>(losses, lse, logits, targets, N, V, ld);
}
void crossentropy_forward_f16(float* losses, float* lse, const uint16_t* logits, const int32_t* targets, int64_t N,
                              int64_t V, int64_t ld) {
  forward<DType::F16>(losses, lse, logits, targets, N, V, ld);
}

void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  backward<DType::F32>(dlogits, dlosses, logits, lse, targets, N, V, ld);
}
void crossentropy_backward_bf16(uint16_t* dlogits, const float* dlosses, const uint16_t* logits,
                                const float* lse, const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  backward<DType::BF16>(dlogits, dlosses, logits, lse, targets, N, V, ld);
}
void crossentropy_backward_f16(uint16_t* dlogits, const float* dlosses, const uint16_t* logits, const float* lse,
                               const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  backward<DType::F16>(dlogits, dlosses, logits, lse, targets, N, V, ld);
}

}  // namespace paratrain::kernels::cuda
