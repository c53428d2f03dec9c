// The bf16/f16 elementwise, bias, dropout, strided-add and reduction kernels
// (paratrain/kernels/cpu/half.h).
//
// Promise: each result is the f32 kernel's result on the widened (exact) inputs, rounded to
// T once. The elementwise kernels do exactly that, block by block: kHalfBlock elements are
// widened into stack buffers, the f32 kernel of the same name runs on them (single-threaded:
// a block is below its threading grain), the result is narrowed; threads split the array
// as the f32 kernels do. Backward kernels widen dinp too, so dinp = round(dinp + g) once.
// No allocation. Reductions sum the widened values in double in the f32 kernels' fixed
// 16 Ki chunks, so they do not depend on the thread count either.
#include <cstring>
#include <vector>

#include "kernels/cpu/half_util.h"
#include "paratrain/kernels/cpu/elementwise.h"
#include "paratrain/kernels/cpu/half.h"
#include "paratrain/kernels/cpu/reduce.h"

namespace paratrain::kernels::cpu::half {
namespace {

using detail::half_blocks;
using detail::HalfT;
using detail::kHalfBlock;

// out = F(a)
template <DType T, void (*F)(float*, const float*, int64_t)>
void unary(uint16_t* out, const uint16_t* a, int64_t n, const char* who) {
  half_blocks(n, who, [&](int64_t b, int64_t len) {
    alignas(64) float x[kHalfBlock];
    HalfT<T>::widen(x, a + b, len);
    F(x, x, len);
    HalfT<T>::narrow(out + b, x, len);
  });
}
// out = F(a, b)
template <DType T, void (*F)(float*, const float*, const float*, int64_t)>
void binary(uint16_t* out, const uint16_t* a, const uint16_t* c, int64_t n, const char* who) {
  half_blocks(n, who, [&](int64_t b, int64_t len) {
    alignas(64) float x[kHalfBlock], y[kHalfBlock];
    HalfT<T>::widen(x, a + b, len);
    HalfT<T>::widen(y, c + b, len);
    F(x, x, y, len);
    HalfT<T>::narrow(out + b, x, len);
  });
}
// acc op= F(a, b): the accumulator is widened, the f32 kernel accumulates, one rounding
template <DType T, void (*F)(float*, const float*, const float*, int64_t)>
void accumulate(uint16_t* acc, const uint16_t* a, const uint16_t* c, int64_t n, const char* who) {
  half_blocks(n, who, [&](int64_t b, int64_t len) {
    alignas(64) float d[kHalfBlock], x[kHalfBlock], y[kHalfBlock];
    HalfT<T>::widen(d, acc + b, len);
    HalfT<T>::widen(x, a + b, len);
    HalfT<T>::widen(y, c + b, len);
    F(d, x, y, len);
    HalfT<T>::narrow(acc + b, d, len);
  });
}

using detail::chunked_sum;  // the f32 reductions' fixed chunks, combined in order

// sum over [b, e) of G(widened x[i]) in double, widening kHalfBlock at a time
template <DType T, typename G>
double widened_sum(const uint16_t* x, int64_t b, int64_t e, G g) {
  double acc = 0.0;
  alignas(64) float buf[kHalfBlock];
  for (int64_t s = b; s < e; s += kHalfBlock) {
    const int64_t len = std::min(kHalfBlock, e - s);
    HalfT<T>::widen(buf, x + s, len);
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < len; ++i) acc += g(static_cast<double>(buf[i]));
  }
  return acc;
}

}  // namespace

template <DType T>
void fill(uint16_t* out, float value, int64_t n) {
  const uint16_t v = HalfT<T>::from_f32(value);
  half_blocks(n, "fill", [&](int64_t b, int64_t len) {
    for (int64_t i = 0; i < len; ++i) out[b + i] = v;
  });
}
template <DType T>
void copy(uint16_t* out, const uint16_t* a, int64_t n) {
  if (n < 0) PT_THROW(InputError, "copy: negative element count ", n);
  if (out == a) return;
  detail::parallel_for(n, detail::kHalfGrain, [&](int64_t b, int64_t e) {
    std::memcpy(out + b, a + b, (e - b) * sizeof(uint16_t));
  });
}
template <DType T>
void add(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  binary<T, &cpu::add>(out, a, b, n, "add");
}
template <DType T>
void sub(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  binary<T, &cpu::sub>(out, a, b, n, "sub");
}
template <DType T>
void mul(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  binary<T, &cpu::mul>(out, a, b, n, "mul");
}
template <DType T>
void scale(uint16_t* out, const uint16_t* a, float s, int64_t n) {
  half_blocks(n, "scale", [&](int64_t b, int64_t len) {
    alignas(64) float x[kHalfBlock];
    HalfT<T>::widen(x, a + b, len);
    cpu::scale(x, x, s, len);
    HalfT<T>::narrow(out + b, x, len);
  });
}
template <DType T>
void axpy(uint16_t* y, const uint16_t* x, float alpha, int64_t n) {
  half_blocks(n, "axpy", [&](int64_t b, int64_t len) {
    alignas(64) float yf[kHalfBlock], xf[kHalfBlock];
    HalfT<T>::widen(yf, y + b, len);
    HalfT<T>::widen(xf, x + b, len);
    cpu::axpy(yf, xf, alpha, len);
    HalfT<T>::narrow(y + b, yf, len);
  });
}
template <DType T>
void mul_acc(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  accumulate<T, &cpu::mul_acc>(out, a, b, n, "mul_acc");
}

template <DType T>
void relu_forward(uint16_t* out, const uint16_t* inp, int64_t n) {
  unary<T, &cpu::relu_forward>(out, inp, n, "relu_forward");
}
template <DType T>
void relu_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* inp, int64_t n) {
  accumulate<T, &cpu::relu_backward>(dinp, dout, inp, n, "relu_backward");
}
template <DType T>
void gelu_forward(uint16_t* out, const uint16_t* inp, int64_t n) {
  unary<T, &cpu::gelu_forward>(out, inp, n, "gelu_forward");
}
template <DType T>
void gelu_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* inp, int64_t n) {
  accumulate<T, &cpu::gelu_backward>(dinp, dout, inp, n, "gelu_backward");
}
template <DType T>
void tanh_forward(uint16_t* out, const uint16_t* inp, int64_t n) {
  unary<T, &cpu::tanh_forward>(out, inp, n, "tanh_forward");
}
template <DType T>
void tanh_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t n) {
  accumulate<T, &cpu::tanh_backward>(dinp, dout, out, n, "tanh_backward");
}
template <DType T>
void sigmoid_forward(uint16_t* out, const uint16_t* inp, int64_t n) {
  unary<T, &cpu::sigmoid_forward>(out, inp, n, "sigmoid_forward");
}
template <DType T>
void sigmoid_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t n) {
  accumulate<T, &cpu::sigmoid_backward>(dinp, dout, out, n, "sigmoid_backward");
}

template <DType T>
void dropout_forward(uint16_t* out, const uint16_t* inp, const uint8_t* mask, float s, int64_t n) {
  half_blocks(n, "dropout_forward", [&](int64_t b, int64_t len) {
    alignas(64) float x[kHalfBlock];
    HalfT<T>::widen(x, inp + b, len);
    cpu::dropout_forward(x, x, mask + b, s, len);
    HalfT<T>::narrow(out + b, x, len);
  });
}
template <DType T>
void dropout_backward(uint16_t* dinp, const uint16_t* dout, const uint8_t* mask, float s, int64_t n) {
  half_blocks(n, "dropout_backward", [&](int64_t b, int64_t len) {
    alignas(64) float d[kHalfBlock], g[kHalfBlock];
    HalfT<T>::widen(d, dinp + b, len);
    HalfT<T>::widen(g, dout + b, len);
    cpu::dropout_backward(d, g, mask + b, s, len);
    HalfT<T>::narrow(dinp + b, d, len);
  });
}

// Rows split across threads; the bias is widened once per call into scratch.
template <DType T>
void bias_add(uint16_t* out, const uint16_t* bias, int64_t N, int64_t C) {
  if (N < 0 || C < 0) PT_THROW(InputError, "bias_add: negative size N=", N, " C=", C);
  if (N == 0 || C == 0) return;
  float* bf = detail::half_scratch(0, static_cast<size_t>(C));
  HalfT<T>::widen(bf, bias, C);
  detail::parallel_for(N, std::max<int64_t>(1, detail::kHalfGrain / C), [&](int64_t b, int64_t e) {
    alignas(64) float x[kHalfBlock];
    for (int64_t r = b; r < e; ++r) {
      uint16_t* o = out + r * C;
      for (int64_t c0 = 0; c0 < C; c0 += kHalfBlock) {
        const int64_t w = std::min(kHalfBlock, C - c0);
        HalfT<T>::widen(x, o + c0, w);
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) x[c] += bf[c0 + c];
        HalfT<T>::narrow(o + c0, x, w);
      }
    }
  }, 1);
}

// As the f32 kernel: threads split C; each sums its columns over all rows in order in f32,
// then dbias = round(dbias + sum) once.
template <DType T>
void bias_backward(uint16_t* dbias, const uint16_t* dout, int64_t N, int64_t C) {
  if (N < 0 || C < 0) PT_THROW(InputError, "bias_backward: negative size N=", N, " C=", C);
  detail::parallel_for(C, std::max<int64_t>(16, detail::kHalfGrain / std::max<int64_t>(N, 1)),
                       [&](int64_t b, int64_t e) {
    constexpr int64_t kCols = 256;
    alignas(64) float acc[kCols], row[kCols];
    for (int64_t c0 = b; c0 < e; c0 += kCols) {
      const int64_t w = std::min(kCols, e - c0);
      for (int64_t c = 0; c < w; ++c) acc[c] = 0.0f;
      for (int64_t r = 0; r < N; ++r) {
        HalfT<T>::widen(row, dout + r * C + c0, w);
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) acc[c] += row[c];
      }
      HalfT<T>::widen(row, dbias + c0, w);
      for (int64_t c = 0; c < w; ++c) row[c] += acc[c];
      HalfT<T>::narrow(dbias + c0, row, w);
    }
  });
}

template <DType T>
void strided_add(uint16_t* out, const uint16_t* inp, int ndim, const int64_t* sizes,
                 const int64_t* strides) {
  if constexpr (T == DType::BF16)
    cpu::strided_add_bf16(out, inp, ndim, sizes, strides);
  else
    cpu::strided_add_f16(out, inp, ndim, sizes, strides);
}

template <DType T>
double sum(const uint16_t* x, int64_t n) {
  return chunked_sum(n, [&](int64_t b, int64_t e) {
    return widened_sum<T>(x, b, e, [](double v) { return v; });
  });
}
template <DType T>
double sum_squares(const uint16_t* x, int64_t n) {
  return chunked_sum(n, [&](int64_t b, int64_t e) {
    return widened_sum<T>(x, b, e, [](double v) { return v * v; });
  });
}
// inf and NaN are the all-ones exponent in both formats: a bit test, no conversion.
template <DType T>
bool all_finite(const uint16_t* x, int64_t n) {
  constexpr uint16_t m = HalfT<T>::kExpMask;
  double bad = chunked_sum(n, [&](int64_t b, int64_t e) {
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t i = b; i < e; ++i) any |= (x[i] & m) == m;
    return static_cast<double>(any);
  });
  return bad == 0.0;
}

// ---- explicit instantiations for bf16 and f16 ----
#define PT_HALF_INST(R, name, params) \
  template R name<DType::BF16> params; \
  template R name<DType::F16> params;
PT_HALF_INST(void, fill, (uint16_t*, float, int64_t))
PT_HALF_INST(void, copy, (uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, add, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, sub, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, mul, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, scale, (uint16_t*, const uint16_t*, float, int64_t))
PT_HALF_INST(void, axpy, (uint16_t*, const uint16_t*, float, int64_t))
PT_HALF_INST(void, mul_acc, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, relu_forward, (uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, relu_backward, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, gelu_forward, (uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, gelu_backward, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, tanh_forward, (uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, tanh_backward, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, sigmoid_forward, (uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, sigmoid_backward, (uint16_t*, const uint16_t*, const uint16_t*, int64_t))
PT_HALF_INST(void, bias_add, (uint16_t*, const uint16_t*, int64_t, int64_t))
PT_HALF_INST(void, bias_backward, (uint16_t*, const uint16_t*, int64_t, int64_t))
PT_HALF_INST(void, dropout_forward, (uint16_t*, const uint16_t*, const uint8_t*, float, int64_t))
PT_HALF_INST(void, dropout_backward, (uint16_t*, const uint16_t*, const uint8_t*, float, int64_t))
PT_HALF_INST(void, strided_add, (uint16_t*, const uint16_t*, int, const int64_t*, const int64_t*))
PT_HALF_INST(double, sum, (const uint16_t*, int64_t))
PT_HALF_INST(double, sum_squares, (const uint16_t*, int64_t))
PT_HALF_INST(bool, all_finite, (const uint16_t*, int64_t))
#undef PT_HALF_INST

}  // namespace paratrain::kernels::cpu::half
