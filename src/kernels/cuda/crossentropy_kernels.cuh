// The kernels of the fused softmax + cross-entropy on CUDA (crossentropy.cu), a block per row
// of the logits (rows ld >= V elements apart; elements [V, ld) neither read nor written).
//  - forward_kernel: lse = max + log(sum exp(x - max)) in one read of the row: each thread
//    keeps the max m of what it read and the sum s of exp(x - m), rescaled when m grows (a
//    thread that read nothing, or only -inf, adds 0); the block combines the pairs. loss =
//    lse - x[target], 0 for an ignored target, NaN for one outside [0, V) (made visible
//    instead of thrown: a GPU cannot throw without a wait).
//  - backward_kernel: dlogits = exp(x - lse) * g, minus g at the target (OVERWRITES; 0 rows
//    when ignored, NaN rows for a bad target; g = dlosses[row]). Each element is read before
//    the same thread writes it, so dlogits may be the logits (in place).
// E is the includer's element rules (E::S, E::load widening to f32, E::store rounding once).
//
// This file holds only the kernels, so that they can be compiled on the host over an emulation
// of the CUDA built-ins they use (threadIdx, blockIdx, blockDim, expf, logf) and of the block
// reductions (block_max, block_sum: the includer's, in this namespace), as
// tests/kernels/crossentropy_emulated_test.cpp does, to check them without a GPU.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cuda::xent {
namespace {

constexpr int32_t kIgnore = -1;  // kernels/cpu/softmax.h kIgnoreIndex (crossentropy.cu checks)
constexpr int kThreads = 256;    // a row's block (a multiple of 32, as block_sum needs)

template <typename E>
__global__ void forward_kernel(float* losses, float* lse, const typename E::S* logits, const int32_t* targets,
                               int64_t V, int64_t ld) {
  const int64_t row = blockIdx.x;
  const typename E::S* x = logits + row * ld;
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = E::load(x[c]);
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
      losses[row] = NAN;
    else
      losses[row] = l - E::load(x[t]);
  }
}

template <typename E>
__global__ void backward_kernel(typename E::S* dlogits, const float* dlosses, const typename E::S* logits,
                                const float* lse, const int32_t* targets, int64_t V, int64_t ld) {
  const int64_t row = blockIdx.x;
  const typename E::S* x = logits + row * ld;
  typename E::S* d = dlogits + row * ld;
  const int32_t t = targets[row];
  if (t == kIgnore || t < 0 || t >= V) {
    const typename E::S fill = E::store(t == kIgnore ? 0.0f : NAN);
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) d[c] = fill;
    return;
  }
  const float g = dlosses[row], l = lse[row];
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float p = expf(E::load(x[c]) - l) * g;
    if (c == t) p -= g;
    d[c] = E::store(p);
  }
}

}  // namespace
}  // namespace paratrain::kernels::cuda::xent
