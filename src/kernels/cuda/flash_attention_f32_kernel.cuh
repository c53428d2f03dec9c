// The fused causal attention in f32 arithmetic on the CUDA cores (flash_attention_f32.cu):
// FlashAttention-2's scheme with f32 FMAs, no score matrix in global memory, every product and
// sum in f32 (no TF32: the f32 contract is exact f32 arithmetic, as the f32 GEMMs). The f32 twin
// of the tensor-core kernels of flash_attention_kernel.cuh, register-tiled as an SGEMM is.
// Every kernel is a template on E, the element rules of its buffers (q/k/v, out, dout, dqkv):
// E::S the stored type (float, or uint16_t bits of bf16 or f16), E::load widening to f32 and
// E::store rounding once (detail::Elem on a GPU). 16-bit inputs are widened into f32 tiles, so
// bf16 and f16 attention here follows the CPU's contract (f32 products; P and dS are not
// rounded, unlike the tensor-core kernels'); lse and D are f32.
//
// A block of 256 threads owns 64 rows (query rows: the forward and dQ; keys: dK and dV) of one
// (batch, head) and walks 64-row tiles of the other side. Thread t is (ty, tx) = (t / 16, t % 16):
//   - in a 64 x 64 score tile it owns rows 4 ty .. 4 ty + 3 and columns tx, tx + 16, tx + 32,
//     tx + 48 (16 scores in registers); a row's 16 owners are 16 consecutive lanes of one warp,
//     so its max and sum are four shuffles;
//   - in a 64 x HS result tile it owns the same 4 rows and HS / 16 columns, in vectors of 4
//     (head size 32: of 2): columns 64 g + 4 tx .. 64 g + 4 tx + 3 for g < HS / 64.
// Scores: for every 4 columns d of the head, each thread loads its 4 rows' (d..d+3) of one side
// (a 16-byte load its warp shares) and its 4 columns' of the other (16-byte loads of 16
// different rows), then does 64 FMAs. Products with P or dS: for every 4 keys (or queries) the
// thread loads its rows' 4 values of the 64 x 64 tile and the 4 rows of the 64 x HS operand
// it multiplies, again 16-byte loads, 16 FMAs per loaded vector.
// Shared row strides are HS + 4 and 68 floats: a multiple of 4 (16-byte loads) with an odd
// number of 16-byte units, so the 8 rows a quarter-warp reads at once fall in 8 different
// 16-byte bank groups.
//
// forward, a block per 64 query rows (the last first: the longest run first): for each tile of
//   64 keys up to the diagonal, S = scale Q K^T masked, the running max m and sum l per row,
//   P = exp(S - m) to shared memory, O = alpha O + P V in registers; then out = O / l and
//   lse = m + log l (natural log of the scaled scores: the CPU's convention).
// backward, D = rowsum(dO * O) first (flash_common::rowdot_kernel), then two kernels, so that every element
//   of dqkv has one writer (no atomics: the same bits every run; `+=` into dqkv):
//   dK/dV, a block per 64 keys (the first first), over the query tiles from the diagonal on:
//     P^T = exp(scale K Q^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D);
//     dV += P^T dO, dK += scale dS^T Q (P^T and dS^T take turns in one shared tile);
//   dQ, a block per 64 query rows (the last first), over the key tiles up to the diagonal:
//     P and dS likewise, dQ += scale dS K.
// Rows past T are loaded as zeros, masked and never written. A row of P (or dS, P^T, dS^T) is
// written and read by its 16 owners, lanes of one warp, so between the scores and the product
// the warp syncs alone (__syncwarp); the block syncs twice a tile, around the tile's loads.
//
// This file holds only the kernels, so that they compile on the host over an emulation of the
// CUDA built-ins they use (threadIdx, blockIdx, gridDim, __syncthreads, __syncwarp, __shfl_xor_sync,
// float2, float4, make_float4, uint4) and run there without a GPU
// (tests/kernels/flash_attention_emulated_test.cpp).
#pragma once

#include "kernels/cuda/flash_kernel_common.cuh"

namespace paratrain::kernels::cuda::flash32 {
// Internal linkage: each includer (flash_attention_f32.cu, the CPU emulation) has its own.
namespace {

using flash_common::last_tile_first;

constexpr int kRows = 64;       // rows a block owns = rows of a tile it walks
constexpr int kThreads = 256;   // 16 x 16
constexpr int kLdP = kRows + 4;  // row stride of the 64 x 64 P / dS tile

template <int HS>
struct Shape {
  static_assert(HS == 32 || HS == 64 || HS == 128, "head sizes 32, 64 and 128");
  static constexpr int kLd = HS + 4;                // row stride of the 64 x HS tiles
  static constexpr int kTile = kRows * kLd;         // floats of one 64 x HS tile
  static constexpr int kVec = HS >= 64 ? 4 : 2;     // a thread's result columns come in vectors of kVec
  static constexpr int kGroups = HS / (16 * kVec);  // ... kGroups of them
  static constexpr int kCols = HS / 16;             // = kVec * kGroups
  // Shared memory: the forward's three tiles and P; the backward's four tiles, P/dS, lse and D.
  static constexpr int kForwardBytes = 4 * (3 * kTile + kRows * kLdP);
  static constexpr int kBackwardBytes = 4 * (4 * kTile + kRows * kLdP + 2 * kRows);
  // Column of element (g, e) of thread tx's result columns.
  __device__ static int column(int tx, int g, int e) { return g * 16 * kVec + tx * kVec + e; }
};

__device__ __forceinline__ int thread_row() { return static_cast<int>(threadIdx.x) / 16; }  // ty
__device__ __forceinline__ int thread_col() { return static_cast<int>(threadIdx.x) % 16; }  // tx

// N consecutive floats at p (16- or 8-byte aligned) into v.
template <int N>
__device__ __forceinline__ void load_vec(float* v, const float* p) {
  if constexpr (N == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x, v[1] = x.y;
  }
}

// The max / sum of v over the 16 lanes that own one score row (lanes 16 apart never mix).
__device__ __forceinline__ float row_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows [r0, r0 + 64) of an (n, row_stride) array of E::S, HS columns from src (16-byte
// aligned, row_stride 16 bytes' worth of elements), widened into an f32 tile with row stride
// HS + 4; rows at or past n are zeros. 16 bytes per load: 4 floats, or 8 16-bit values.
template <int HS, typename E>
__device__ __forceinline__ void load_rows(float* tile, const typename E::S* src, int64_t row_stride, int64_t r0,
                                          int64_t n) {
  constexpr int kPerVec = 16 / static_cast<int>(sizeof(typename E::S)), kVecs = HS / kPerVec;
  for (int e = static_cast<int>(threadIdx.x); e < kRows * kVecs; e += kThreads) {
    const int r = e / kVecs, c = (e % kVecs) * kPerVec;
    float* dst = tile + r * Shape<HS>::kLd + c;
    if constexpr (kPerVec == 4) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r0 + r < n) v = *reinterpret_cast<const float4*>(src + (r0 + r) * row_stride + c);
      *reinterpret_cast<float4*>(dst) = v;
    } else {
      uint4 v = make_uint4(0, 0, 0, 0);  // the bits of +0 in bf16 and f16
      if (r0 + r < n) v = *reinterpret_cast<const uint4*>(src + (r0 + r) * row_stride + c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};  // element 2i in the low half (little-endian)
      float f[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f[2 * i] = E::load(static_cast<uint16_t>(w[i] & 0xffffu));
        f[2 * i + 1] = E::load(static_cast<uint16_t>(w[i] >> 16));
      }
      *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
  }
}

// s[i][j] = A[4 ty + i] . B[tx + 16 j] over HS columns (A, B: 64 x HS tiles, stride HS + 4).
template <int HS>
__device__ __forceinline__ void tile_dots(float (&s)[4][4], const float* A, const float* B) {
  constexpr int ld = Shape<HS>::kLd;
  const int ty = thread_row(), tx = thread_col();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
#pragma unroll 2
  for (int d = 0; d < HS; d += 4) {
    float a[4][4], b[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) load_vec<4>(a[i], A + (4 * ty + i) * ld + d);
#pragma unroll
    for (int j = 0; j < 4; ++j) load_vec<4>(b[j], B + (tx + 16 * j) * ld + d);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = fmaf(a[i][k], b[j][k], s[i][j]);
  }
}

// acc[i][c] += sum_r M[4 ty + i][r] Y[r][column c] over the 64 rows r (M: 64 x 64, stride 68;
// Y: 64 x HS, stride HS + 4), r in order.
template <int HS>
__device__ __forceinline__ void tile_product(float (&acc)[4][Shape<HS>::kCols], const float* M, const float* Y) {
  using S = Shape<HS>;
  const int ty = thread_row(), tx = thread_col();
#pragma unroll 1
  for (int r = 0; r < kRows; r += 4) {
    float m[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) load_vec<4>(m[i], M + (4 * ty + i) * kLdP + r);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float y[S::kCols];
#pragma unroll
      for (int g = 0; g < S::kGroups; ++g)
        load_vec<S::kVec>(y + g * S::kVec, Y + (r + k) * S::kLd + S::column(tx, g, 0));
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < S::kCols; ++c) acc[i][c] = fmaf(m[i][k], y[c], acc[i][c]);
    }
  }
}

template <int HS>
__device__ __forceinline__ void zero(float (&acc)[4][Shape<HS>::kCols]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < Shape<HS>::kCols; ++c) acc[i][c] = 0.0f;
}

// dst[row][column c] = scale * acc[i][c] (+ what dst holds when `add`, in f32), rounded once to
// E::S, for the thread's rows r0 + 4 ty + i below n; dst points at column 0 of row 0 (row
// stride `stride`).
template <int HS, typename E>
__device__ __forceinline__ void write_rows(typename E::S* dst, int64_t stride, int64_t r0, int64_t n,
                                           const float (&acc)[4][Shape<HS>::kCols], const float* scale, bool add) {
  using S = Shape<HS>;
  const int ty = thread_row(), tx = thread_col();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = r0 + 4 * ty + i;
    if (row >= n) continue;
    typename E::S* p = dst + row * stride;
#pragma unroll
    for (int g = 0; g < S::kGroups; ++g)
#pragma unroll
      for (int e = 0; e < S::kVec; ++e) {
        const int c = S::column(tx, g, e);
        const float v = scale[i] * acc[i][g * S::kVec + e];
        p[c] = E::store(add ? E::load(p[c]) + v : v);
      }
  }
}

template <int HS, typename E>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(typename E::S* out, float* lse, const typename E::S* qkv, int64_t T, int64_t C, int NH,
                   float scale) {
  using S = Shape<HS>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* Qs = reinterpret_cast<float*>(smem);
  float* Ks = Qs + S::kTile;
  float* Vs = Ks + S::kTile;
  float* Ps = Vs + S::kTile;
  const int qt = static_cast<int>(last_tile_first());
  const int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = static_cast<int64_t>(qt) * kRows, C3 = 3 * C;
  const typename E::S* q = qkv + b * T * C3 + h * HS;
  const int ty = thread_row(), tx = thread_col();

  load_rows<HS, E>(Qs, q, C3, q0, T);
  float m[4], l[4], o[4][S::kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  zero<HS>(o);
  for (int kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kRows;
    __syncthreads();  // Q is in; every warp has read the last tile's K and V
    load_rows<HS, E>(Ks, q + C, C3, k0, T);
    load_rows<HS, E>(Vs, q + 2 * C, C3, k0, T);
    __syncthreads();
    float s[4][4];
    tile_dots<HS>(s, Qs, Ks);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = q0 + 4 * ty + i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t key = k0 + tx + 16 * j;
        s[i][j] = row < T && key <= row ? scale * s[i][j] : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], row_max(mx));  // -inf only for a row past T
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = s[i][j] == -INFINITY ? 0.0f : expf(s[i][j] - m_new);
        Ps[(4 * ty + i) * kLdP + tx + 16 * j] = p;
        sum += p;
      }
      const float alpha = m[i] == -INFINITY ? 0.0f : expf(m[i] - m_new);
      l[i] = l[i] * alpha + row_sum(sum);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < S::kCols; ++c) o[i][c] *= alpha;
    }
    __syncwarp();  // a row of P is written and read by its 16 lanes, all in one warp
    tile_product<HS>(o, Ps, Vs);
  }
  float inv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    inv[i] = 1.0f / l[i];
    const int64_t row = q0 + 4 * ty + i;
    if (lse && tx == 0 && row < T) lse[bh * T + row] = m[i] + logf(l[i]);
  }
  write_rows<HS, E>(out + b * T * C + h * HS, C, q0, T, o, inv, false);
}

// lse and D of rows [r0, r0 + 64) of one (batch, head) into lse_s, D_s (0 past T).
__device__ __forceinline__ void load_row_stats(float* lse_s, float* D_s, const float* lse_bh, const float* D_bh,
                                               int64_t r0, int64_t T) {
  for (int r = static_cast<int>(threadIdx.x); r < kRows; r += kThreads) {
    const bool in = r0 + r < T;
    lse_s[r] = in ? lse_bh[r0 + r] : 0.0f;
    D_s[r] = in ? D_bh[r0 + r] : 0.0f;
  }
}

// P and dS of the thread's 16 scores from s (the unscaled dot products) and dp, with the
// rows' (or, transposed, the columns') lse and D; 0 where masked (query past T or key after
// query). `transposed`: rows are keys k0 + 4 ty + i and columns queries q0 + tx + 16 j.
__device__ __forceinline__ void probabilities(float (&p)[4][4], float (&ds)[4][4], const float (&s)[4][4],
                                              const float (&dp)[4][4], const float* lse_s, const float* D_s,
                                              int64_t q0, int64_t k0, int64_t T, float scale, bool transposed) {
  const int ty = thread_row(), tx = thread_col();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int qr = transposed ? tx + 16 * j : 4 * ty + i;  // the query's row in the tile
      const int64_t query = q0 + qr, key = k0 + (transposed ? 4 * ty + i : tx + 16 * j);
      const bool live = query < T && key <= query;
      p[i][j] = live ? expf(scale * s[i][j] - lse_s[qr]) : 0.0f;
      ds[i][j] = p[i][j] * (dp[i][j] - D_s[qr]);
    }
}

// P and dS of the thread's 16 scores of a tile: s = A B^T, dp = dA dB^T (tile_dots), then
// probabilities(); (A, B, dA, dB) are (K, Q, V, dO) when `transposed`, else (Q, K, dO, V).
template <int HS>
__device__ __forceinline__ void recompute(float (&p)[4][4], float (&ds)[4][4], const float* A, const float* B,
                                          const float* dA, const float* dB, const float* lse_s, const float* D_s,
                                          int64_t q0, int64_t k0, int64_t T, float scale, bool transposed) {
  float s[4][4], dp[4][4];
  tile_dots<HS>(s, A, B);
  tile_dots<HS>(dp, dA, dB);
  probabilities(p, ds, s, dp, lse_s, D_s, q0, k0, T, scale, transposed);
}

// The thread's 16 values into the 64 x 64 tile M (stride 68).
__device__ __forceinline__ void store_scores(float* M, const float (&v)[4][4]) {
  const int ty = thread_row(), tx = thread_col();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) M[(4 * ty + i) * kLdP + tx + 16 * j] = v[i][j];
}

template <int HS, typename E>
__global__ void __launch_bounds__(kThreads)
    backward_keys_kernel(typename E::S* dqkv, const typename E::S* dout, const typename E::S* qkv, const float* lse,
                         const float* D, int64_t T, int64_t C, int NH, float scale) {
  using S = Shape<HS>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* Ks = reinterpret_cast<float*>(smem);
  float* Vs = Ks + S::kTile;
  float* Qs = Vs + S::kTile;
  float* dOs = Qs + S::kTile;
  float* Ms = dOs + S::kTile;  // P^T, then dS^T
  float* lse_s = Ms + kRows * kLdP;
  float* D_s = lse_s + kRows;
  const int kt = static_cast<int>(blockIdx.x);  // the first key tile sees the most queries
  const int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, k0 = static_cast<int64_t>(kt) * kRows, C3 = 3 * C;
  const typename E::S* q = qkv + b * T * C3 + h * HS;
  const typename E::S* dO = dout + b * T * C + h * HS;

  load_rows<HS, E>(Ks, q + C, C3, k0, T);
  load_rows<HS, E>(Vs, q + 2 * C, C3, k0, T);
  float dk[4][S::kCols], dv[4][S::kCols];
  zero<HS>(dk);
  zero<HS>(dv);
  const int tiles = static_cast<int>((T + kRows - 1) / kRows);
  for (int qt = kt; qt < tiles; ++qt) {  // earlier queries do not see these keys
    const int64_t q0 = static_cast<int64_t>(qt) * kRows;
    __syncthreads();  // K and V are in; every warp has read the last tile's Q, dO and stats
    load_rows<HS, E>(Qs, q, C3, q0, T);
    load_rows<HS, E>(dOs, dO, C, q0, T);
    load_row_stats(lse_s, D_s, lse + bh * T, D + bh * T, q0, T);
    __syncthreads();
    float p[4][4], ds[4][4];
    recompute<HS>(p, ds, Ks, Qs, Vs, dOs, lse_s, D_s, q0, k0, T, scale, true);
    // A row of Ms is written and read by its 16 lanes, all in one warp.
    store_scores(Ms, p);
    __syncwarp();
    tile_product<HS>(dv, Ms, dOs);
    __syncwarp();
    store_scores(Ms, ds);
    __syncwarp();
    tile_product<HS>(dk, Ms, Qs);
  }
  const float scales[4] = {scale, scale, scale, scale}, ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  typename E::S* dq_b = dqkv + b * T * C3 + h * HS;
  write_rows<HS, E>(dq_b + C, C3, k0, T, dk, scales, true);
  write_rows<HS, E>(dq_b + 2 * C, C3, k0, T, dv, ones, true);
}

template <int HS, typename E>
__global__ void __launch_bounds__(kThreads)
    backward_queries_kernel(typename E::S* dqkv, const typename E::S* dout, const typename E::S* qkv,
                            const float* lse, const float* D, int64_t T, int64_t C, int NH, float scale) {
  using S = Shape<HS>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* Qs = reinterpret_cast<float*>(smem);
  float* dOs = Qs + S::kTile;
  float* Ks = dOs + S::kTile;
  float* Vs = Ks + S::kTile;
  float* dSs = Vs + S::kTile;
  float* lse_s = dSs + kRows * kLdP;
  float* D_s = lse_s + kRows;
  const int qt = static_cast<int>(last_tile_first());
  const int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = static_cast<int64_t>(qt) * kRows, C3 = 3 * C;
  const typename E::S* q = qkv + b * T * C3 + h * HS;

  load_rows<HS, E>(Qs, q, C3, q0, T);
  load_rows<HS, E>(dOs, dout + b * T * C + h * HS, C, q0, T);
  load_row_stats(lse_s, D_s, lse + bh * T, D + bh * T, q0, T);
  float dq[4][S::kCols];
  zero<HS>(dq);
  for (int kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kRows;
    __syncthreads();  // Q, dO and the stats are in; every warp has read the last tile's K and V
    load_rows<HS, E>(Ks, q + C, C3, k0, T);
    load_rows<HS, E>(Vs, q + 2 * C, C3, k0, T);
    __syncthreads();
    float p[4][4], ds[4][4];
    recompute<HS>(p, ds, Qs, Ks, dOs, Vs, lse_s, D_s, q0, k0, T, scale, false);
    store_scores(dSs, ds);
    __syncwarp();  // a row of dS is written and read by its 16 lanes, all in one warp
    tile_product<HS>(dq, dSs, Ks);
  }
  const float scales[4] = {scale, scale, scale, scale};
  write_rows<HS, E>(dqkv + b * T * C3 + h * HS, C3, q0, T, dq, scales, true);
}

}  // namespace
}  // namespace paratrain::kernels::cuda::flash32
