// Fused softmax + cross-entropy over the vocabulary on CUDA, f32 and bf16 logits
// (kernels/cuda/layers.h; the contract is kernels/cpu/softmax.h). One block of 256 threads
// per row; rows ld >= V elements apart (elements [V, ld) untouched). losses, lse and dlosses
// are f32; bf16 logits are read as f32 and a bf16 dlogits is rounded once from the f32 result.
//
// forward:  lse = max + log(sum exp(x - max)); loss = lse - x[target] (0 when ignored). One
//           read of the row: each thread's running max and rescaled sum, combined per block.
// backward: dlogits = (exp(x - lse) * g) - g at the target (OVERWRITES; 0 rows when
//           ignored; g = dlosses[row]). Each element is read before the same thread writes
//           it, so dlogits may be the logits (in place).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/layer_io.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;
constexpr int32_t kIgnore = cpu::kIgnoreIndex;

template <typename T>
__global__ void crossentropy_forward_kernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                            int64_t V, int64_t ld) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  // One pass over the row (online softmax): each thread keeps the max m of what it read and
  // the sum s of exp(x - m), rescaled when m grows; the block then combines the pairs.
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = to_f32(x[c]);
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
      losses[row] = l - to_f32(x[t]);
  }
}

template <typename T>
__global__ void crossentropy_backward_kernel(T* dlogits, const float* dlosses, const T* logits, const float* lse,
                                             const int32_t* targets, int64_t V, int64_t ld) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  T* d = dlogits + row * ld;
  const int32_t t = targets[row];
  if (t == kIgnore || t < 0 || t >= V) {
    const T fill = from_f32<T>(t == kIgnore ? 0.0f : NAN);
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) d[c] = fill;
    return;
  }
  const float g = dlosses[row], l = lse[row];
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float p = expf(to_f32(x[c]) - l) * g;
    if (c == t) p -= g;
    d[c] = from_f32<T>(p);
  }
}

bool check(int64_t N, int64_t V, int64_t ld, const char* who) {
  if (N < 0 || V <= 0) PT_THROW(InputError, who, " (cuda): bad size N=", N, " V=", V);
  if (ld < V) PT_THROW(InputError, who, " (cuda): row stride ld=", ld, " is below the row length V=", V);
  if (N > 0x7fffffff) PT_THROW(InputError, who, " (cuda): N=", N, " rows is more than one launch takes (2^31-1)");
  return N > 0;
}

template <typename T>
void forward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  if (!check(N, V, ld, "crossentropy_forward")) return;
  crossentropy_forward_kernel<T>
      <<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(losses, lse, logits, targets, V, ld);
  PT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward(T* dlogits, const float* dlosses, const T* logits, const float* lse, const int32_t* targets,
              int64_t N, int64_t V, int64_t ld) {
  if (!check(N, V, ld, "crossentropy_backward")) return;
  crossentropy_backward_kernel<T>
      <<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(dlogits, dlosses, logits, lse, targets, V, ld);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t ld) {
  forward(losses, lse, logits, targets, N, V, ld);
}

void crossentropy_forward_bf16(float* losses, float* lse, const uint16_t* logits, const int32_t* targets,
                               int64_t N, int64_t V, int64_t ld) {
  forward(losses, lse, reinterpret_cast<const __nv_bfloat16*>(logits), targets, N, V, ld);
}

void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  backward(dlogits, dlosses, logits, lse, targets, N, V, ld);
}

void crossentropy_backward_bf16(uint16_t* dlogits, const float* dlosses, const uint16_t* logits,
                                const float* lse, const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  backward(reinterpret_cast<__nv_bfloat16*>(dlogits), dlosses, reinterpret_cast<const __nv_bfloat16*>(logits),
           lse, targets, N, V, ld);
}

}  // namespace paratrain::kernels::cuda
