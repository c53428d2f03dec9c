// Fused softmax + cross-entropy over the vocabulary on CUDA, f32, bf16 and f16 logits
// (kernels/cuda/layers.h; the contract is kernels/cpu/softmax.h). One block of 256 threads
// per row; rows ld >= V elements apart (elements [V, ld) untouched). losses, lse and dlosses
// are f32; half logits are read as f32 and a half dlogits is rounded once from the f32 result
// (detail::Elem: the CPU's rounding and NaN rules).
//
// forward:  lse = max + log(sum exp(x - max)); loss = lse - x[target] (0 when ignored). One
//           read of the row: each thread's running max and rescaled sum, combined per block.
// backward: dlogits = (exp(x - lse) * g) - g at the target (OVERWRITES; 0 rows when
//           ignored; g = dlosses[row]). Each element is read before the same thread writes
//           it, so dlogits may be the logits (in place).
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::Elem;

constexpr int kThreads = 256;
constexpr int32_t kIgnore = cpu::kIgnoreIndex;

template <DType D, typename S = typename Elem<D>::S>
__global__ void crossentropy_forward_kernel(float* losses, float* lse, const S* logits, const int32_t* targets,
                                            int64_t V, int64_t ld) {
  const int64_t row = blockIdx.x;
  const S* x = logits + row * ld;
  // One pass over the row (online softmax): each thread keeps the max m of what it read and
  // the sum s of exp(x - m), rescaled when m grows; the block then combines the pairs.
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = Elem<D>::load(x[c]);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // expf(-inf) = 0 on the first element
      m = v;
    } else if (v != -INFINITY) {  // a -inf adds 0 (and would make -inf - -inf NaN); NaN still adds NaN
      s += expf(v - m);
    }
  }
  const float row_max = block_max(m);
  const float sum = block_sum(m == -INFINITY ? 0.0f : s * expf(m - row_max));
  if (threadIdx.x == 0) {
    const float l = row_max + logf(sum);
    if (lse) lse[row] = l;
    const int32_t t = targets[row];
    if (t == kIgnore)
      losses[row] = 0.0f;
    else if (t < 0 || t >= V)
      losses[row] = NAN;  // a bad target: made visible instead of thrown (layers.h)
    else
      losses[row] = l - Elem<D>::load(x[t]);
  }
}

template <DType D, typename S = typename Elem<D>::S>
__global__ void crossentropy_backward_kernel(S* dlogits, const float* dlosses, const S* logits, const float* lse,
                                             const int32_t* targets, int64_t V, int64_t ld) {
  const int64_t row = blockIdx.x;
  const S* x = logits + row * ld;
  S* d = dlogits + row * ld;
  const int32_t t = targets[row];
  if (t == kIgnore || t < 0 || t >= V) {
    const S fill = Elem<D>::store(t == kIgnore ? 0.0f : NAN);
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) d[c] = fill;
    return;
  }
  const float g = dlosses[row], l = lse[row];
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float p = expf(Elem<D>::load(x[c]) - l) * g;
    if (c == t) p -= g;
    d[c] = Elem<D>::store(p);
  }
}

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
  crossentropy_forward_kernel<D><<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(
      losses, lse, static_cast<const S*>(logits), targets, V, ld);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType D>
void backward(void* dlogits, const float* dlosses, const void* logits, const float* lse, const int32_t* targets,
              int64_t N, int64_t V, int64_t ld) {
  if (!check(N, V, ld, "crossentropy_backward")) return;
  using S = typename Elem<D>::S;
  crossentropy_backward_kernel<D><<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(
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
