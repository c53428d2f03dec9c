// Fused AdamW and SGD updates, in the operation order of torch.optim (1.13, single-tensor
// path): scalars derived in double as Python does, element math in f32.
#include "paratrain/kernels/cpu/optim.h"

#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  if (n < 0) PT_THROW(InputError, "adamw_update: negative element count ", n);
  if (t < 1) PT_THROW(InputError, "adamw_update: step must be >= 1, got ", t);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const float step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = beta1, b2 = beta2;
  const float a1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  const float a2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  detail::parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    int64_t i = b;
#ifdef PT_KERNELS_AVX2
    // Same operations in the same order as the scalar loop below (no FMA contraction). The
    // tail goes through the same vector operations (masked), so an element's result never
    // depends on where it sits in [b, e): updating a tensor in pieces (ZeRO's shards, or
    // another thread split) gives the same bits as updating it whole.
    const __m256 vdecay = _mm256_set1_ps(decay), vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
    const __m256 va1 = _mm256_set1_ps(a1), va2 = _mm256_set1_ps(a2), veps = _mm256_set1_ps(eps);
    const __m256 vbc2 = _mm256_set1_ps(bc2_sqrt), vstep = _mm256_set1_ps(-step_size);
    auto update8 = [&](__m256 gi, __m256 p0, __m256 m0, __m256 v0, __m256& po, __m256& mo, __m256& vo) {
      const __m256 pi = _mm256_mul_ps(p0, vdecay);
      mo = _mm256_add_ps(_mm256_mul_ps(m0, vb1), _mm256_mul_ps(va1, gi));
      vo = _mm256_add_ps(_mm256_mul_ps(v0, vb2), _mm256_mul_ps(_mm256_mul_ps(va2, gi), gi));
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vo), vbc2), veps);
      po = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(vstep, mo), denom));
    };
    for (; i + 8 <= e; i += 8) {
      __m256 po, mo, vo;
      update8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(p + i), _mm256_loadu_ps(m + i), _mm256_loadu_ps(v + i), po, mo,
              vo);
      _mm256_storeu_ps(p + i, po);
      _mm256_storeu_ps(m + i, mo);
      _mm256_storeu_ps(v + i, vo);
    }
    if (i < e) {
      const __m256i mask = detail::tail_mask(e - i);
      __m256 po, mo, vo;
      update8(_mm256_maskload_ps(g + i, mask), _mm256_maskload_ps(p + i, mask), _mm256_maskload_ps(m + i, mask),
              _mm256_maskload_ps(v + i, mask), po, mo, vo);
      _mm256_maskstore_ps(p + i, mask, po);
      _mm256_maskstore_ps(m + i, mask, mo);
      _mm256_maskstore_ps(v + i, mask, vo);
      i = e;
    }
#endif
    for (; i < e; ++i) {
      const float gi = g[i];
      const float pi = p[i] * decay;
      const float mi = m[i] * b1 + a1 * gi;
      const float vi = v[i] * b2 + a2 * gi * gi;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      p[i] = pi + (-step_size) * mi / denom;
      m[i] = mi;
      v[i] = vi;
    }
  });
}

void adamw_update_multi(const AdamWTensor* list, int64_t count, float lr, float beta1, float beta2, float eps,
                        int64_t t) {
  if (count < 0) PT_THROW(InputError, "adamw_update_multi: negative tensor count ", count);
  for (int64_t k = 0; k < count; ++k) {
    const AdamWTensor& e = list[k];
    adamw_update(e.p, e.g, e.m, e.v, e.n, lr, beta1, beta2, eps, e.weight_decay, t);
  }
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step) {
  if (n < 0) PT_THROW(InputError, "sgd_update: negative element count ", n);
  if (momentum != 0.0f && buf == nullptr && n > 0)
    PT_THROW(InputError, "sgd_update: momentum needs a buffer");
  const float keep = static_cast<float>(1.0 - static_cast<double>(dampening));
  detail::parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float d = g[i];
      if (weight_decay != 0.0f) d = d + weight_decay * p[i];
      if (momentum != 0.0f) {
        float bi = first_step ? d : buf[i] * momentum + keep * d;
        buf[i] = bi;
        d = nesterov ? d + momentum * bi : bi;
      }
      p[i] = p[i] + (-lr) * d;
    }
  });
}

}  // namespace paratrain::kernels::cpu
