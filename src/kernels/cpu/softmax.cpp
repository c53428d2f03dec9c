// Softmax, log-softmax and fused cross-entropy over rows; row-parallel.
#include "paratrain/kernels/cpu/softmax.h"

#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {
namespace {
void check(int64_t N, int64_t C, const char* who) {
  if (N < 0 || C <= 0) PT_THROW(InputError, who, ": bad size N=", N, " C=", C);
}
int64_t grain_rows(int64_t C) { return std::max<int64_t>(1, 8192 / C); }
}  // namespace

void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  check(N, C, "softmax_forward");
  detail::parallel_for(N, grain_rows(C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = inp + r * C;
      float* o = out + r * C;
      float m = detail::row_max(x, C);
      float s = detail::row_exp_sum(o, x, C, m);
      float inv = 1.0f / s;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] *= inv;
    }
  }, 1);
}

void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  check(N, C, "softmax_backward");
  detail::parallel_for(N, grain_rows(C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = dout + r * C;
      const float* y = out + r * C;
      float* d = dinp + r * C;
      float dot = detail::row_dot(g, y, C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) d[c] += y[c] * (g[c] - dot);
    }
  }, 1);
}

void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  check(N, C, "log_softmax_forward");
  detail::parallel_for(N, grain_rows(C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = inp + r * C;
      float* o = out + r * C;
      float m = detail::row_max(x, C);
      float lse = m + std::log(detail::row_exp_sum(nullptr, x, C, m));
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = x[c] - lse;
    }
  }, 1);
}

void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                          int64_t C) {
  check(N, C, "log_softmax_backward");
  detail::parallel_for(N, grain_rows(C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = dout + r * C;
      const float* y = out + r * C;
      float* d = dinp + r * C;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += g[c];
      for (int64_t c = 0; c < C; ++c) d[c] += g[c] - std::exp(y[c]) * s;
    }
  }, 1);
}

namespace {
void check_targets(const int32_t* targets, int64_t N, int64_t V, const char* who) {
  for (int64_t n = 0; n < N; ++n) {
    int32_t t = targets[n];
    if (t != kIgnoreIndex && (t < 0 || t >= V))
      PT_THROW(InputError, who, ": target ", t, " at row ", n, " is outside [0,", V, ")");
  }
}
}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits,
                          const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  check(N, V, "crossentropy_forward");
  detail::check_row_stride(V, ld, "crossentropy_forward");
  check_targets(targets, N, V, "crossentropy_forward");
  detail::parallel_for(N, grain_rows(V), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = logits + r * ld;
      float m = detail::row_max(x, V);
      float l = m + std::log(detail::row_exp_sum(nullptr, x, V, m));
      if (lse) lse[r] = l;
      int32_t t = targets[r];
      losses[r] = t == kIgnoreIndex ? 0.0f : l - x[t];
    }
  }, 1);
}

void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits,
                           const float* lse, const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  check(N, V, "crossentropy_backward");
  detail::check_row_stride(V, ld, "crossentropy_backward");
  check_targets(targets, N, V, "crossentropy_backward");
  detail::parallel_for(N, grain_rows(V), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = logits + r * ld;
      float* d = dlogits + r * ld;
      int32_t t = targets[r];
      if (t == kIgnoreIndex) {
        for (int64_t c = 0; c < V; ++c) d[c] = 0.0f;
        continue;
      }
      const float g = dlosses[r];
      detail::row_exp_sum(d, x, V, lse[r]);  // d = softmax
#pragma omp simd
      for (int64_t c = 0; c < V; ++c) d[c] *= g;
      d[t] -= g;
    }
  }, 1);
}

float softmax_row_max(const float* x, int64_t n) { return detail::row_max(x, n); }

float softmax_row_exp_sum(float* out, const float* x, int64_t n, float sub) {
  return detail::row_exp_sum(out, x, n, sub);
}

}  // namespace paratrain::kernels::cpu
