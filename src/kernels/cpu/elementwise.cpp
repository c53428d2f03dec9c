// Elementwise kernels: plain loops the compiler vectorises (-O3 -march=native), AVX2
// intrinsics for the transcendental ones, threads for n above kGrain elements per thread.
#include "paratrain/kernels/cpu/elementwise.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/half_util.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per thread below which threads do not pay

template <typename F>
void each(int64_t n, F&& body) {
  if (n < 0) PT_THROW(InputError, "kernels: negative element count ", n);
  detail::parallel_for(n, kGrain, body);
}

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

}  // namespace

void fill(float* out, float value, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = value;
  });
}
void copy(float* out, const float* a, int64_t n) {
  if (out == a) return;
  each(n, [&](int64_t b, int64_t e) { std::memcpy(out + b, a + b, (e - b) * sizeof(float)); });
}
void add(float* out, const float* a, const float* x, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = a[i] + x[i];
  });
}
void sub(float* out, const float* a, const float* x, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = a[i] - x[i];
  });
}
void mul(float* out, const float* a, const float* x, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = a[i] * x[i];
  });
}
void div(float* out, const float* a, const float* x, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = a[i] / x[i];
  });
}
void scale(float* out, const float* a, float s, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = s * a[i];
  });
}
void add_scalar(float* out, const float* a, float s, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = a[i] + s;
  });
}
void axpy(float* y, const float* x, float alpha, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] += alpha * x[i];
  });
}
void axpby(float* y, const float* x, float alpha, float beta, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = alpha * x[i] + beta * y[i];
  });
}
void mul_acc(float* out, const float* a, const float* x, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] += a[i] * x[i];
  });
}

void relu_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
  });
}
void relu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
  });
}

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)), u = beta (x + kappa x^3):
// one exp and one division, no cancellation. Where -2u > 80 the result is 0 (exactly as
// in f32 arithmetic of the tanh form).
void gelu_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#ifdef PT_KERNELS_AVX2
    using namespace detail;
    const __m256 m2beta = _mm256_set1_ps(-2.0f * kGeluBeta), kappa = _mm256_set1_ps(kGeluKappa);
    const __m256 one = _mm256_set1_ps(1.0f), cap = _mm256_set1_ps(80.0f);
    map_unary(out + b, inp + b, e - b, [&](__m256 x) {
      __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      __m256 z = _mm256_mul_ps(m2beta, _mm256_fmadd_ps(kappa, x3, x));
      __m256 vanish = _mm256_cmp_ps(z, cap, _CMP_GT_OQ);  // sigmoid(2u) < 2e-35: gelu is 0
      __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_min_ps(z, cap))));
      return _mm256_andnot_ps(vanish, r);
    }, [](float x) { return x; });
#else
    for (int64_t i = b; i < e; ++i) {
      float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::tanh(kGeluBeta * (x + kGeluKappa * x * x * x)));
    }
#endif
  });
}

// d/dx of 0.5 x (1 + tanh(u)), u = beta (x + kappa x^3), as PyTorch computes it:
// 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
    int64_t i = b;
#ifdef PT_KERNELS_AVX2
    using namespace detail;
    const __m256 beta = _mm256_set1_ps(kGeluBeta), kappa = _mm256_set1_ps(kGeluKappa);
    const __m256 kappa3 = _mm256_set1_ps(3.0f * kGeluKappa);
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    // With s = sigmoid(2u) = 1/(1 + e), e = exp(-2u): 1 + t = 2s, 1 - t^2 = 4 s (1 - s) and
    // 1 - s = e s, so gelu' = s + 2 x s (e s) beta (1 + 3 kappa x^2).
    const __m256 m2 = _mm256_set1_ps(-2.0f), two = _mm256_set1_ps(2.0f), cap = _mm256_set1_ps(80.0f);
    (void)half;
    auto grad = [&](__m256 x, __m256 g) {
      __m256 x2 = _mm256_mul_ps(x, x);
      __m256 u = _mm256_mul_ps(beta, _mm256_fmadd_ps(_mm256_mul_ps(kappa, x2), x, x));
      __m256 z = _mm256_mul_ps(m2, u);
      __m256 vanish = _mm256_cmp_ps(z, cap, _CMP_GT_OQ);  // gelu' underflows to 0
      __m256 ex = exp256(_mm256_min_ps(z, cap));
      __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, ex));
      __m256 one_minus_s = _mm256_mul_ps(ex, s);
      __m256 poly = _mm256_mul_ps(beta, _mm256_fmadd_ps(kappa3, x2, one));
      __m256 right = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(two, x), _mm256_mul_ps(s, one_minus_s)), poly);
      return _mm256_mul_ps(g, _mm256_andnot_ps(vanish, _mm256_add_ps(s, right)));  // NaN/inf g propagates
    };
    for (; i + 8 <= e; i += 8) {
      __m256 d = grad(_mm256_loadu_ps(inp + i), _mm256_loadu_ps(dout + i));
      _mm256_storeu_ps(dinp + i, _mm256_add_ps(_mm256_loadu_ps(dinp + i), d));
    }
    if (i < e) {
      __m256i m = tail_mask(e - i);
      __m256 d = grad(_mm256_maskload_ps(inp + i, m), _mm256_maskload_ps(dout + i, m));
      _mm256_maskstore_ps(dinp + i, m, _mm256_add_ps(_mm256_maskload_ps(dinp + i, m), d));
      i = e;
    }
#endif
    for (; i < e; ++i) {
      float x = inp[i];
      float t = std::tanh(kGeluBeta * (x + kGeluKappa * x * x * x));
      float d = 0.5f * (1.0f + t) +
                0.5f * x * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * x * x);
      dinp[i] += dout[i] * d;
    }
  });
}

void tanh_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#ifdef PT_KERNELS_AVX2
    detail::map_unary(out + b, inp + b, e - b, [](__m256 x) { return detail::tanh256(x); },
                      [](float x) { return x; });
#else
    for (int64_t i = b; i < e; ++i) out[i] = std::tanh(inp[i]);
#endif
  });
}
void tanh_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
  });
}
void sigmoid_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#ifdef PT_KERNELS_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    detail::map_unary(out + b, inp + b, e - b, [&](__m256 x) {
      __m256 ex = detail::exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
      return _mm256_div_ps(one, _mm256_add_ps(one, ex));
    }, [](float x) { return x; });
#else
    for (int64_t i = b; i < e; ++i) out[i] = 1.0f / (1.0f + std::exp(-inp[i]));
#endif
  });
}
void sigmoid_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dinp[i] += dout[i] * out[i] * (1.0f - out[i]);
  });
}
void exp_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#ifdef PT_KERNELS_AVX2
    detail::map_unary(out + b, inp + b, e - b, [](__m256 x) { return detail::exp256(x); },
                      [](float x) { return x; });
#else
    for (int64_t i = b; i < e; ++i) out[i] = std::exp(inp[i]);
#endif
  });
}
void log_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = std::log(inp[i]);
  });
}
void sqrt_forward(float* out, const float* inp, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#ifdef PT_KERNELS_AVX2
    detail::map_unary(out + b, inp + b, e - b, [](__m256 x) { return _mm256_sqrt_ps(x); },
                      [](float x) { return x; });
#else
    for (int64_t i = b; i < e; ++i) out[i] = std::sqrt(inp[i]);
#endif
  });
}

void bias_add(float* out, const float* bias, int64_t N, int64_t C) {
  if (N < 0 || C < 0) PT_THROW(InputError, "bias_add: negative size N=", N, " C=", C);
  detail::parallel_for(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* o = out + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += bias[c];
    }
  }, 1);
}

// Deterministic: threads split C; each sums its columns over all rows in order.
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  if (N < 0 || C < 0) PT_THROW(InputError, "bias_backward: negative size N=", N, " C=", C);
  detail::parallel_for(C, std::max<int64_t>(16, kGrain / std::max<int64_t>(N, 1)),
                       [&](int64_t b, int64_t e) {
    constexpr int64_t kCols = 256;
    float acc[kCols];
    for (int64_t c0 = b; c0 < e; c0 += kCols) {
      int64_t w = std::min(kCols, e - c0);
      for (int64_t c = 0; c < w; ++c) acc[c] = 0.0f;
      for (int64_t r = 0; r < N; ++r) {
        const float* d = dout + r * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) acc[c] += d[c];
      }
      for (int64_t c = 0; c < w; ++c) dbias[c0 + c] += acc[c];
    }
  });
}

void dropout_forward(float* out, const float* inp, const uint8_t* mask, float s, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = inp[i] * static_cast<float>(mask[i]) * s;
  });
}
void dropout_backward(float* dinp, const float* dout, const uint8_t* mask, float s, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dinp[i] += dout[i] * static_cast<float>(mask[i]) * s;
  });
}
void dropout_mask(uint8_t* mask, uint64_t key, float p, int64_t n) {
  each(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) mask[i] = dropout_keep(key, i, p);
  });
}

// Conversions: the vectorised implementation chosen at run time (half_convert.cpp: AVX2 /
// F16C where the CPU has them, scalar otherwise), threaded for large n.
void f32_to_bf16(uint16_t* out, const float* in, int64_t n) {
  each(n, [&](int64_t b, int64_t e) { detail::convert_impl().f32_to_bf16(out + b, in + b, e - b); });
}
void bf16_to_f32(float* out, const uint16_t* in, int64_t n) {
  each(n, [&](int64_t b, int64_t e) { detail::convert_impl().bf16_to_f32(out + b, in + b, e - b); });
}
void f32_to_f16(uint16_t* out, const float* in, int64_t n) {
  each(n, [&](int64_t b, int64_t e) { detail::convert_impl().f32_to_f16(out + b, in + b, e - b); });
}
void f16_to_f32(float* out, const uint16_t* in, int64_t n) {
  each(n, [&](int64_t b, int64_t e) { detail::convert_impl().f16_to_f32(out + b, in + b, e - b); });
}

// ---- strided copies ----
namespace {
constexpr int kMaxDims = 6;

struct View {
  int nd = 0;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t count = 1;
};

// Normalises to exactly kMaxDims dims (leading size-1 dims), after merging dims that are
// contiguous with each other.
View make_view(int ndim, const int64_t* sizes, const int64_t* strides, const char* who) {
  if (ndim < 0 || ndim > kMaxDims) PT_THROW(InputError, who, ": ndim must be 0..6, got ", ndim);
  View v;
  int64_t sz[kMaxDims], st[kMaxDims];
  int m = 0;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] < 0) PT_THROW(InputError, who, ": negative size ", sizes[d], " in dim ", d);
    v.count *= sizes[d];
    if (sizes[d] == 1) continue;
    if (m > 0 && st[m - 1] == strides[d] * sizes[d]) {  // merge with the previous dim
      sz[m - 1] *= sizes[d];
      st[m - 1] = strides[d];
    } else {
      sz[m] = sizes[d];
      st[m] = strides[d];
      ++m;
    }
  }
  v.nd = kMaxDims;
  for (int d = 0; d < kMaxDims; ++d) {
    int src = d - (kMaxDims - m);
    v.size[d] = src >= 0 ? sz[src] : 1;
    v.stride[d] = src >= 0 ? st[src] : 0;
  }
  return v;
}

// Calls f(out_offset, in_offset_elements, len, inner_stride) for each innermost run.
template <typename F>
void walk(const View& v, F&& f) {
  if (v.count == 0) return;
  const int64_t outer = v.count / v.size[kMaxDims - 1];
  const int64_t inner = v.size[kMaxDims - 1];
  detail::parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      int64_t rem = o, off = 0;
      for (int d = kMaxDims - 2; d >= 0; --d) {
        int64_t idx = rem % v.size[d];
        rem /= v.size[d];
        off += idx * v.stride[d];
      }
      f(o * inner, off, inner, v.stride[kMaxDims - 1]);
    }
  }, 1);
}

template <typename T>
void copy_typed(T* out, const T* in, const View& v) {
  walk(v, [&](int64_t o, int64_t off, int64_t len, int64_t s) {
    const T* src = in + off;
    T* dst = out + o;
    if (s == 1) {
      std::memcpy(dst, src, len * sizeof(T));
    } else {
      for (int64_t i = 0; i < len; ++i) dst[i] = src[i * s];
    }
  });
}
}  // namespace

void strided_copy(void* out, const void* inp, size_t elem_size, int ndim, const int64_t* sizes,
                  const int64_t* strides) {
  View v = make_view(ndim, sizes, strides, "strided_copy");
  switch (elem_size) {
    case 1: copy_typed(static_cast<uint8_t*>(out), static_cast<const uint8_t*>(inp), v); return;
    case 2: copy_typed(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(inp), v); return;
    case 4: copy_typed(static_cast<uint32_t*>(out), static_cast<const uint32_t*>(inp), v); return;
    case 8: copy_typed(static_cast<uint64_t*>(out), static_cast<const uint64_t*>(inp), v); return;
    default: break;
  }
  if (elem_size == 0) PT_THROW(InputError, "strided_copy: element size 0");
  auto* o = static_cast<char*>(out);
  const auto* in = static_cast<const char*>(inp);
  walk(v, [&](int64_t oi, int64_t off, int64_t len, int64_t s) {
    for (int64_t i = 0; i < len; ++i)
      std::memcpy(o + (oi + i) * elem_size, in + (off + i * s) * static_cast<int64_t>(elem_size),
                  elem_size);
  });
}

namespace {
// out (view) += inp: Add(dst, src) does one element.
template <typename E, typename Add>
void strided_add_impl(E* out, const E* inp, int ndim, const int64_t* sizes, const int64_t* strides,
                      const char* who, Add add) {
  View v = make_view(ndim, sizes, strides, who);
  for (int d = 0; d < kMaxDims; ++d)
    if (v.size[d] > 1 && v.stride[d] == 0)
      PT_THROW(InputError, who, ": a 0 stride maps several elements to one address");
  walk(v, [&](int64_t o, int64_t off, int64_t len, int64_t s) {
    E* dst = out + off;
    const E* src = inp + o;
    for (int64_t i = 0; i < len; ++i) add(dst[i * s], src[i]);
  });
}
}  // namespace

void strided_add(float* out, const float* inp, int ndim, const int64_t* sizes,
                 const int64_t* strides) {
  strided_add_impl(out, inp, ndim, sizes, strides, "strided_add",
                   [](float& d, float s) { d += s; });
}
void strided_add_bf16(uint16_t* out, const uint16_t* inp, int ndim, const int64_t* sizes,
                      const int64_t* strides) {
  using H = detail::HalfT<DType::BF16>;
  strided_add_impl(out, inp, ndim, sizes, strides, "strided_add",
                   [](uint16_t& d, uint16_t s) { d = H::from_f32(H::to_f32(d) + H::to_f32(s)); });
}
void strided_add_f16(uint16_t* out, const uint16_t* inp, int ndim, const int64_t* sizes,
                     const int64_t* strides) {
  using H = detail::HalfT<DType::F16>;
  strided_add_impl(out, inp, ndim, sizes, strides, "strided_add",
                   [](uint16_t& d, uint16_t s) { d = H::from_f32(H::to_f32(d) + H::to_f32(s)); });
}

}  // namespace paratrain::kernels::cpu
