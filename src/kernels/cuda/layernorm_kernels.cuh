// The LayerNorm kernels on CUDA (layernorm.cu), f32; the contract is kernels/cpu/layernorm.h.
//  - layernorm_forward_kernel and layernorm_backward_dinp_kernel: a warp per row (kRowsPerBlock
//    rows per block; a warp past the last row returns, so no block-wide barrier may follow),
//    two passes over the row (mean, then the variance of x - mean), as the CPU kernel;
//  - layernorm_backward_params_kernel: blocks of 32 columns x 8 thread rows over a chunk of rows
//    each, the chunk's dweight and dbias sums into a scratch row of partial sums;
//  - add_chunks_in_order: dweight, dbias += the chunks' sums in chunk order, a thread per
//    column: no atomics, the same bits every run.
// warp_sum (every lane of a full warp gets the sum) is the includer's, in this namespace.
//
// This file holds only the kernels, so that they can be compiled on the host over an emulation
// of the CUDA built-ins they use (threadIdx, blockIdx, blockDim, __syncthreads, sqrtf), as
// tests/kernels/layernorm_emulated_test.cpp does, to check them without a GPU.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cuda::ln {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kThreads = 32 * kRowsPerBlock;

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t N, int64_t C,
                                         float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp leaves; no block-wide barrier follows
  const float* x = inp + row * C;
  float* o = out + row * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  for (int64_t c = lane; c < C; c += 32) {
    float y = (x[c] - m) * rs;
    if (weight) y *= weight[c];
    if (bias) y += bias[c];
    o[c] = y;
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

// dinp += rs * (dn - mean(dn) - norm * mean(dn * norm)), dn = dout * weight.
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* weight, const float* mean, const float* rstd,
                                               int64_t N, int64_t C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* g = dout + row * C;
  float* di = dinp + row * C;
  const float m = mean[row], rs = rstd[row];
  float sd = 0.0f, sdn = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float dn = weight ? g[c] * weight[c] : g[c];
    sd += dn;
    sdn += dn * (x[c] - m) * rs;
  }
  sd = warp_sum(sd) / static_cast<float>(C);
  sdn = warp_sum(sdn) / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float dn = weight ? g[c] * weight[c] : g[c];
    const float nrm = (x[c] - m) * rs;
    di[c] += rs * (dn - sd - nrm * sdn);
  }
}

// Block (32, 8): column blockIdx.x * 32 + threadIdx.x, rows [blockIdx.y * rows_per_chunk, ...).
__global__ void layernorm_backward_params_kernel(float* partial, const float* dout,
                                                 const float* inp, const float* mean, const float* rstd,
                                                 int64_t N, int64_t C, int64_t rows_per_chunk) {
  static __shared__ float sw[8][33], sb[8][33];  // static: one per block in the CPU emulation too
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float g = dout[r * C + c];
      aw += (inp[r * C + c] - mean[r]) * rstd[r] * g;
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int y = 1; y < 8; ++y) {
      aw += sw[y][threadIdx.x];
      ab += sb[y][threadIdx.x];
    }
    partial[(static_cast<int64_t>(blockIdx.y) * 2) * C + c] = aw;  // the chunk's sums; added in chunk order next
    partial[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * C + c] = ab;
  }
}

// dweight[c] += chunk 0's sum, then chunk 1's, ...; dbias likewise: one thread per column.
__global__ void add_chunks_in_order(float* dweight, float* dbias, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  if (dweight) {
    float acc = dweight[c];
    for (int64_t k = 0; k < chunks; ++k) acc += partial[(k * 2) * C + c];
    dweight[c] = acc;
  }
  if (dbias) {
    float acc = dbias[c];
    for (int64_t k = 0; k < chunks; ++k) acc += partial[(k * 2 + 1) * C + c];
    dbias[c] = acc;
  }
}

}  // namespace
}  // namespace paratrain::kernels::cuda::ln
