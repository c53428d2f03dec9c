// Private row helpers shared by softmax, cross-entropy and attention: vectorised max,
// exp-and-sum, dot product over one contiguous row; the check of a row stride.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/simd.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu::detail {

// InputError naming `who` unless rows of V elements fit a row stride of ld (ld >= V).
inline void check_row_stride(int64_t V, int64_t ld, const char* who) {
  if (ld < V) PT_THROW(InputError, who, ": row stride ld=", ld, " is below the row length V=", V);
}

inline float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#ifdef PT_KERNELS_AVX2
  __m256 vm = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
  m = hmax256(vm);
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// out[i] = exp(x[i] - sub) (out may be x or nullptr), returns the sum in f32.
inline float row_exp_sum(float* out, const float* x, int64_t n, float sub) {
  int64_t i = 0;
  float s = 0.0f;
#ifdef PT_KERNELS_AVX2
  const __m256 vs = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
    if (out) _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {
    __m256i m = tail_mask(n - i);
    __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vs));
    e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
    if (out) _mm256_maskstore_ps(out + i, m, e);
    acc = _mm256_add_ps(acc, e);
    i = n;
  }
  s = hsum256(acc);
#endif
  for (; i < n; ++i) {
    float e = std::exp(x[i] - sub);
    if (out) out[i] = e;
    s += e;
  }
  return s;
}

inline float row_dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace paratrain::kernels::cpu::detail
