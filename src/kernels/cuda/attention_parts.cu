// The attention pieces on CUDA (kernels/cuda/layers.h; the contract is
// kernels/cpu/attention_parts.h), for the attention by batched GEMMs
// (kernels/attention_by_gemm.h):
//  - split/merge heads, probs, dscores, rowdot: attention_parts_kernels.cuh, a block (or, for
//    rowdot, a warp) per row, loads and stores by detail::Elem (the CPU's rounding);
//  - the chunk softmax: a block of 256 threads per (head, query row), max and sum as block
//    reductions in f32 (block_reduce.cuh), as the row softmax kernels do.
// Everything on the compute stream; no host waits.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/attention_parts_kernels.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::Elem;
using detail::kThreads;

// A block per row of the chunk: blockIdx.x = bh * rows + i.
__global__ void chunk_softmax_kernel(float* S, float* lse, int64_t T, int64_t r0, int64_t rows) {
  const int64_t keys = r0 + rows, row = blockIdx.x, bh = row / rows, t = r0 + row % rows, nv = t + 1;
  float* s = S + row * keys;
  float v = -INFINITY;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) v = fmaxf(v, s[j]);
  const float m = detail::block_max(v);
  float e = 0.0f;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) e += expf(s[j] - m);
  const float sum = detail::block_sum(e), inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) s[j] = j < nv ? expf(s[j] - m) * inv : 0.0f;
  if (threadIdx.x == 0) lse[bh * T + t] = m + logf(sum);
}

void check(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P, const char* who) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0 || (P != 1 && P != 3))
    PT_THROW(InputError, who, " (cuda): bad sizes B=", B, " T=", T, " C=", C, " NH=", NH, " P=", P);
  if (B * T > 0x7fffffff || P * C > 0x7fffffff)
    PT_THROW(InputError, who, " (cuda): ", B * T, " rows of ", P * C, " is more than one launch takes");
}

void check_chunk(int64_t BH, int64_t T, int64_t r0, int64_t rows, const char* who) {
  if (BH < 0 || T < 0 || r0 < 0 || rows < 0 || r0 + rows > T)
    PT_THROW(InputError, who, " (cuda): bad chunk BH=", BH, " T=", T, " r0=", r0, " rows=", rows);
  if (BH * rows > 0x7fffffff) PT_THROW(InputError, who, " (cuda): ", BH * rows, " rows is more than one launch takes");
}

template <DType D>
void split(void* heads, const void* x, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P) {
  check(B, T, C, NH, P, "attention_split_heads");
  if (B * T == 0) return;
  parts::split_rows_kernel<Elem<D>><<<static_cast<unsigned>(B * T), kThreads, 0, detail::stream()>>>(
      static_cast<float*>(heads), static_cast<const typename Elem<D>::S*>(x), B, T, static_cast<int>(C),
      static_cast<int>(NH), static_cast<int>(P));
  PT_CUDA_CHECK_LAUNCH();
}

template <DType D>
void merge(void* x, const void* heads, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P, bool accumulate) {
  check(B, T, C, NH, P, "attention_merge_heads");
  if (B * T == 0) return;
  parts::merge_rows_kernel<Elem<D>><<<static_cast<unsigned>(B * T), kThreads, 0, detail::stream()>>>(
      static_cast<typename Elem<D>::S*>(x), static_cast<const float*>(heads), B, T, static_cast<int>(C),
      static_cast<int>(NH), static_cast<int>(P), accumulate);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_split_heads(float* heads, const float* x, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P) {
  split<DType::F32>(heads, x, B, T, C, NH, P);
}
void attention_split_heads_bf16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P) {
  split<DType::BF16>(heads, x, B, T, C, NH, P);
}
void attention_split_heads_f16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P) {
  split<DType::F16>(heads, x, B, T, C, NH, P);
}
void attention_merge_heads(float* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P,
                           bool accumulate) {
  merge<DType::F32>(x, heads, B, T, C, NH, P, accumulate);
}
void attention_merge_heads_bf16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P, bool accumulate) {
  merge<DType::BF16>(x, heads, B, T, C, NH, P, accumulate);
}
void attention_merge_heads_f16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P, bool accumulate) {
  merge<DType::F16>(x, heads, B, T, C, NH, P, accumulate);
}

void attention_chunk_softmax(float* S, float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows) {
  check_chunk(BH, T, r0, rows, "attention_chunk_softmax");
  if (BH * rows == 0) return;
  chunk_softmax_kernel<<<static_cast<unsigned>(BH * rows), kThreads, 0, detail::stream()>>>(S, lse, T, r0, rows);
  PT_CUDA_CHECK_LAUNCH();
}

void attention_chunk_probs(float* S, const float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows) {
  check_chunk(BH, T, r0, rows, "attention_chunk_probs");
  if (BH * rows == 0) return;
  parts::chunk_probs_rows_kernel<<<static_cast<unsigned>(BH * rows), kThreads, 0, detail::stream()>>>(S, lse, T, r0,
                                                                                                      rows);
  PT_CUDA_CHECK_LAUNCH();
}

void attention_chunk_dscores(float* dP, const float* P, const float* D, int64_t BH, int64_t T, int64_t r0,
                             int64_t rows) {
  check_chunk(BH, T, r0, rows, "attention_chunk_dscores");
  if (BH * rows == 0) return;
  parts::chunk_dscores_rows_kernel<<<static_cast<unsigned>(BH * rows), kThreads, 0, detail::stream()>>>(dP, P, D, T,
                                                                                                        r0, rows);
  PT_CUDA_CHECK_LAUNCH();
}

void attention_rowdot(float* D, const float* dO, const float* O, int64_t BH, int64_t T, int64_t hs) {
  if (BH < 0 || T < 0 || hs < 0 || hs > 0x7fffffff) PT_THROW(InputError, "attention_rowdot (cuda): bad sizes");
  const int64_t n = BH * T, rows_per_block = kThreads / 32;
  if (n == 0) return;
  if (n / rows_per_block >= 0x7fffffff)
    PT_THROW(InputError, "attention_rowdot (cuda): ", n, " rows is more than one launch takes");
  parts::rowdot_rows_kernel<<<detail::ceil_div(n, rows_per_block), kThreads, 0, detail::stream()>>>(
      D, dO, O, n, static_cast<int>(hs));
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace paratrain::kernels::cuda
