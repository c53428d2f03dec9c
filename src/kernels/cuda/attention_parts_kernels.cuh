// The kernels of the attention pieces on CUDA (attention_parts.cu), each a block per row so
// that no thread divides per element: a thread's row comes from its block index (one division
// per block), its element from a loop over the row's columns.
//  - split_rows / merge_rows: a block per row (b, t) of x (B,T,P*C) and the P*C elements of
//    that row; x is read (written) in order, heads (P, B*NH, T, hs) written (read) in runs of
//    hs; loads and stores through E, the includer's element rules (E::S, E::load, E::store);
//  - chunk_probs_rows / chunk_dscores_rows: a block per row (bh, i) of a chunk of scores;
//  - rowdot_rows: a warp per row of (B*NH, T, hs), the lanes' sums added by __shfl_xor_sync in
//    one fixed tree (the same bits every run); every lane of every warp reaches the shuffles.
// The contract of each is that of the CPU piece of the same name (kernels/cpu/attention_parts.h).
//
// This file holds only the kernels, so that they can be compiled on the host over an emulation
// of the CUDA built-ins they use (threadIdx, blockIdx, blockDim, __shfl_xor_sync, expf), as
// tests/kernels/attention_parts_emulated_test.cpp does, to check their indexing without a GPU.
#pragma once

namespace paratrain::kernels::cuda::parts {
namespace {

// Head h, part p, position t of heads (P, BH, T, hs): the first of its hs elements.
__device__ __forceinline__ int64_t head_row(int64_t p, int64_t BH, int64_t bh, int64_t T, int64_t t, int64_t hs) {
  return ((p * BH + bh) * T + t) * hs;
}

// Row blockIdx.x = b * T + t of x (B,T,P*C) into heads, widened to f32.
template <typename E>
__global__ void split_rows_kernel(float* heads, const typename E::S* x, int64_t B, int64_t T, int C, int NH, int P) {
  const int64_t row = blockIdx.x, b = row / T, t = row % T;
  const int hs = C / NH;
  const typename E::S* src = x + row * P * C;
  for (int c = threadIdx.x; c < P * C; c += blockDim.x) {
    const int p = c / C, h = (c - p * C) / hs, d = c - p * C - h * hs;
    heads[head_row(p, B * NH, b * NH + h, T, t, hs) + d] = E::load(src[c]);
  }
}

// Row blockIdx.x = b * T + t of x from heads: x = heads, or x + heads (in f32, rounded once).
template <typename E>
__global__ void merge_rows_kernel(typename E::S* x, const float* heads, int64_t B, int64_t T, int C, int NH, int P,
                                  bool accumulate) {
  const int64_t row = blockIdx.x, b = row / T, t = row % T;
  const int hs = C / NH;
  typename E::S* dst = x + row * P * C;
  for (int c = threadIdx.x; c < P * C; c += blockDim.x) {
    const int p = c / C, h = (c - p * C) / hs, d = c - p * C - h * hs;
    const float v = heads[head_row(p, B * NH, b * NH + h, T, t, hs) + d];
    dst[c] = E::store(accumulate ? E::load(dst[c]) + v : v);
  }
}

// Row blockIdx.x = bh * rows + i of a chunk (BH, rows, keys), query t = r0 + i: P = exp(S - lse)
// for keys j <= t, else 0.
__global__ void chunk_probs_rows_kernel(float* S, const float* lse, int64_t T, int64_t r0, int64_t rows) {
  const int64_t row = blockIdx.x, bh = row / rows, t = r0 + row % rows, keys = r0 + rows;
  float* s = S + row * keys;
  const float m = lse[bh * T + t];
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) s[j] = j <= t ? expf(s[j] - m) : 0.0f;
}

// The same rows: dS = P (dP - D) for keys j <= t, else 0, in place in dP.
__global__ void chunk_dscores_rows_kernel(float* dP, const float* P, const float* D, int64_t T, int64_t r0,
                                          int64_t rows) {
  const int64_t row = blockIdx.x, bh = row / rows, t = r0 + row % rows, keys = r0 + rows;
  float* ds = dP + row * keys;
  const float* p = P + row * keys;
  const float d = D[bh * T + t];
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) ds[j] = j <= t ? p[j] * (ds[j] - d) : 0.0f;
}

// D[r] = dO[r][:] . O[r][:] for the n rows of (n, hs): warp w of block b owns row
// b * (blockDim.x / 32) + w; lane l adds elements l, l + 32, ...
__global__ void rowdot_rows_kernel(float* D, const float* dO, const float* O, int64_t n, int hs) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float s = 0.0f;
  if (r < n)
    for (int d = lane; d < hs; d += 32) s += dO[r * hs + d] * O[r * hs + d];
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (r < n && lane == 0) D[r] = s;
}

}  // namespace
}  // namespace paratrain::kernels::cuda::parts
