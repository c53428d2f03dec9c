// conv2d as im2col + GEMM over chunks of images; max-pool with saved argmax.
//
// Forward, per chunk of nb images: col (nb, Ci*K*K, Ho*Wo) = im2col(inp), then one batched
// GEMM out_n (Co, Ho*Wo) = weight (Co, Ci*K*K) @ col_n. Backward: dcol_n = weight^T @
// dout_n, col2im adds it into dinp (images in parallel, disjoint); dweight += dout_n @
// col_n^T image by image in order (deterministic). The chunk bounds col to ~16 MiB, held in
// reused thread-local scratch.
#include "paratrain/kernels/cpu/conv.h"


#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/gemm.h"

namespace paratrain::kernels::cpu {
namespace {

constexpr int64_t kColBudget = int64_t{1} << 22;  // floats of im2col scratch per chunk

struct ConvGeom {
  int64_t Ci, H, W, K, stride, pad, Ho, Wo;
  int64_t rows() const { return Ci * K * K; }
  int64_t cols() const { return Ho * Wo; }
};

// col (Ci*K*K, Ho*Wo) from one image (Ci,H,W)
void im2col(float* col, const float* img, const ConvGeom& g) {
  for (int64_t ci = 0; ci < g.Ci; ++ci)
    for (int64_t kh = 0; kh < g.K; ++kh)
      for (int64_t kw = 0; kw < g.K; ++kw) {
        float* dst = col + ((ci * g.K + kh) * g.K + kw) * g.cols();
        const float* src = img + ci * g.H * g.W;
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const int64_t ih = oh * g.stride - g.pad + kh;
          float* d = dst + oh * g.Wo;
          if (ih < 0 || ih >= g.H) {
            for (int64_t ow = 0; ow < g.Wo; ++ow) d[ow] = 0.0f;
            continue;
          }
          const float* s = src + ih * g.W;
          for (int64_t ow = 0; ow < g.Wo; ++ow) {
            const int64_t iw = ow * g.stride - g.pad + kw;
            d[ow] = (iw >= 0 && iw < g.W) ? s[iw] : 0.0f;
          }
        }
      }
}

// img (Ci,H,W) += col2im(col)
void col2im_add(float* img, const float* col, const ConvGeom& g) {
  for (int64_t ci = 0; ci < g.Ci; ++ci)
    for (int64_t kh = 0; kh < g.K; ++kh)
      for (int64_t kw = 0; kw < g.K; ++kw) {
        const float* src = col + ((ci * g.K + kh) * g.K + kw) * g.cols();
        float* dst = img + ci * g.H * g.W;
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const int64_t ih = oh * g.stride - g.pad + kh;
          if (ih < 0 || ih >= g.H) continue;
          const float* s = src + oh * g.Wo;
          float* d = dst + ih * g.W;
          for (int64_t ow = 0; ow < g.Wo; ++ow) {
            const int64_t iw = ow * g.stride - g.pad + kw;
            if (iw >= 0 && iw < g.W) d[iw] += s[ow];
          }
        }
      }
}

ConvGeom geometry(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K,
                  int64_t stride, int64_t pad, const char* who) {
  if (N < 0 || Ci <= 0 || H <= 0 || W <= 0 || Co <= 0 || K <= 0 || stride <= 0 || pad < 0)
    PT_THROW(InputError, who, ": bad sizes N=", N, " Ci=", Ci, " H=", H, " W=", W, " Co=", Co,
             " K=", K, " stride=", stride, " pad=", pad);
  return ConvGeom{Ci, H, W, K, stride, pad, conv2d_out_size(H, K, stride, pad),
                  conv2d_out_size(W, K, stride, pad)};
}

bool has_nan(const float* x, int64_t n) {
  bool nan = false;
#pragma omp simd reduction(| : nan)
  for (int64_t i = 0; i < n; ++i) nan |= x[i] != x[i];
  return nan;
}

// One output row of an unpadded 2x2, stride-2 pool over a NaN-free plane x (W wide).
void pool_row_2x2(float* o, int32_t* a, const float* x, int64_t W, int64_t oh, int64_t Wo) {
  const float* r0 = x + 2 * oh * W;
  const float* r1 = r0 + W;
  const int32_t base = static_cast<int32_t>(2 * oh * W);
  for (int64_t ow = 0; ow < Wo; ++ow) {
    const int32_t i = base + static_cast<int32_t>(2 * ow);
    float m = r0[2 * ow];
    int32_t am = i;
    const float v1 = r0[2 * ow + 1], v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
    am = v1 > m ? i + 1 : am;
    m = v1 > m ? v1 : m;
    am = v2 > m ? i + static_cast<int32_t>(W) : am;
    m = v2 > m ? v2 : m;
    am = v3 > m ? i + static_cast<int32_t>(W) + 1 : am;
    m = v3 > m ? v3 : m;
    o[ow] = m;
    a[ow] = am;
  }
}

// One output row of an unpadded K x K pool over a NaN-free plane.
void pool_row_unpadded(float* o, int32_t* a, const float* x, int64_t W, int64_t K, int64_t stride, int64_t oh,
                       int64_t Wo) {
  for (int64_t ow = 0; ow < Wo; ++ow) {
    const int64_t first = oh * stride * W + ow * stride;
    float m = x[first];
    int64_t am = first;
    for (int64_t kh = 0; kh < K; ++kh)
      for (int64_t kw = 0; kw < K; ++kw) {
        const int64_t i = first + kh * W + kw;
        const float v = x[i];
        am = v > m ? i : am;
        m = v > m ? v : m;
      }
    o[ow] = m;
    a[ow] = static_cast<int32_t>(am);
  }
}

}  // namespace

int64_t conv2d_out_size(int64_t H, int64_t K, int64_t stride, int64_t pad) {
  if (stride <= 0 || K <= 0 || pad < 0 || H + 2 * pad < K)
    PT_THROW(InputError, "conv2d: kernel ", K, " with padding ", pad, " and stride ", stride,
             " does not fit input size ", H);
  return (H + 2 * pad - K) / stride + 1;
}

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K,
                    int64_t stride, int64_t pad) {
  const ConvGeom g = geometry(N, Ci, H, W, Co, K, stride, pad, "conv2d_forward");
  const int64_t R = g.rows(), L = g.cols();
  const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(N, kColBudget / (R * L)));
  float* col = detail::scratch(2, static_cast<size_t>(nb * R * L));
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = std::min(nb, N - n0);
    detail::parallel_tasks(cnt, [&](int64_t i) { im2col(col + i * R * L, inp + (n0 + i) * Ci * H * W, g); });
    gemm_batched(false, false, Co, L, R, 1.0f, weight, R, col, L, 0.0f, out + n0 * Co * L, L, cnt,
                 0, R * L, Co * L);
  }
  if (bias) {
    detail::parallel_for(N * Co, std::max<int64_t>(1, 16384 / L), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        float* o = out + p * L;
        const float bv = bias[p % Co];
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) o[l] += bv;
      }
    }, 1);
  }
}

void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t Ci, int64_t H,
                     int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad) {
  const ConvGeom g = geometry(N, Ci, H, W, Co, K, stride, pad, "conv2d_backward");
  const int64_t R = g.rows(), L = g.cols();
  if (dbias) {
    detail::parallel_for(Co, 1, [&](int64_t b, int64_t e) {
      for (int64_t co = b; co < e; ++co) {
        float acc = 0.0f;
        for (int64_t n = 0; n < N; ++n) {
          const float* d = dout + (n * Co + co) * L;
          float s = 0.0f;
#pragma omp simd reduction(+ : s)
          for (int64_t l = 0; l < L; ++l) s += d[l];
          acc += s;
        }
        dbias[co] += acc;
      }
    }, 1);
  }
  if (!dinp && !dweight) return;
  const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(N, kColBudget / (R * L)));
  float* col = detail::scratch(2, static_cast<size_t>(nb * R * L));
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = std::min(nb, N - n0);
    if (dweight) {
      detail::parallel_tasks(cnt, [&](int64_t i) { im2col(col + i * R * L, inp + (n0 + i) * Ci * H * W, g); });
      for (int64_t i = 0; i < cnt; ++i)
        gemm(false, true, Co, R, L, 1.0f, dout + (n0 + i) * Co * L, L, col + i * R * L, L, 1.0f,
             dweight, R);
    }
    if (dinp) {
      // dcol reuses the col scratch: dweight for this chunk is done with it.
      gemm_batched(true, false, R, L, Co, 1.0f, weight, R, dout + n0 * Co * L, L, 0.0f, col, L,
                   cnt, 0, Co * L, R * L);
      detail::parallel_tasks(cnt, [&](int64_t i) { col2im_add(dinp + (n0 + i) * Ci * H * W, col + i * R * L, g); });
    }
  }
}

void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int64_t N, int64_t C,
                       int64_t H, int64_t W, int64_t K, int64_t stride, int64_t pad) {
  if (N < 0 || C <= 0 || H <= 0 || W <= 0 || K <= 0 || stride <= 0 || pad < 0 || 2 * pad > K)
    PT_THROW(InputError, "maxpool2d_forward: bad sizes N=", N, " C=", C, " H=", H, " W=", W,
             " K=", K, " stride=", stride, " pad=", pad, " (pad must be <= K/2)");
  const int64_t Ho = conv2d_out_size(H, K, stride, pad), Wo = conv2d_out_size(W, K, stride, pad);
  detail::parallel_for(N * C, std::max<int64_t>(1, 16384 / (H * W)), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* x = inp + p * H * W;
      float* o = out + p * Ho * Wo;
      int32_t* a = argmax + p * Ho * Wo;
      // Unpadded and NaN-free (the CNN's 2x2 pool): every window lies inside the image and a
      // plain "larger than" decides, written as selects (random data would mispredict a
      // branch half the time) and with the 2x2 window unrolled. A plane with a NaN takes the
      // general loop below, which keeps the first NaN.
      if (pad == 0 && !has_nan(x, H * W)) {
        for (int64_t oh = 0; oh < Ho; ++oh)
          if (K == 2 && stride == 2) pool_row_2x2(o + oh * Wo, a + oh * Wo, x, W, oh, Wo);
          else pool_row_unpadded(o + oh * Wo, a + oh * Wo, x, W, K, stride, oh, Wo);
        continue;
      }
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          float m;
          int64_t am;
          maxpool_window([x](int64_t i) { return x[i]; }, H, W, K, stride, pad, oh, ow, m, am);
          o[oh * Wo + ow] = m;
          a[oh * Wo + ow] = static_cast<int32_t>(am);
        }
    }
  }, 1);
}

void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int64_t N,
                        int64_t C, int64_t H, int64_t W, int64_t Ho, int64_t Wo) {
  if (N < 0 || C <= 0 || H <= 0 || W <= 0 || Ho < 0 || Wo < 0)
    PT_THROW(InputError, "maxpool2d_backward: bad sizes");
  detail::parallel_for(N * C, std::max<int64_t>(1, 16384 / (H * W)), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* d = dinp + p * H * W;
      const float* g = dout + p * Ho * Wo;
      const int32_t* a = argmax + p * Ho * Wo;
      for (int64_t i = 0; i < Ho * Wo; ++i)
        if (a[i] >= 0) d[a[i]] += g[i];
    }
  }, 1);
}

}  // namespace paratrain::kernels::cpu
