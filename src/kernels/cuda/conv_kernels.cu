// The device passes of the CUDA conv2d and max-pool (conv_kernels.h): im2col, the gather
// col2im, the channel-major <-> image-major copies (with the bias), the bias gradient and
// the max-pool scans. Grid-stride loops (launch.h) with int64 indices; T loads are exact
// widenings to f32, T stores round once (Elem<T>, the CPU's rules); im2col and the
// channel-major copy of dout move T's bits unchanged.
#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/conv_kernels.h"
#include "kernels/cuda/launch.h"

namespace paratrain::kernels::cuda::conv_detail {
namespace {

using detail::Elem;
using detail::launch_each;

template <DType T>
using S = typename Elem<T>::S;

constexpr int kBiasThreads = 256;

template <DType T>
__global__ void bias_grad_kernel(S<T>* dbias, const S<T>* dout, int64_t N, int64_t Co, int64_t L) {
  const int64_t co = blockIdx.x;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < N * L; j += blockDim.x) {
    const int64_t n = j / L, l = j % L;
    s += Elem<T>::load(dout[(n * Co + co) * L + l]);
  }
  s = detail::block_sum(s);
  if (threadIdx.x == 0) dbias[co] = Elem<T>::store(Elem<T>::load(dbias[co]) + s);
}

}  // namespace

template <DType T>
void im2col(void* col_v, const void* inp_v, int64_t cnt, const Geom& g) {
  auto* col = static_cast<S<T>*>(col_v);
  const auto* inp = static_cast<const S<T>*>(inp_v);
  const int64_t Ci = g.Ci, H = g.H, W = g.W, K = g.K, stride = g.stride, pad = g.pad, Wo = g.Wo;
  const int64_t L = g.Ho * g.Wo, cols = cnt * L;
  launch_each(g.Ci * g.K * g.K * cols, "conv2d im2col", [=] __device__(int64_t e) {
    const int64_t r = e / cols, rem = e % cols, i = rem / L, l = rem % L;
    const int64_t kw = r % K, kh = (r / K) % K, ci = r / (K * K);
    const int64_t ih = (l / Wo) * stride - pad + kh, iw = (l % Wo) * stride - pad + kw;
    col[e] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? inp[((i * Ci + ci) * H + ih) * W + iw] : S<T>{};
  });
}

template <DType T>
void col2im_add(void* dinp_v, const float* dcol, int64_t cnt, const Geom& g) {
  auto* dinp = static_cast<S<T>*>(dinp_v);
  const int64_t Ci = g.Ci, H = g.H, W = g.W, K = g.K, stride = g.stride, pad = g.pad, Ho = g.Ho, Wo = g.Wo;
  const int64_t L = g.Ho * g.Wo, cols = cnt * L;
  launch_each(cnt * g.Ci * g.H * g.W, "conv2d col2im", [=] __device__(int64_t e) {
    const int64_t iw = e % W, ih = (e / W) % H, ci = (e / (H * W)) % Ci, i = e / (Ci * H * W);
    float d = Elem<T>::load(dinp[e]);
    for (int64_t kh = 0; kh < K; ++kh) {
      const int64_t th = ih + pad - kh;  // = oh * stride for the output row that reads ih at tap kh
      if (th < 0) break;                 // only smaller for larger kh
      if (th % stride != 0 || th / stride >= Ho) continue;
      const int64_t oh = th / stride;
      for (int64_t kw = 0; kw < K; ++kw) {
        const int64_t tw = iw + pad - kw;
        if (tw < 0) break;
        if (tw % stride != 0 || tw / stride >= Wo) continue;
        d += dcol[((ci * K + kh) * K + kw) * cols + i * L + oh * Wo + tw / stride];
      }
    }
    dinp[e] = Elem<T>::store(d);
  });
}

template <DType T>
void out_from_channel_major(void* out_v, const float* cm, const void* bias_v, int64_t cnt, int64_t Co, int64_t L) {
  auto* out = static_cast<S<T>*>(out_v);
  const auto* bias = static_cast<const S<T>*>(bias_v);
  const int64_t cols = cnt * L;
  launch_each(cnt * Co * L, "conv2d forward", [=] __device__(int64_t e) {
    const int64_t i = e / (Co * L), co = (e / L) % Co, l = e % L;
    float v = cm[co * cols + i * L + l];
    if (bias) v += Elem<T>::load(bias[co]);  // no "+ 0" without a bias: -0 stays -0, as on the CPU
    out[e] = Elem<T>::store(v);
  });
}

template <DType T>
void channel_major_from(void* cm_v, const void* dout_v, int64_t cnt, int64_t Co, int64_t L) {
  auto* cm = static_cast<S<T>*>(cm_v);
  const auto* dout = static_cast<const S<T>*>(dout_v);
  const int64_t cols = cnt * L;
  launch_each(Co * cols, "conv2d backward", [=] __device__(int64_t e) {
    const int64_t co = e / cols, rem = e % cols, i = rem / L, l = rem % L;
    cm[e] = dout[(i * Co + co) * L + l];
  });
}

template <DType T>
void bias_grad(void* dbias, const void* dout, int64_t N, int64_t Co, int64_t L) {
  if (Co == 0) return;
  bias_grad_kernel<T><<<static_cast<unsigned>(Co), kBiasThreads, 0, detail::stream()>>>(
      static_cast<S<T>*>(dbias), static_cast<const S<T>*>(dout), N, Co, L);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType T>
void maxpool_forward(void* out_v, int32_t* argmax, const void* inp_v, int64_t N, int64_t C, int64_t H, int64_t W,
                     int64_t K, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo) {
  auto* out = static_cast<S<T>*>(out_v);
  const auto* inp = static_cast<const S<T>*>(inp_v);
  launch_each(N * C * Ho * Wo, "maxpool2d_forward", [=] __device__(int64_t e) {
    const int64_t ow = e % Wo, oh = (e / Wo) % Ho, p = e / (Ho * Wo);
    const S<T>* x = inp + p * H * W;
    float m = -INFINITY;
    int64_t am = -1;
    for (int64_t kh = 0; kh < K; ++kh) {
      const int64_t ih = oh * stride - pad + kh;
      if (ih < 0 || ih >= H) continue;
      for (int64_t kw = 0; kw < K; ++kw) {
        const int64_t iw = ow * stride - pad + kw;
        if (iw < 0 || iw >= W) continue;
        const float v = Elem<T>::load(x[ih * W + iw]);
        if (am < 0 || v > m || v != v) {
          if (am >= 0 && m != m) continue;  // keep the first NaN
          m = v;
          am = ih * W + iw;
        }
      }
    }
    out[e] = Elem<T>::store(m);  // exact: m is one of the T inputs (or -inf)
    argmax[e] = static_cast<int32_t>(am);
  });
}

template <DType T>
void maxpool_backward_planes(float* d, const void* dout_v, const int32_t* argmax, int64_t planes, int64_t HW,
                             int64_t HoWo) {
  const auto* dout = static_cast<const S<T>*>(dout_v);
  launch_each(planes, "maxpool2d_backward", [=] __device__(int64_t p) {
    float* dp = d + p * HW;
    const S<T>* g = dout + p * HoWo;
    const int32_t* a = argmax + p * HoWo;
    for (int64_t i = 0; i < HoWo; ++i)
      if (a[i] >= 0) dp[a[i]] += Elem<T>::load(g[i]);
  });
}

#define PT_INST(T)                                                                                                  \
  template void im2col<T>(void*, const void*, int64_t, const Geom&);                                               \
  template void col2im_add<T>(void*, const float*, int64_t, const Geom&);                                          \
  template void out_from_channel_major<T>(void*, const float*, const void*, int64_t, int64_t, int64_t);            \
  template void channel_major_from<T>(void*, const void*, int64_t, int64_t, int64_t);                              \
  template void bias_grad<T>(void*, const void*, int64_t, int64_t, int64_t);                                       \
  template void maxpool_forward<T>(void*, int32_t*, const void*, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                                   int64_t, int64_t, int64_t, int64_t);                                            \
  template void maxpool_backward_planes<T>(float*, const void*, const int32_t*, int64_t, int64_t, int64_t);
PT_INST(DType::F32)
PT_INST(DType::BF16)
PT_INST(DType::F16)
#undef PT_INST

}  // namespace paratrain::kernels::cuda::conv_detail
