// The fused causal attention on tensor cores (flash_attention.cu): FlashAttention-2's forward
// (one kernel) and backward (three, below), no score matrix in global memory. Every kernel is a
// template on E, the 16-bit type of q/k/v, out, dout and dqkv and of the WMMA operands:
// __nv_bfloat16 (--precision bf16) or __half (--precision fp16); "bf16" below is that type.
// Products accumulate in f32 either way, and the softmax statistics are f32.
//
// A block of 128 threads (4 warps) owns 64 query rows of one (batch, head); warp w owns rows
// 16w..16w+15 of them. For each tile of 64 keys up to the diagonal:
//   1. the block loads the tile's K and V (bf16, 16-byte loads) into shared memory;
//   2. each warp computes its 16 x 64 scores S = Q K^T with WMMA (bf16 x bf16 into f32), one
//      16 x 16 fragment at a time, and stores them to shared memory;
//   3. two threads per query row (lanes 2r, 2r+1 of a warp, alternate keys, 32 each) scale and
//      mask the row, update its running max m and sum l online, write P = exp(s - m) rounded to bf16
//      (as FlashAttention rounds P before P V), and the row's rescale alpha = exp(m_old - m);
//   4. each warp scales its rows' f32 output O, WMMA accumulators held in registers across the
//      tiles, by alpha (the row of an accumulator element from a fragment of row indices), and
//      adds P V (WMMA, bf16 x bf16 into f32).
// Steps 2 to 4 touch only the warp's own rows of S and P and its rows' alphas (FlashAttention-2's
// split of the queries over the warps), so between them the warp syncs alone (__syncwarp); the
// block syncs twice a tile, around the loads of K and V. The backward kernels likewise.
// At the end the output is staged in shared memory, divided by l, rounded to bf16 and written
// to (B,T,C); lse = m + log l (natural log, the scores already scaled: the CPU's convention).
// Rows past T compute nothing that is written.
//
// Shared memory (dynamic, HS the head size, 32, 64 or 128): Q, K, V tiles bf16 (64 x HS, row
// stride HS + 8), S f32 (64 x 64, stride 68), P bf16 (64 x 64, stride 72), the row-index
// matrix and the rows' alphas; at the end O f32 (64 x HS, stride HS + 4) over K and V. Every
// WMMA pointer is 32-byte aligned and every leading dimension a multiple of 8 (bf16) or 4
// (f32), as WMMA requires; each row stride is 16 bytes past a multiple of 128, so the 8 rows
// of a WMMA load's 8 x 16-byte pieces, and the rows the softmax threads read at once, fall in
// different banks (HS + 16 and 72 put rows 4 apart in one bank).
//
// The grid's x runs over the tiles of one (batch, head), the longest-running first: query
// tiles from the last (the forward and dQ), key tiles from the first (dK and dV).
//
// This file holds only the kernels, so that they can be compiled on the host over an emulation
// of the CUDA built-ins they use (threadIdx, blockIdx, gridDim, __syncthreads, __syncwarp,
// __shfl_xor_sync, wmma, the bf16 conversions; an accumulator's num_elements and x[]) to run
// its arithmetic without a GPU (tests/kernels/flash_attention_emulated_test.cpp). The includer
// provides the wmma namespace and, for each E, Operand<E> in this namespace: static float
// load(uint16_t bits), static uint16_t store(float) (round to nearest even, NaN kept),
// static E round(float) (the same rounding, as an operand) and static constexpr int kMinArch
// (the oldest __CUDA_ARCH__ with WMMA on E).
#pragma once

#include "kernels/cuda/flash_kernel_common.cuh"

namespace paratrain::kernels::cuda::flash {
// Internal linkage: each includer (flash_attention.cu, and the CPU emulation in
// tests/kernels/flash_attention_emulated_test.cpp) has its own kernels, never the other's.
namespace {

using flash_common::last_tile_first;

// Whether a kernel for operands E has its body in this compilation: WMMA on E needs
// Operand<E>::kMinArch (f16: sm_70; bf16: sm_80, Ampere). Compiled for an older GPU (a build
// whose CMAKE_CUDA_ARCHITECTURES include 75) the bf16 kernels' bodies are left out, and
// flash_attention.cu never launches them on such a GPU (that shape of attention runs another
// form there). The host and the CPU emulation see every body.
template <typename E>
constexpr bool kHasBody =
#if defined(__CUDA_ARCH__)
    __CUDA_ARCH__ >= Operand<E>::kMinArch;
#else
    true;
#endif

constexpr int kRows = 64;     // query rows per block
constexpr int kKeys = 64;     // keys per tile
constexpr int kThreads = 128;  // 4 warps
// Row strides (elements) of the shared tiles, each 4 banks (16 bytes) past a multiple of 32
// banks, so that the rows a warp touches at once spread over the banks: f32 S (68), bf16 P (72).
constexpr int kLdS = kKeys + 4, kLdP = kKeys + 8;

template <int HS>
struct Layout {
  static constexpr int kLdQ = HS + 8, kLdO = HS + 4;  // bf16 Q/K/V rows, f32 O rows
  static constexpr int kQ = 0;                                   // bf16 offsets in bytes
  static constexpr int kK = kQ + kRows * kLdQ * 2;
  static constexpr int kV = kK + kKeys * kLdQ * 2;
  static constexpr int kS = kV + kKeys * kLdQ * 2;              // f32
  static constexpr int kP = kS + kRows * kLdS * 4;              // bf16
  static constexpr int kRowIndex = kP + kRows * kLdP * 2;       // f32 16 x 16: element (r, c) = r
  static constexpr int kAlpha = kRowIndex + 16 * 16 * 4;        // f32 64: each row's rescale
  static constexpr int kBytes = kAlpha + kRows * 4;
  static constexpr int kO = kK;  // f32 64 x HS at the end, over K and V (no longer read then)
  static_assert(kK % 32 == 0 && kV % 32 == 0 && kS % 32 == 0 && kP % 32 == 0 && kRowIndex % 32 == 0, "aligned parts");
  static_assert(kRows * kLdO * 4 <= kS - kK, "O fits over K and V");
};

// Rows [r0, r0 + 64) of a (B, T, row_stride) bf16 array, HS columns from `src` (which points at
// the first of them in row 0 of batch 0), into a bf16 tile with row stride ld; rows at or past
// T are zeros. 8 bf16 (16 bytes) per load.
template <int HS, typename E>
__device__ __forceinline__ void load_rows(E* tile, int ld, const uint16_t* src, int64_t row_stride,
                                          int64_t b, int64_t T, int64_t r0) {
  constexpr int kVecs = HS / 8;  // 16-byte vectors per row
  for (int e = threadIdx.x; e < kRows * kVecs; e += kThreads) {
    const int r = e / kVecs, c = (e % kVecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    const int64_t t = r0 + r;
    if (t < T) v = *reinterpret_cast<const uint4*>(src + (b * T + t) * row_stride + c);
    *reinterpret_cast<uint4*>(tile + r * ld + c) = v;
  }
}

// Rows [r0, r0 + 64) of head h's part (q, k or v: `part` 0, 1, 2) of qkv (B,T,3C) into a tile.
template <int HS, typename E>
__device__ __forceinline__ void load_tile(E* tile, int ld, const uint16_t* qkv, int64_t b, int64_t T,
                                          int64_t C, int h, int part, int64_t r0) {
  load_rows<HS>(tile, ld, qkv + part * C + h * HS, 3 * C, b, T, r0);
}

// acc[n] (the warp's 16 rows x HS) += M (its 16 rows of a bf16 64 x 64, stride kLdP) Y (bf16
// 64 x HS, stride ld). k outside n: each fragment of M is loaded once; each acc[n] still adds
// its k products in order.
template <int HS, typename E>
__device__ __forceinline__ void accumulate_product(wmma::fragment<wmma::accumulator, 16, 16, 16, float>* acc,
                                                   const E* M, const E* Y, int ld, int warp) {
  for (int k = 0; k < kKeys / 16; ++k) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a;
    wmma::load_matrix_sync(a, M + (warp * 16) * kLdP + k * 16, kLdP);
    for (int n = 0; n < HS / 16; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> y;
      wmma::load_matrix_sync(y, Y + (k * 16) * ld + n * 16, ld);
      wmma::mma_sync(acc[n], a, y, acc[n]);
    }
  }
}

template <int HS, typename E>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C, int NH,
                         float scale) {
  if constexpr (kHasBody<E>) {
    using L = Layout<HS>;
    extern __shared__ __align__(128) unsigned char smem[];
    auto* Qs = reinterpret_cast<E*>(smem + L::kQ);
    auto* Ks = reinterpret_cast<E*>(smem + L::kK);
    auto* Vs = reinterpret_cast<E*>(smem + L::kV);
    auto* Ss = reinterpret_cast<float*>(smem + L::kS);
    auto* Ps = reinterpret_cast<E*>(smem + L::kP);
    auto* Os = reinterpret_cast<float*>(smem + L::kO);
    auto* row_index = reinterpret_cast<float*>(smem + L::kRowIndex);
    auto* alpha_s = reinterpret_cast<float*>(smem + L::kAlpha);

    const int64_t q0 = static_cast<int64_t>(last_tile_first()) * kRows;
    const int64_t bh = blockIdx.y, b = bh / NH;
    const int h = static_cast<int>(bh % NH);
    const int warp = threadIdx.x / 32;
    const int row = threadIdx.x / 2, half = threadIdx.x % 2;  // the softmax's row and half of it
    const int64_t q = q0 + row;

    load_tile<HS>(Qs, L::kLdQ, qkv, b, T, C, h, 0, q0);
    for (int e = threadIdx.x; e < 16 * 16; e += kThreads) row_index[e] = static_cast<float>(e / 16);
    float m = -INFINITY, l = 0.0f;  // the row's running max and sum (both threads of a row)

    // The warp's 16 query rows as WMMA operands, loaded once for every key tile; its output rows
    // O (16 x HS) as accumulators in registers across the tiles. The row of an accumulator's
    // element is that element of `rows`, the 16 x 16 matrix (r, c) = r loaded as one: fragments
    // of one type share one (unspecified) mapping of elements to lanes.
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> qf[HS / 16];
    for (int k = 0; k < HS / 16; ++k) wmma::load_matrix_sync(qf[k], Qs + (warp * 16) * L::kLdQ + k * 16, L::kLdQ);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[HS / 16], rows;
    wmma::load_matrix_sync(rows, row_index, 16, wmma::mem_row_major);
    for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(o[n], 0.0f);

    const int64_t key_end = q0 + kRows < T ? q0 + kRows : T;  // keys past the block's last row are masked
    for (int64_t k0 = 0; k0 < key_end; k0 += kKeys) {
      __syncthreads();  // every warp's previous P V is done with K and V
      load_tile<HS>(Ks, L::kLdQ, qkv, b, T, C, h, 1, k0);
      load_tile<HS>(Vs, L::kLdQ, qkv, b, T, C, h, 2, k0);
      __syncthreads();

      // 2. S (16 x 64 per warp) = Q K^T
      for (int n = 0; n < kKeys / 16; ++n) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < HS / 16; ++k) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> kt;  // K^T: K row-major
          wmma::load_matrix_sync(kt, Ks + (n * 16) * L::kLdQ + k * 16, L::kLdQ);
          wmma::mma_sync(acc, qf[k], kt, acc);
        }
        wmma::store_matrix_sync(Ss + (warp * 16) * kLdS + n * 16, acc, kLdS, wmma::mem_row_major);
      }
      __syncwarp();  // the softmax of a row is its warp's (row / 16 == warp): S stays in the warp

      // 3. the online softmax of row `row`, keys 2j + half (j < 32) of the tile: the two threads
      //    of a row take alternate columns, so a warp's reads spread over the banks
      float s[32];
      float tile_max = -INFINITY;
      for (int j = 0; j < 32; ++j) {
        const int c = 2 * j + half;
        const int64_t key = k0 + c;
        s[j] = key <= q && key < T ? Ss[row * kLdS + c] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[j]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float m_new = fmaxf(m, tile_max);
      // A row with no key yet (past T, or nothing unmasked so far) keeps m = -inf and adds 0.
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);
      float sum = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float p = m_new == -INFINITY ? 0.0f : expf(s[j] - m_new);
        sum += p;
        Ps[row * kLdP + 2 * j + half] = Operand<E>::round(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l = l * alpha + sum;
      m = m_new;
      if (half == 0) alpha_s[row] = alpha;
      __syncwarp();  // P's rows and alphas are the warp's own

      // 4. O (16 x HS per warp) = alpha O + P V: each element scaled by its row's alpha
      for (int n = 0; n < HS / 16; ++n)
        for (int i = 0; i < o[n].num_elements; ++i) o[n].x[i] *= alpha_s[warp * 16 + static_cast<int>(rows.x[i])];
      accumulate_product<HS>(o, Ps, Vs, L::kLdQ, warp);
    }
    __syncthreads();  // every warp is done with K and V: O is staged over them
    for (int n = 0; n < HS / 16; ++n)
      wmma::store_matrix_sync(Os + (warp * 16) * L::kLdO + n * 16, o[n], L::kLdO, wmma::mem_row_major);
    __syncthreads();

    // out (B,T,C) at [b, q, h*HS + d] = O / l, rounded to bf16; lse = m + log l
    if (q < T) {
      const float inv = 1.0f / l;
      uint16_t* dst = out + (b * T + q) * C + h * HS;
      for (int d = half; d < HS; d += 2) dst[d] = Operand<E>::store(Os[row * L::kLdO + d] * inv);
      if (half == 0 && lse) lse[bh * T + q] = m + logf(l);
    }
  }  // kHasBody<E>
}

// ---- backward ----
// Two kernels, so that every element of dqkv has one writer (no atomics: the same bits every
// run), each recomputing P = exp(scale S - lse) and dP = dO V^T from the forward's lse, 16
// columns at a time in WMMA accumulators (an element's row and column from ElementIndex),
// writing P and dS as bf16 to shared memory for the products:
//   keys:    a block per 64 keys of one (batch, head), warp w owning keys 16w..16w+15, over the
//            query tiles from the diagonal on: S^T = K Q^T and dP^T = V dO^T (WMMA), then
//            P^T and dS^T = P^T (dP^T - D) rounded to bf16, then dV += P^T dO and
//            dK += dS^T Q in WMMA accumulators held across the loop; dqkv's k, v parts +=
//            scale dK, dV;
//   queries: a block per 64 queries, warp w owning queries 16w..16w+15, over the key tiles up
//            to the diagonal: S = Q K^T, dP = dO V^T, dS = P (dP - D) rounded to bf16,
//            dQ += dS K; dqkv's q part += scale dQ.
// D = rowsum(dO * O) per query row comes first (flash_common::rowdot_kernel, f32).

template <int HS>
struct BackwardLayout {
  static constexpr int kLdT = HS + 8, kLdA = HS + 4;            // bf16 tiles; f32 results
  static constexpr int kTileBytes = kRows * kLdT * 2;
  static constexpr int kA = 0, kB = kA + kTileBytes, kC = kB + kTileBytes, kD = kC + kTileBytes;  // 4 bf16 tiles
  static constexpr int kP16 = kD + kTileBytes;                   // bf16 64 x 64
  static constexpr int kdS16 = kP16 + kRows * kLdP * 2;          // bf16 64 x 64
  static constexpr int kIndex = kdS16 + kRows * kLdP * 2;        // f32 16 x 16 twice: (r, c) = r, then = c
  static constexpr int kRowStats = kIndex + 2 * 16 * 16 * 4;     // f32 lse[64], D[64]
  static constexpr int kBytes = kRowStats + 2 * kRows * 4;
  static constexpr int kAcc = kA;  // f32 64 x HS staging of the result at the end, over the tiles
  static_assert(kP16 % 32 == 0 && kdS16 % 32 == 0 && kIndex % 32 == 0, "aligned");
  static_assert(kRows * kLdA * 4 <= kP16, "the staging fits over the tiles");
};

// dqkv[part] (B,T,3C) rows [r0, r0 + 64) of head h += scale * acc (f32 64 x HS, stride ld).
template <int HS, typename E>
__device__ __forceinline__ void add_tile(uint16_t* dqkv, const float* acc, int ld, float scale, int64_t b, int64_t T,
                                         int64_t C, int h, int part, int64_t r0) {
  for (int e = threadIdx.x; e < kRows * HS; e += kThreads) {
    const int r = e / HS, d = e % HS;
    const int64_t t = r0 + r;
    if (t >= T) continue;
    uint16_t* x = dqkv + (b * T + t) * 3 * C + part * C + h * HS + d;
    *x = Operand<E>::store(Operand<E>::load(*x) + scale * acc[r * ld + d]);
  }
}

// The warp's 16 rows of a bf16 64 x HS tile (stride ld) that stays in shared memory for the
// whole kernel, as the A operands of X Y^T (HS / 16 fragments): held in registers for HS = 64,
// loaded once; for HS = 128 read from shared memory at each use (the keys kernel already uses
// every register there). init after the tile is in shared memory and the block has synced.
// (Frag's completeness is a question for instantiation, which only the kernels' bodies do: an
// sm_75 pass has no bf16 fragments.)
template <int HS, typename E>
struct RowOperand {
  using Frag = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
  static constexpr bool kInRegisters = HS <= 64;
  Frag held[kInRegisters ? HS / 16 : 1];
  const E* rows = nullptr;  // the warp's first row
  int ld = 0;
  __device__ __forceinline__ void init(const E* tile, int ld_, int warp) {
    rows = tile + (warp * 16) * ld_, ld = ld_;
    if constexpr (kInRegisters)
      for (int k = 0; k < HS / 16; ++k) wmma::load_matrix_sync(held[k], rows + k * 16, ld);
  }
  // Columns 16k .. 16k + 15: the held fragment, or `scratch` loaded with them.
  __device__ __forceinline__ const Frag& get(int k, Frag& scratch) const {
    if constexpr (kInRegisters) {
      return held[k];
    } else {
      wmma::load_matrix_sync(scratch, rows + k * 16, ld);
      return scratch;
    }
  }
};

// Columns 16n .. 16n + 15 of the warp's 16 rows of X Y^T: X the warp's rows of a bf16 64 x HS
// tile, Y a bf16 64 x HS tile (stride ld), into an f32 accumulator.
template <int HS, typename E>
__device__ __forceinline__ void product_block(wmma::fragment<wmma::accumulator, 16, 16, 16, float>& acc,
                                              const RowOperand<HS, E>& X, const E* Y, int ld, int n) {
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < HS / 16; ++k) {
    typename RowOperand<HS, E>::Frag scratch;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> bt;
    wmma::load_matrix_sync(bt, Y + (n * 16) * ld + k * 16, ld);
    wmma::mma_sync(acc, X.get(k, scratch), bt, acc);
  }
}

// Where each element of a 16 x 16 f32 accumulator sits: fragments of one type share one
// (unspecified) mapping of elements to lanes, so the matrices (r, c) = r and (r, c) = c, loaded
// as accumulators, give every element's row and column. `index` is shared memory for the two
// (2 x 256 floats, 32-byte aligned); the block syncs between fill and load.
struct ElementIndex {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> row, col;
  __device__ __forceinline__ static void fill(float* index) {
    for (int e = threadIdx.x; e < 2 * 256; e += kThreads)
      index[e] = static_cast<float>(e < 256 ? e / 16 : (e - 256) % 16);
  }
  __device__ __forceinline__ void load(const float* index) {
    wmma::load_matrix_sync(row, index, 16, wmma::mem_row_major);
    wmma::load_matrix_sync(col, index + 256, 16, wmma::mem_row_major);
  }
  __device__ __forceinline__ int row_of(int i) const { return static_cast<int>(row.x[i]); }
  __device__ __forceinline__ int col_of(int i) const { return static_cast<int>(col.x[i]); }
};

template <int HS>
__device__ __forceinline__ void store_rows(float* stage, int ld,
                                           wmma::fragment<wmma::accumulator, 16, 16, 16, float>* acc, int warp) {
  for (int n = 0; n < HS / 16; ++n)
    wmma::store_matrix_sync(stage + (warp * 16) * ld + n * 16, acc[n], ld, wmma::mem_row_major);
}

// The query side of a tile for the backward: dO's rows [q0, q0 + 64) of head h (from dout
// (B,T,C), zero past T) into a bf16 tile of stride ld, and those rows' lse and D (0 past T).
template <int HS, typename E>
__device__ __forceinline__ void load_query_rows(E* dOs, int ld, float* lse_s, float* D_s,
                                                const uint16_t* dout, const float* lse, const float* D, int64_t b,
                                                int64_t bh, int64_t T, int64_t C, int h, int64_t q0) {
  load_rows<HS>(dOs, ld, dout + h * HS, C, b, T, q0);
  if (threadIdx.x < kRows) {
    const int64_t q = q0 + threadIdx.x;
    lse_s[threadIdx.x] = q < T ? lse[bh * T + q] : 0.0f;
    D_s[threadIdx.x] = q < T ? D[bh * T + q] : 0.0f;
  }
}

// A block per (64 keys, batch-head): dK and dV. Key tiles in index order: the first has the most
// query tiles after it.
template <int HS, typename E>
__global__ void __launch_bounds__(kThreads)
    flash_backward_keys_kernel(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse,
                               const float* D, int64_t B, int64_t T, int64_t C, int NH, float scale) {
  if constexpr (kHasBody<E>) {
    using L = BackwardLayout<HS>;
    extern __shared__ __align__(128) unsigned char smem[];
    auto* Ks = reinterpret_cast<E*>(smem + L::kA);
    auto* Vs = reinterpret_cast<E*>(smem + L::kB);
    auto* Qs = reinterpret_cast<E*>(smem + L::kC);
    auto* dOs = reinterpret_cast<E*>(smem + L::kD);
    auto* Pt16 = reinterpret_cast<E*>(smem + L::kP16);
    auto* dSt16 = reinterpret_cast<E*>(smem + L::kdS16);
    auto* index = reinterpret_cast<float*>(smem + L::kIndex);
    auto* lse_s = reinterpret_cast<float*>(smem + L::kRowStats);
    float* D_s = lse_s + kRows;
    auto* stage = reinterpret_cast<float*>(smem + L::kAcc);

    const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKeys;
    const int64_t bh = blockIdx.y, b = bh / NH;
    const int h = static_cast<int>(bh % NH);
    const int warp = threadIdx.x / 32;

    load_tile<HS>(Ks, L::kLdT, qkv, b, T, C, h, 1, k0);
    load_tile<HS>(Vs, L::kLdT, qkv, b, T, C, h, 2, k0);
    ElementIndex::fill(index);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dK[HS / 16], dV[HS / 16];
    for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dK[n], 0.0f), wmma::fill_fragment(dV[n], 0.0f);
    __syncthreads();
    RowOperand<HS, E> k_rows, v_rows;  // the warp's keys and values, for every query tile
    k_rows.init(Ks, L::kLdT, warp);
    v_rows.init(Vs, L::kLdT, warp);
    ElementIndex at;
    at.load(index);

    for (int64_t q0 = k0; q0 < T; q0 += kRows) {  // query tiles from the diagonal (kRows == kKeys)
      __syncthreads();  // every warp's previous products are done with Q and dO
      load_tile<HS>(Qs, L::kLdT, qkv, b, T, C, h, 0, q0);
      load_query_rows<HS>(dOs, L::kLdT, lse_s, D_s, dout, lse, D, b, bh, T, C, h, q0);
      __syncthreads();
      // The warp's keys i against 16 queries j at a time: S^T = K Q^T and dP^T = V dO^T in
      // accumulators, then P^T and dS^T = P^T (dP^T - D) rounded to bf16 into shared memory.
      for (int n = 0; n < kRows / 16; ++n) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> st, dpt;
        product_block<HS>(st, k_rows, Qs, L::kLdT, n);
        product_block<HS>(dpt, v_rows, dOs, L::kLdT, n);
        for (int e = 0; e < st.num_elements; ++e) {
          const int i = warp * 16 + at.row_of(e), j = n * 16 + at.col_of(e);
          const int64_t key = k0 + i, q = q0 + j;
          float p = 0.0f, ds = 0.0f;
          if (key <= q && q < T) {
            p = expf(st.x[e] * scale - lse_s[j]);
            ds = p * (dpt.x[e] - D_s[j]);
          }
          Pt16[i * kLdP + j] = Operand<E>::round(p);
          dSt16[i * kLdP + j] = Operand<E>::round(ds);
        }
      }
      __syncwarp();  // the products read only the warp's own rows of P^T and dS^T
      accumulate_product<HS>(dV, Pt16, dOs, L::kLdT, warp);  // dV += P^T dO
      accumulate_product<HS>(dK, dSt16, Qs, L::kLdT, warp);  // dK += dS^T Q
    }
    __syncthreads();  // every warp is done with the tiles: the result is staged over them
    store_rows<HS>(stage, L::kLdA, dK, warp);
    __syncthreads();
    add_tile<HS, E>(dqkv, stage, L::kLdA, scale, b, T, C, h, 1, k0);
    __syncthreads();
    store_rows<HS>(stage, L::kLdA, dV, warp);
    __syncthreads();
    add_tile<HS, E>(dqkv, stage, L::kLdA, 1.0f, b, T, C, h, 2, k0);
  }  // kHasBody<E>
}

// A block per (64 queries, batch-head): dQ; the last query tile first (last_tile_first).
template <int HS, typename E>
__global__ void __launch_bounds__(kThreads)
    flash_backward_queries_kernel(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse,
                                  const float* D, int64_t B, int64_t T, int64_t C, int NH, float scale) {
  if constexpr (kHasBody<E>) {
    using L = BackwardLayout<HS>;
    extern __shared__ __align__(128) unsigned char smem[];
    auto* Qs = reinterpret_cast<E*>(smem + L::kA);
    auto* dOs = reinterpret_cast<E*>(smem + L::kB);
    auto* Ks = reinterpret_cast<E*>(smem + L::kC);
    auto* Vs = reinterpret_cast<E*>(smem + L::kD);
    auto* dS16 = reinterpret_cast<E*>(smem + L::kdS16);
    auto* index = reinterpret_cast<float*>(smem + L::kIndex);
    auto* lse_s = reinterpret_cast<float*>(smem + L::kRowStats);
    float* D_s = lse_s + kRows;
    auto* stage = reinterpret_cast<float*>(smem + L::kAcc);

    const int64_t q0 = static_cast<int64_t>(last_tile_first()) * kRows;
    const int64_t bh = blockIdx.y, b = bh / NH;
    const int h = static_cast<int>(bh % NH);
    const int warp = threadIdx.x / 32;

    load_tile<HS>(Qs, L::kLdT, qkv, b, T, C, h, 0, q0);
    load_query_rows<HS>(dOs, L::kLdT, lse_s, D_s, dout, lse, D, b, bh, T, C, h, q0);
    ElementIndex::fill(index);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dQ[HS / 16];
    for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dQ[n], 0.0f);
    __syncthreads();
    RowOperand<HS, E> q_rows, do_rows;  // the warp's queries and their dO, for every key tile
    q_rows.init(Qs, L::kLdT, warp);
    do_rows.init(dOs, L::kLdT, warp);
    ElementIndex at;
    at.load(index);

    const int64_t key_end = q0 + kRows < T ? q0 + kRows : T;
    for (int64_t k0 = 0; k0 < key_end; k0 += kKeys) {
      __syncthreads();  // every warp's previous dS K is done with K
      load_tile<HS>(Ks, L::kLdT, qkv, b, T, C, h, 1, k0);
      load_tile<HS>(Vs, L::kLdT, qkv, b, T, C, h, 2, k0);
      __syncthreads();
      // The warp's queries i against 16 keys j at a time: S = Q K^T and dP = dO V^T in
      // accumulators, then dS = P (dP - D) rounded to bf16 into shared memory.
      for (int n = 0; n < kKeys / 16; ++n) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf, dpf;
        product_block<HS>(sf, q_rows, Ks, L::kLdT, n);
        product_block<HS>(dpf, do_rows, Vs, L::kLdT, n);
        for (int e = 0; e < sf.num_elements; ++e) {
          const int i = warp * 16 + at.row_of(e), j = n * 16 + at.col_of(e);
          const int64_t q = q0 + i, key = k0 + j;
          float ds = 0.0f;
          if (key <= q && q < T) {
            const float p = expf(sf.x[e] * scale - lse_s[i]);
            ds = p * (dpf.x[e] - D_s[i]);
          }
          dS16[i * kLdP + j] = Operand<E>::round(ds);
        }
      }
      __syncwarp();  // dS K reads only the warp's own rows of dS
      accumulate_product<HS>(dQ, dS16, Ks, L::kLdT, warp);  // dQ += dS K
    }
    __syncthreads();  // every warp is done with the tiles: the result is staged over them
    store_rows<HS>(stage, L::kLdA, dQ, warp);
    __syncthreads();
    add_tile<HS, E>(dqkv, stage, L::kLdA, scale, b, T, C, h, 0, q0);
  }  // kHasBody<E>
}

}  // namespace
}  // namespace paratrain::kernels::cuda::flash
