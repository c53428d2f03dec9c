// The vocabulary-shard cross-entropy passes on CUDA (kernels/cpu/vocab_shard_ce.h is the
// contract), logits in f32, bf16 or f16 (Elem<T>: read as f32, a half gradient rounded once).
// One block of 256 threads per row for the row passes; the loss pass is elementwise.
// Differences from the CPU kernels, forced by running asynchronously: a target outside
// [0, vocab_size) that is not kIgnoreIndex cannot throw, so its loss is NaN (the step's
// non-finite check sees it), as the fused cross-entropy's (kernels/cuda/layers.h). The row sums
// add in another order than the CPU's vectorised loop, so the last bits may differ.
// Every pointer is a device pointer of the current device; each call only enqueues on its
// compute stream. register_reduce_into.cpp puts them in the dispatch tables.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/vocab_shard_ce.h"
#include "paratrain/kernels/cpu/softmax.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::Elem;
constexpr int kRowThreads = 256;
constexpr int32_t kIgnore = cpu::kIgnoreIndex;

template <DType T>
__global__ void row_max_kernel(float* mx, const typename Elem<T>::S* logits, const int32_t* targets, int64_t Vl,
                               int64_t valid) {
  const int64_t row = blockIdx.x;
  if (targets[row] == kIgnore) {  // the whole block returns together
    if (threadIdx.x == 0) mx[row] = -INFINITY;
    return;
  }
  const auto* x = logits + row * Vl;
  float v = -INFINITY;
  for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) v = fmaxf(v, Elem<T>::load(x[c]));
  const float m = block_max(v);
  if (threadIdx.x == 0) mx[row] = m;
}

template <DType T>
__global__ void exp_sums_kernel(float* sums, const typename Elem<T>::S* logits, const float* mx,
                                const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start) {
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  if (t == kIgnore) {
    if (threadIdx.x == 0) sums[row] = sums[N + row] = 0.0f;
    return;
  }
  const auto* x = logits + row * Vl;
  const float m = mx[row];
  float e = 0.0f;
  for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) e += expf(Elem<T>::load(x[c]) - m);
  const float s = block_sum(e);
  if (threadIdx.x == 0) {
    const int64_t local = static_cast<int64_t>(t) - vocab_start;
    sums[row] = s;
    sums[N + row] = local >= 0 && local < valid ? Elem<T>::load(x[local]) : 0.0f;
  }
}

template <DType T>
__global__ void backward_kernel(typename Elem<T>::S* dlogits, const typename Elem<T>::S* logits, const float* lse,
                                const float* scale, const int32_t* targets, int64_t Vl, int64_t valid,
                                int64_t vocab_start) {
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  auto* d = dlogits + row * Vl;
  if (t == kIgnore) {
    for (int64_t c = threadIdx.x; c < Vl; c += blockDim.x) d[c] = Elem<T>::store(0.0f);
    return;
  }
  const auto* x = logits + row * Vl;
  const float g = *scale, l = lse[row];
  const int64_t local = static_cast<int64_t>(t) - vocab_start;
  for (int64_t c = threadIdx.x; c < Vl; c += blockDim.x) {
    float p = c < valid ? expf(Elem<T>::load(x[c]) - l) * g : 0.0f;
    if (c == local) p -= g;
    d[c] = Elem<T>::store(p);
  }
}

bool rows_ok(int64_t N, int64_t Vl, int64_t valid, const char* who) {
  if (N < 0 || Vl <= 0 || valid < 0 || valid > Vl)
    PT_THROW(InputError, who, " (cuda): bad size N=", N, " Vl=", Vl, " valid=", valid);
  if (N > 0x7fffffff) PT_THROW(InputError, who, " (cuda): N=", N, " rows is more than one launch takes (2^31-1)");
  return N > 0;
}

}  // namespace

template <DType T>
void vocab_shard_row_max(void* row_max, const void* logits, const int32_t* targets, int64_t N, int64_t Vl,
                         int64_t valid) {
  if (!rows_ok(N, Vl, valid, "vocab_shard_row_max")) return;
  row_max_kernel<T><<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream()>>>(
      static_cast<float*>(row_max), static_cast<const typename Elem<T>::S*>(logits), targets, Vl, valid);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType T>
void vocab_shard_exp_sums(void* sums, const void* logits, const void* row_max, const int32_t* targets, int64_t N,
                          int64_t Vl, int64_t valid, int64_t vocab_start) {
  if (!rows_ok(N, Vl, valid, "vocab_shard_exp_sums")) return;
  exp_sums_kernel<T><<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream()>>>(
      static_cast<float*>(sums), static_cast<const typename Elem<T>::S*>(logits), static_cast<const float*>(row_max),
      targets, N, Vl, valid, vocab_start);
  PT_CUDA_CHECK_LAUNCH();
}

void vocab_shard_losses(void* losses_v, void* lse_v, const void* sums_v, const int32_t* targets, int64_t N,
                        int64_t vocab_size) {
  auto* losses = static_cast<float*>(losses_v);
  auto* lse = static_cast<float*>(lse_v);
  const auto* sums = static_cast<const float*>(sums_v);
  detail::launch_each(N, "vocab_shard_losses", [=] __device__(int64_t r) {
    const int32_t t = targets[r];
    if (t == kIgnore) {
      losses[r] = 0.0f;
      return;
    }
    lse[r] += logf(sums[r]);
    losses[r] = t < 0 || t >= vocab_size ? NAN : lse[r] - sums[N + r];
  });
}

template <DType T>
void vocab_shard_ce_backward(void* dlogits, const void* logits, const void* lse, const void* scale,
                             const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start) {
  if (!rows_ok(N, Vl, valid, "vocab_shard_ce_backward")) return;
  backward_kernel<T><<<static_cast<unsigned>(N), kRowThreads, 0, detail::stream()>>>(
      static_cast<typename Elem<T>::S*>(dlogits), static_cast<const typename Elem<T>::S*>(logits),
      static_cast<const float*>(lse), static_cast<const float*>(scale), targets, Vl, valid, vocab_start);
  PT_CUDA_CHECK_LAUNCH();
}

#define PT_VOCAB_SHARD(T)                                                                                          \
  template void vocab_shard_row_max<T>(void*, const void*, const int32_t*, int64_t, int64_t, int64_t);            \
  template void vocab_shard_exp_sums<T>(void*, const void*, const void*, const int32_t*, int64_t, int64_t,        \
                                        int64_t, int64_t);                                                         \
  template void vocab_shard_ce_backward<T>(void*, const void*, const void*, const void*, const int32_t*, int64_t, \
                                           int64_t, int64_t, int64_t);
PT_VOCAB_SHARD(DType::F32)
PT_VOCAB_SHARD(DType::BF16)
PT_VOCAB_SHARD(DType::F16)
#undef PT_VOCAB_SHARD

}  // namespace paratrain::kernels::cuda
