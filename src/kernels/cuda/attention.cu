// Fused causal self-attention on CUDA, f32 and bf16 (kernels/cuda/layers.h; the contract,
// qkv (B,T,3C) / out (B,T,C) / lse (B,NH,T) layouts included, is kernels/cpu/attention.h).
// Flash-attention style: scores live only in 16 x 16 shared-memory tiles, never as a (T,T)
// matrix in global memory. bf16 q, k, v, out, dout and dqkv are read as f32 into shared
// memory; every product, softmax and sum is f32; a bf16 result is rounded once.
//
// Tiles: 16 query rows x 16 keys, a block of 256 threads, head size hs <= 128. Shared
// tiles have a row stride of hs + 1 (no bank conflicts on column walks). In a score tile,
// thread t owns entry (row t / 16, key t % 16); in an output tile (16 x hs) it owns the
// elements e = t + 256 k (row e / hs, column e % hs), k < 8, accumulated in registers.
//
// forward, a block per (query tile, b*NH + h): for key tiles 0..diagonal, S = scale Q K^T
//   (causal mask), online softmax per row (running max m and sum l, the 16 threads of a row
//   reduce with shuffles), O = O * exp(m_old - m_new) + P V; then out = O / l and
//   lse = m + log l.
// backward, two kernels, so that every element of dqkv has one writer (no atomics):
//   dK/dV, a block per (key tile, bh): for query tiles from the diagonal to the end,
//     P = exp(scale Q K^T - lse) (masked), dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D),
//     dV += P^T dO, dK += scale dS^T Q.
//   dQ, a block per (query tile, bh): for key tiles 0..diagonal, the same P and dS, and
//     dQ += scale dS K.
//   Each adds its sums to dqkv at the end (read, add in f32, write: +=).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/layer_io.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kTile = 16;                        // query rows = keys per tile
constexpr int kThreads = kTile * kTile;          // one thread per score of a tile
constexpr int kOwned = kTile * kAttnMaxHeadSize / kThreads;  // output elements per thread (8)
constexpr int kPs = kTile + 1;                   // row stride of score tiles

// Rows row0 .. row0+15 of a (rows, hs) slice with row stride `stride` into dst (row stride
// ld); rows at or past n are zeros.
template <typename T>
__device__ void load_tile(float* dst, int ld, const T* src, int64_t stride, int64_t row0, int64_t n, int hs) {
  for (int e = threadIdx.x; e < kTile * hs; e += kThreads) {
    const int r = e / hs, d = e % hs;
    const int64_t i = row0 + r;
    dst[r * ld + d] = i < n ? to_f32(src[i * stride + d]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += a[d] * b[d];
  return s;
}

// lse and D = rowsum(dO * O) of query rows q0 .. q0+15 (0 past T) into lse_s, D_s; warp w
// does rows 2w and 2w+1.
template <typename T>
__device__ void load_row_stats(float* lse_s, float* D_s, const float* lse_bh, const T* dout_bh, const T* out_bh,
                               int64_t q0, int64_t Tn, int64_t C, int hs) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = 2 * warp; r < 2 * warp + 2; ++r) {
    const int64_t i = q0 + r;
    float acc = 0.0f;
    if (i < Tn)
      for (int d = lane; d < hs; d += 32) acc += to_f32(dout_bh[i * C + d]) * to_f32(out_bh[i * C + d]);
    acc = detail::warp_sum(acc);
    if (lane == 0) {
      D_s[r] = acc;
      lse_s[r] = i < Tn ? lse_bh[i] : 0.0f;
    }
  }
}

// qkv, dqkv: (B,T,3C); out, dout: (B,T,C). Pointers to one (b, h): the q columns of qkv
// row 0 of batch b at h*hs, and so on; k and v at + C and + 2C.

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* out, float* lse, const T* qkv, int64_t Tn, int64_t C, int64_t NH, int hs,
                             float scale) {
  extern __shared__ float smem[];
  const int ld = hs + 1;
  float* Qs = smem;
  float* Ks = Qs + kTile * ld;
  float* Vs = Ks + kTile * ld;
  float* Ps = Vs + kTile * ld;
  float* alpha_s = Ps + kTile * kPs;
  float* l_s = alpha_s + kTile;

  const int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int qt = blockIdx.x;
  const int64_t q0 = static_cast<int64_t>(qt) * kTile, C3 = 3 * C;
  const T* q = qkv + b * Tn * C3 + h * hs;
  const T* k = q + C;
  const T* v = q + 2 * C;
  const int tid = threadIdx.x, sr = tid / kTile, sc = tid % kTile;
  const int64_t si = q0 + sr;
  const bool row_valid = si < Tn;

  load_tile(Qs, ld, q, C3, q0, Tn, hs);
  float m_run = -INFINITY, l_run = 0.0f;  // of row sr; the same in its 16 threads
  float acc[kOwned];
#pragma unroll
  for (int o = 0; o < kOwned; ++o) acc[o] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {  // keys 0 .. q0 + 15
    const int64_t k0 = static_cast<int64_t>(kt) * kTile;
    __syncthreads();  // the Q tile is in; the last tile's readers are done
    load_tile(Ks, ld, k, C3, k0, Tn, hs);
    load_tile(Vs, ld, v, C3, k0, Tn, hs);
    __syncthreads();
    const int64_t sj = k0 + sc;
    const float s = row_valid && sj <= si ? scale * dot(Qs + sr * ld, Ks + sc * ld, hs) : -INFINITY;
    const float m_new = fmaxf(m_run, detail::lanes_max<kTile>(s));
    const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
    const float alpha = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
    l_run = l_run * alpha + detail::lanes_sum<kTile>(p);
    m_run = m_new;
    Ps[sr * kPs + sc] = p;
    if (sc == 0) alpha_s[sr] = alpha;
    __syncthreads();
#pragma unroll
    for (int o = 0; o < kOwned; ++o) {
      const int e = tid + o * kThreads;
      if (e < kTile * hs) {
        const int r = e / hs, d = e % hs;
        float a = acc[o] * alpha_s[r];
        for (int c = 0; c < kTile; ++c) a += Ps[r * kPs + c] * Vs[c * ld + d];
        acc[o] = a;
      }
    }
  }
  if (sc == 0) {
    l_s[sr] = l_run;
    if (lse && row_valid) lse[bh * Tn + si] = m_run + logf(l_run);
  }
  __syncthreads();
  T* o_bh = out + b * Tn * C + h * hs;
#pragma unroll
  for (int o = 0; o < kOwned; ++o) {
    const int e = tid + o * kThreads;
    if (e < kTile * hs) {
      const int r = e / hs, d = e % hs;
      const int64_t i = q0 + r;
      if (i < Tn) o_bh[i * C + d] = from_f32<T>(acc[o] / l_s[r]);
    }
  }
}

// P and dS of score entry (sr, sc) of the tile (query rows q0.., keys k0..); 0 where masked.
__device__ __forceinline__ void recompute(float& p, float& ds, const float* Qs, const float* Ks, const float* dOs,
                                          const float* Vs, const float* lse_s, const float* D_s, int sr, int sc,
                                          int64_t q0, int64_t k0, int64_t Tn, int ld, int hs, float scale) {
  const int64_t i = q0 + sr, j = k0 + sc;
  p = 0.0f;
  ds = 0.0f;
  if (i < Tn && j <= i) {
    p = expf(scale * dot(Qs + sr * ld, Ks + sc * ld, hs) - lse_s[sr]);
    ds = p * (dot(dOs + sr * ld, Vs + sc * ld, hs) - D_s[sr]);
  }
}

template <typename T>
__device__ __forceinline__ void add_to(T* p, float v) {
  *p = from_f32<T>(to_f32(*p) + v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t Tn,
                                  int64_t C, int64_t NH, int hs, float scale) {
  extern __shared__ float smem[];
  const int ld = hs + 1;
  float* Ks = smem;
  float* Vs = Ks + kTile * ld;
  float* Qs = Vs + kTile * ld;
  float* dOs = Qs + kTile * ld;
  float* Ps = dOs + kTile * ld;
  float* dSs = Ps + kTile * kPs;
  float* lse_s = dSs + kTile * kPs;
  float* D_s = lse_s + kTile;

  const int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kt = blockIdx.x;
  const int64_t k0 = static_cast<int64_t>(kt) * kTile, C3 = 3 * C;
  const T* q = qkv + b * Tn * C3 + h * hs;
  const T* o_bh = out + b * Tn * C + h * hs;
  const T* do_bh = dout + b * Tn * C + h * hs;
  const float* lse_bh = lse + bh * Tn;
  const int tid = threadIdx.x, sr = tid / kTile, sc = tid % kTile;

  load_tile(Ks, ld, q + C, C3, k0, Tn, hs);
  load_tile(Vs, ld, q + 2 * C, C3, k0, Tn, hs);
  float dk[kOwned], dv[kOwned];
#pragma unroll
  for (int o = 0; o < kOwned; ++o) dk[o] = dv[o] = 0.0f;

  const int nqt = static_cast<int>((Tn + kTile - 1) / kTile);
  for (int qt = kt; qt < nqt; ++qt) {  // queries k0 .. T-1 (earlier ones do not see these keys)
    const int64_t q0 = static_cast<int64_t>(qt) * kTile;
    __syncthreads();
    load_tile(Qs, ld, q, C3, q0, Tn, hs);
    load_tile(dOs, ld, do_bh, C, q0, Tn, hs);
    load_row_stats(lse_s, D_s, lse_bh, do_bh, o_bh, q0, Tn, C, hs);
    __syncthreads();
    float p, ds;
    recompute(p, ds, Qs, Ks, dOs, Vs, lse_s, D_s, sr, sc, q0, k0, Tn, ld, hs, scale);
    Ps[sr * kPs + sc] = p;
    dSs[sr * kPs + sc] = ds;
    __syncthreads();
#pragma unroll
    for (int o = 0; o < kOwned; ++o) {
      const int e = tid + o * kThreads;
      if (e < kTile * hs) {
        const int c = e / hs, d = e % hs;  // key row c of the tile, column d
        float sv = 0.0f, sk = 0.0f;
        for (int r = 0; r < kTile; ++r) {
          sv += Ps[r * kPs + c] * dOs[r * ld + d];
          sk += dSs[r * kPs + c] * Qs[r * ld + d];
        }
        dv[o] += sv;
        dk[o] += sk;
      }
    }
  }
  T* dq_b = dqkv + b * Tn * C3 + h * hs;
#pragma unroll
  for (int o = 0; o < kOwned; ++o) {
    const int e = tid + o * kThreads;
    if (e < kTile * hs) {
      const int c = e / hs, d = e % hs;
      const int64_t j = k0 + c;
      if (j < Tn) {
        add_to(dq_b + j * C3 + C + d, scale * dk[o]);
        add_to(dq_b + j * C3 + 2 * C + d, dv[o]);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t Tn,
                                 int64_t C, int64_t NH, int hs, float scale) {
  extern __shared__ float smem[];
  const int ld = hs + 1;
  float* Qs = smem;
  float* dOs = Qs + kTile * ld;
  float* Ks = dOs + kTile * ld;
  float* Vs = Ks + kTile * ld;
  float* dSs = Vs + kTile * ld;
  float* lse_s = dSs + kTile * kPs;
  float* D_s = lse_s + kTile;

  const int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int qt = blockIdx.x;
  const int64_t q0 = static_cast<int64_t>(qt) * kTile, C3 = 3 * C;
  const T* q = qkv + b * Tn * C3 + h * hs;
  const T* do_bh = dout + b * Tn * C + h * hs;
  const int tid = threadIdx.x, sr = tid / kTile, sc = tid % kTile;

  load_tile(Qs, ld, q, C3, q0, Tn, hs);
  load_tile(dOs, ld, do_bh, C, q0, Tn, hs);
  load_row_stats(lse_s, D_s, lse + bh * Tn, do_bh, out + b * Tn * C + h * hs, q0, Tn, C, hs);
  float dq[kOwned];
#pragma unroll
  for (int o = 0; o < kOwned; ++o) dq[o] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kTile;
    __syncthreads();
    load_tile(Ks, ld, q + C, C3, k0, Tn, hs);
    load_tile(Vs, ld, q + 2 * C, C3, k0, Tn, hs);
    __syncthreads();
    float p, ds;
    recompute(p, ds, Qs, Ks, dOs, Vs, lse_s, D_s, sr, sc, q0, k0, Tn, ld, hs, scale);
    dSs[sr * kPs + sc] = ds;
    __syncthreads();
#pragma unroll
    for (int o = 0; o < kOwned; ++o) {
      const int e = tid + o * kThreads;
      if (e < kTile * hs) {
        const int r = e / hs, d = e % hs;
        float s = 0.0f;
        for (int c = 0; c < kTile; ++c) s += dSs[r * kPs + c] * Ks[c * ld + d];
        dq[o] += s;
      }
    }
  }
  T* dq_b = dqkv + b * Tn * C3 + h * hs;
#pragma unroll
  for (int o = 0; o < kOwned; ++o) {
    const int e = tid + o * kThreads;
    if (e < kTile * hs) {
      const int r = e / hs, d = e % hs;
      const int64_t i = q0 + r;
      if (i < Tn) add_to(dq_b + i * C3 + d, scale * dq[o]);
    }
  }
}

// Checks the sizes (InputError, as the CPU kernel, plus the limits of these kernels);
// returns the head size, or 0 when there is nothing to do (B or T is 0).
int check(int64_t B, int64_t Tn, int64_t C, int64_t NH, const char* who) {
  if (B < 0 || Tn < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    PT_THROW(InputError, who, " (cuda): bad sizes B=", B, " T=", Tn, " C=", C, " NH=", NH,
             " (C must be a positive multiple of NH)");
  const int64_t hs = C / NH;
  if (hs > kAttnMaxHeadSize)
    PT_THROW(InputError, who, " (cuda): head size C/NH=", hs, " is more than the ", kAttnMaxHeadSize,
             " these kernels support");
  if (B * NH > 65535)
    PT_THROW(InputError, who, " (cuda): B*NH=", B * NH, " is more than 65535 (the grid's y limit)");
  return B == 0 || Tn == 0 ? 0 : static_cast<int>(hs);
}

dim3 grid(int64_t B, int64_t Tn, int64_t NH) {
  return dim3(detail::ceil_div(Tn, kTile), static_cast<unsigned>(B * NH));
}

template <typename T>
void forward(T* out, float* lse, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  const int hs = check(B, Tn, C, NH, "attention_forward");
  if (hs == 0) return;
  const size_t smem = sizeof(float) * (3 * kTile * (hs + 1) + kTile * kPs + 2 * kTile);
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  attention_forward_kernel<T><<<grid(B, Tn, NH), kThreads, smem, detail::stream()>>>(out, lse, qkv, Tn, C, NH,
                                                                                          hs, scale);
  PT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t Tn, int64_t C,
              int64_t NH) {
  const int hs = check(B, Tn, C, NH, "attention_backward");
  if (hs == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const cudaStream_t s = detail::stream();
  const size_t smem_dkv = sizeof(float) * (4 * kTile * (hs + 1) + 2 * kTile * kPs + 2 * kTile);
  attention_backward_dkv_kernel<T>
      <<<grid(B, Tn, NH), kThreads, smem_dkv, s>>>(dqkv, dout, qkv, out, lse, Tn, C, NH, hs, scale);
  PT_CUDA_CHECK_LAUNCH();
  const size_t smem_dq = sizeof(float) * (4 * kTile * (hs + 1) + kTile * kPs + 2 * kTile);
  attention_backward_dq_kernel<T>
      <<<grid(B, Tn, NH), kThreads, smem_dq, s>>>(dqkv, dout, qkv, out, lse, Tn, C, NH, hs, scale);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  forward(out, lse, qkv, B, T, C, NH);
}

void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C,
                            int64_t NH) {
  forward(reinterpret_cast<__nv_bfloat16*>(out), lse, reinterpret_cast<const __nv_bfloat16*>(qkv), B, T, C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t C, int64_t NH) {
  backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

void attention_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                             const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  using BF = __nv_bfloat16;
  backward(reinterpret_cast<BF*>(dqkv), reinterpret_cast<const BF*>(dout), reinterpret_cast<const BF*>(qkv),
           reinterpret_cast<const BF*>(out), lse, B, T, C, NH);
}

}  // namespace paratrain::kernels::cuda
