// LayerNorm: two-pass mean/variance per row in f32 (biased variance, as torch).
// The backward computes dinp row-parallel, then dweight/dbias column-parallel (each thread
// owns a range of columns and walks the rows in order: deterministic, no partial buffers).
#include "paratrain/kernels/cpu/layernorm.h"

#include <cmath>

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps) {
  if (N < 0 || C <= 0) PT_THROW(InputError, "layernorm_forward: bad size N=", N, " C=", C);
  detail::parallel_for(N, std::max<int64_t>(1, 8192 / C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = inp + r * C;
      float* o = out + r * C;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += x[c];
      const float m = s / static_cast<float>(C);
      float v = 0.0f;
#pragma omp simd reduction(+ : v)
      for (int64_t c = 0; c < C; ++c) {
        float d = x[c] - m;
        v += d * d;
      }
      const float rs = 1.0f / std::sqrt(v / static_cast<float>(C) + eps);
      if (weight && bias) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
      } else if (weight) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * rs + (bias ? bias[c] : 0.0f);
      }
      if (mean) mean[r] = m;
      if (rstd) rstd[r] = rs;
    }
  }, 1);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C) {
  if (N < 0 || C <= 0) PT_THROW(InputError, "layernorm_backward: bad size N=", N, " C=", C);
  if (dinp) {
    detail::parallel_for(N, std::max<int64_t>(1, 8192 / C), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* x = inp + r * C;
        const float* g = dout + r * C;
        float* di = dinp + r * C;
        const float m = mean[r], rs = rstd[r];
        // dnorm = g * w; dx = rs * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
        float sd = 0.0f, sdn = 0.0f;
#pragma omp simd reduction(+ : sd, sdn)
        for (int64_t c = 0; c < C; ++c) {
          float dn = weight ? g[c] * weight[c] : g[c];
          float nrm = (x[c] - m) * rs;
          sd += dn;
          sdn += dn * nrm;
        }
        sd /= static_cast<float>(C);
        sdn /= static_cast<float>(C);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          float dn = weight ? g[c] * weight[c] : g[c];
          float nrm = (x[c] - m) * rs;
          di[c] += rs * (dn - sd - nrm * sdn);
        }
      }
    }, 1);
  }
  if (dweight || dbias) {
    detail::parallel_for(C, std::max<int64_t>(16, 8192 / std::max<int64_t>(N, 1)),
                         [&](int64_t b, int64_t e) {
      constexpr int64_t kCols = 128;
      float aw[kCols], ab[kCols];
      for (int64_t c0 = b; c0 < e; c0 += kCols) {
        const int64_t w = std::min(kCols, e - c0);
        for (int64_t c = 0; c < w; ++c) aw[c] = ab[c] = 0.0f;
        for (int64_t r = 0; r < N; ++r) {
          const float* x = inp + r * C + c0;
          const float* g = dout + r * C + c0;
          const float m = mean[r], rs = rstd[r];
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) {
            aw[c] += (x[c] - m) * rs * g[c];
            ab[c] += g[c];
          }
        }
        for (int64_t c = 0; c < w; ++c) {
          if (dweight) dweight[c0 + c] += aw[c];
          if (dbias) dbias[c0 + c] += ab[c];
        }
      }
    });
  }
}

}  // namespace paratrain::kernels::cpu
