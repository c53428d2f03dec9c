// Reductions. Full sums use fixed 16 Ki-element chunks summed in double, combined in chunk
// order: the result is independent of the thread count.
#include "paratrain/kernels/cpu/reduce.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {
namespace {

using detail::chunked_sum;

}  // namespace

double sum(const float* x, int64_t n) {
  return chunked_sum(n, [&](int64_t b, int64_t e) {
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = b; i < e; ++i) acc += static_cast<double>(x[i]);
    return acc;
  });
}

double sum_squares(const float* x, int64_t n) {
  return chunked_sum(n, [&](int64_t b, int64_t e) {
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = b; i < e; ++i) {
      double v = x[i];
      acc += v * v;
    }
    return acc;
  });
}

float max(const float* x, int64_t n) {
  if (n < 0) PT_THROW(InputError, "max: negative element count ", n);
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

bool all_finite(const float* x, int64_t n) {
  double s = chunked_sum(n, [&](int64_t b, int64_t e) {
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = b; i < e; ++i) bad |= !std::isfinite(x[i]);
    return static_cast<double>(bad);
  });
  return s == 0.0;
}

void sum_axis(float* out, const float* inp, int64_t outer, int64_t n, int64_t inner) {
  if (outer < 0 || n < 0 || inner < 0)
    PT_THROW(InputError, "sum_axis: negative size (", outer, ",", n, ",", inner, ")");
  if (inner == 1) {
    detail::parallel_for(outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(n, 1)),
                         [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const float* r = inp + o * n;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < n; ++k) acc += r[k];
        out[o] = acc;
      }
    }, 1);
    return;
  }
  // Tasks are (o, column block); each sums its columns over k in order.
  constexpr int64_t kCols = 256;
  const int64_t nblk = (inner + kCols - 1) / kCols;
  detail::parallel_for(outer * nblk, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(n * kCols, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / nblk, c0 = (t % nblk) * kCols, w = std::min(kCols, inner - c0);
      float* dst = out + o * inner + c0;
      for (int64_t c = 0; c < w; ++c) dst[c] = 0.0f;
      for (int64_t k = 0; k < n; ++k) {
        const float* src = inp + (o * n + k) * inner + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
      }
    }
  }, 1);
}

void sum_rows(float* out, const float* inp, int64_t N, int64_t C) { sum_axis(out, inp, 1, N, C); }
void sum_cols(float* out, const float* inp, int64_t N, int64_t C) { sum_axis(out, inp, N, C, 1); }

void max_cols(float* out, int32_t* argmax, const float* inp, int64_t N, int64_t C) {
  if (N < 0 || C <= 0) PT_THROW(InputError, "max_cols: bad size N=", N, " C=", C);
  detail::parallel_for(N, std::max<int64_t>(1, (1 << 15) / C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = inp + r * C;
      float m = x[0];
      int64_t a = 0;
      for (int64_t c = 1; c < C; ++c)
        if (x[c] > m || (x[c] != x[c] && m == m)) {
          m = x[c];
          a = c;
        }
      out[r] = m;
      if (argmax) argmax[r] = static_cast<int32_t>(a);
    }
  }, 1);
}

}  // namespace paratrain::kernels::cpu
