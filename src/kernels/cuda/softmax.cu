// Softmax and log-softmax over rows on CUDA, f32 (kernels/cuda/layers.h; the contract is
// kernels/cpu/softmax.h): one block of 256 threads per row, max subtraction, block-wide
// reductions (block_reduce.cuh); the backward kernels accumulate into dinp.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;

constexpr int kThreads = 256;

// The row's max and sum of exp(x - max).
__device__ void row_max_sum(const float* x, int64_t C, float& m, float& s) {
  float v = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) v = fmaxf(v, x[c]);
  m = block_max(v);
  float e = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) e += expf(x[c] - m);
  s = block_sum(e);
}

__global__ void softmax_forward_kernel(float* out, const float* inp, int64_t C) {
  const float* x = inp + static_cast<int64_t>(blockIdx.x) * C;
  float* o = out + static_cast<int64_t>(blockIdx.x) * C;
  float m, s;
  row_max_sum(x, C, m, s);
  const float inv = 1.0f / s;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = expf(x[c] - m) * inv;
}

// dinp += out * (dout - sum_c dout * out)
__global__ void softmax_backward_kernel(float* dinp, const float* dout, const float* out, int64_t C) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C;
  const float *g = dout + base, *y = out + base;
  float* d = dinp + base;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += g[c] * y[c];
  dot = block_sum(dot);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] += y[c] * (g[c] - dot);
}

__global__ void log_softmax_forward_kernel(float* out, const float* inp, int64_t C) {
  const float* x = inp + static_cast<int64_t>(blockIdx.x) * C;
  float* o = out + static_cast<int64_t>(blockIdx.x) * C;
  float m, s;
  row_max_sum(x, C, m, s);
  const float lse = m + logf(s);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = x[c] - lse;
}

// dinp += dout - exp(out) * sum_c dout
__global__ void log_softmax_backward_kernel(float* dinp, const float* dout, const float* out, int64_t C) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C;
  const float *g = dout + base, *y = out + base;
  float* d = dinp + base;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += g[c];
  s = block_sum(s);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] += g[c] - expf(y[c]) * s;
}

// True when there is work; InputError on bad sizes (as the CPU kernels' check).
bool check(int64_t N, int64_t C, const char* who) {
  if (N < 0 || C <= 0) PT_THROW(InputError, who, " (cuda): bad size N=", N, " C=", C);
  if (N > 0x7fffffff) PT_THROW(InputError, who, " (cuda): N=", N, " rows is more than one launch takes (2^31-1)");
  return N > 0;
}

}  // namespace

void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  if (!check(N, C, "softmax_forward")) return;
  softmax_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(out, inp, C);
  PT_CUDA_CHECK_LAUNCH();
}

void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  if (!check(N, C, "softmax_backward")) return;
  softmax_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(dinp, dout, out, C);
  PT_CUDA_CHECK_LAUNCH();
}

void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  if (!check(N, C, "log_softmax_forward")) return;
  log_softmax_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(out, inp, C);
  PT_CUDA_CHECK_LAUNCH();
}

void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  if (!check(N, C, "log_softmax_backward")) return;
  log_softmax_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, detail::stream()>>>(dinp, dout, out,
                                                                                                 C);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace paratrain::kernels::cuda
