// The device passes of the CUDA conv2d and max-pool (their launches: conv_kernels.cu; their
// layouts and contracts: conv_kernels.h): grid-stride kernels with int64 indices, and the bias
// gradient's block per channel. E is the includer's element rules (E::S the stored type,
// E::load widening to f32 exactly, E::store rounding once, the CPU's rules); im2col and the
// channel-major copy of dout move E::S unchanged.
//
// This file holds only the kernels, so that they compile on the host over an emulation of the
// CUDA built-ins they use (threadIdx, blockIdx, blockDim, gridDim, INFINITY) and of block_sum
// (the includer's, in this namespace), as tests/kernels/conv_emulated_test.cpp does, to check
// them without a GPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/conv_kernels.h"
#include "kernels/cuda/grid_stride.cuh"
#include "paratrain/kernels/cpu/conv.h"

namespace paratrain::kernels::cuda::conv_detail {
namespace {

constexpr int kBiasThreads = 256;  // bias_grad_kernel's block (a multiple of 32, for block_sum)

using detail::grid_first;
using detail::grid_step;

template <typename E>
__global__ void im2col_kernel(typename E::S* col, const typename E::S* inp, int64_t cnt, Geom g) {
  const int64_t L = g.Ho * g.Wo, cols = cnt * L, K = g.K;
  for (int64_t e = grid_first(); e < g.Ci * K * K * cols; e += grid_step()) {
    const int64_t r = e / cols, rem = e % cols, i = rem / L, l = rem % L;
    const int64_t kw = r % K, kh = (r / K) % K, ci = r / (K * K);
    const int64_t ih = (l / g.Wo) * g.stride - g.pad + kh, iw = (l % g.Wo) * g.stride - g.pad + kw;
    col[e] = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) ? inp[((i * g.Ci + ci) * g.H + ih) * g.W + iw]
                                                          : typename E::S{};
  }
}

template <typename E>
__global__ void col2im_add_kernel(typename E::S* dinp, const float* dcol, int64_t cnt, Geom g) {
  const int64_t H = g.H, W = g.W, K = g.K, stride = g.stride, pad = g.pad;
  const int64_t L = g.Ho * g.Wo, cols = cnt * L;
  for (int64_t e = grid_first(); e < cnt * g.Ci * H * W; e += grid_step()) {
    const int64_t iw = e % W, ih = (e / W) % H, ci = (e / (H * W)) % g.Ci, i = e / (g.Ci * H * W);
    float d = E::load(dinp[e]);
    for (int64_t kh = 0; kh < K; ++kh) {
      const int64_t th = ih + pad - kh;  // = oh * stride for the output row that reads ih at tap kh
      if (th < 0) break;                 // only smaller for larger kh
      if (th % stride != 0 || th / stride >= g.Ho) continue;
      const int64_t oh = th / stride;
      for (int64_t kw = 0; kw < K; ++kw) {
        const int64_t tw = iw + pad - kw;
        if (tw < 0) break;
        if (tw % stride != 0 || tw / stride >= g.Wo) continue;
        d += dcol[((ci * K + kh) * K + kw) * cols + i * L + oh * g.Wo + tw / stride];
      }
    }
    dinp[e] = E::store(d);
  }
}

template <typename E>
__global__ void out_from_channel_major_kernel(typename E::S* out, const float* cm, const typename E::S* bias,
                                              int64_t cnt, int64_t Co, int64_t L) {
  const int64_t cols = cnt * L;
  for (int64_t e = grid_first(); e < cnt * Co * L; e += grid_step()) {
    const int64_t i = e / (Co * L), co = (e / L) % Co, l = e % L;
    float v = cm[co * cols + i * L + l];
    if (bias) v += E::load(bias[co]);  // no "+ 0" without a bias: -0 stays -0, as on the CPU
    out[e] = E::store(v);
  }
}

template <typename E>
__global__ void channel_major_from_kernel(typename E::S* cm, const typename E::S* dout, int64_t cnt, int64_t Co,
                                          int64_t L) {
  const int64_t cols = cnt * L;
  for (int64_t e = grid_first(); e < Co * cols; e += grid_step()) {
    const int64_t co = e / cols, rem = e % cols, i = rem / L, l = rem % L;
    cm[e] = dout[(i * Co + co) * L + l];
  }
}

// A block of kBiasThreads per channel co.
template <typename E>
__global__ void bias_grad_kernel(typename E::S* dbias, const typename E::S* dout, int64_t N, int64_t Co, int64_t L) {
  const int64_t co = blockIdx.x;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < N * L; j += blockDim.x) {
    const int64_t n = j / L, l = j % L;
    s += E::load(dout[(n * Co + co) * L + l]);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) dbias[co] = E::store(E::load(dbias[co]) + s);
}

template <typename E>
__global__ void maxpool_forward_kernel(typename E::S* out, int32_t* argmax, const typename E::S* inp, int64_t N,
                                       int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride, int64_t pad,
                                       int64_t Ho, int64_t Wo) {
  for (int64_t e = grid_first(); e < N * C * Ho * Wo; e += grid_step()) {
    const int64_t ow = e % Wo, oh = (e / Wo) % Ho, p = e / (Ho * Wo);
    const typename E::S* x = inp + p * H * W;
    float m;
    int64_t am;
    cpu::maxpool_window([x](int64_t i) { return E::load(x[i]); }, H, W, K, stride, pad, oh, ow, m, am);
    out[e] = E::store(m);  // exact: m is one of the inputs (or -inf)
    argmax[e] = static_cast<int32_t>(am);
  }
}

template <typename E>
__global__ void maxpool_backward_planes_kernel(float* d, const typename E::S* dout, const int32_t* argmax,
                                               int64_t planes, int64_t HW, int64_t HoWo) {
  for (int64_t p = grid_first(); p < planes; p += grid_step()) {
    float* dp = d + p * HW;
    const typename E::S* g = dout + p * HoWo;
    const int32_t* a = argmax + p * HoWo;
    for (int64_t i = 0; i < HoWo; ++i)
      if (a[i] >= 0) dp[a[i]] += E::load(g[i]);
  }
}

}  // namespace
}  // namespace paratrain::kernels::cuda::conv_detail
