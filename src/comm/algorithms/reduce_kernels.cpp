#include "comm/algorithms/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "paratrain/base/error.h"

namespace paratrain::comm::kernels {
namespace {

struct F32 { using T = float; static float load(float x) { return x; } static float store(float x) { return x; } };
struct BF { using T = uint16_t; static float load(uint16_t x) { return bf16_to_f32(x); } static uint16_t store(float x) { return f32_to_bf16(x); } };
struct HF { using T = uint16_t; static float load(uint16_t x) { return f16_to_f32(x); } static uint16_t store(float x) { return f32_to_f16(x); } };
template <typename I> struct Int { using T = I; static I load(I x) { return x; } static I store(I x) { return x; } };

template <typename C, ReduceOp Op, typename W>
inline W combine(W a, W b) {
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) return a + b;
  else if constexpr (Op == ReduceOp::kMax) return a > b ? a : (a == a ? b : a);  // keeps NaN
  else return a < b ? a : (a == a ? b : a);
}

template <typename C, ReduceOp Op>
__attribute__((noinline)) void reduce_loop(void* out, const void* a, const void* b, size_t n, int divisor) {
  using T = typename C::T;
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if constexpr (Op == ReduceOp::kAvg) {
    if (divisor != 1) {
      if constexpr (std::is_integral_v<decltype(C::load(T()))>) {
        for (size_t i = 0; i < n; ++i) o[i] = C::store((C::load(x[i]) + C::load(y[i])) / divisor);
      } else {
        for (size_t i = 0; i < n; ++i) o[i] = C::store((C::load(x[i]) + C::load(y[i])) / float(divisor));
      }
      return;
    }
  }
  for (size_t i = 0; i < n; ++i) o[i] = C::store(combine<C, Op>(C::load(x[i]), C::load(y[i])));
}

template <typename C>
void reduce_op(void* out, const void* a, const void* b, size_t n, ReduceOp op, int divisor) {
  switch (op) {
    case ReduceOp::kSum: return reduce_loop<C, ReduceOp::kSum>(out, a, b, n, 1);
    case ReduceOp::kAvg: return reduce_loop<C, ReduceOp::kAvg>(out, a, b, n, divisor);
    case ReduceOp::kMax: return reduce_loop<C, ReduceOp::kMax>(out, a, b, n, 1);
    case ReduceOp::kMin: return reduce_loop<C, ReduceOp::kMin>(out, a, b, n, 1);
  }
}

template <typename C>
void scale_loop(void* buf, size_t n, int divisor) {
  using T = typename C::T;
  T* p = static_cast<T*>(buf);
  if constexpr (std::is_integral_v<decltype(C::load(T()))>) {
    for (size_t i = 0; i < n; ++i) p[i] = C::store(C::load(p[i]) / divisor);
  } else {
    float d = float(divisor);
    for (size_t i = 0; i < n; ++i) p[i] = C::store(C::load(p[i]) / d);
  }
}

template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: return f(F32{});
    case DType::BF16: return f(BF{});
    case DType::F16: return f(HF{});
    case DType::I32: return f(Int<int32_t>{});
    case DType::I64: return f(Int<int64_t>{});
    default: PT_THROW(InputError, "comm: dtype ", dtype_name(dtype), " is not supported (f32, bf16, f16, i32, i64)");
  }
}

}  // namespace

void reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  if (op == ReduceOp::kAvg) op = ReduceOp::kSum;
  dispatch(dtype, [&](auto c) { reduce_op<decltype(c)>(out, a, b, n, op, 1); });
}

void reduce_avg(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op, int divisor) {
  dispatch(dtype, [&](auto c) { reduce_op<decltype(c)>(out, a, b, n, op, divisor); });
}

void scale_avg(void* buf, size_t n, DType dtype, int divisor) {
  if (divisor == 1) return;
  dispatch(dtype, [&](auto c) { scale_loop<decltype(c)>(buf, n, divisor); });
}

size_t acc_size(DType dtype) { return dtype == DType::I64 ? 8 : 4; }

void acc_load(void* acc, const void* src, size_t n, DType dtype) {
  dispatch(dtype, [&](auto c) {
    using C = decltype(c);
    using W = decltype(C::load(typename C::T()));
    W* a = static_cast<W*>(acc);
    const auto* s = static_cast<const typename C::T*>(src);
    for (size_t i = 0; i < n; ++i) a[i] = C::load(s[i]);
  });
}

void acc_add(void* acc, const void* src, size_t n, DType dtype, ReduceOp op) {
  dispatch(dtype, [&](auto c) {
    using C = decltype(c);
    using W = decltype(C::load(typename C::T()));
    W* a = static_cast<W*>(acc);
    const auto* s = static_cast<const typename C::T*>(src);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        for (size_t i = 0; i < n; ++i) a[i] = a[i] + C::load(s[i]);
        break;
      case ReduceOp::kMax:
        for (size_t i = 0; i < n; ++i) a[i] = combine<C, ReduceOp::kMax>(a[i], C::load(s[i]));
        break;
      case ReduceOp::kMin:
        for (size_t i = 0; i < n; ++i) a[i] = combine<C, ReduceOp::kMin>(a[i], C::load(s[i]));
        break;
    }
  });
}

void acc_store(void* dst, const void* acc, size_t n, DType dtype, ReduceOp op, int divisor) {
  dispatch(dtype, [&](auto c) {
    using C = decltype(c);
    using W = decltype(C::load(typename C::T()));
    const W* a = static_cast<const W*>(acc);
    auto* d = static_cast<typename C::T*>(dst);
    if (op == ReduceOp::kAvg && divisor != 1) {
      for (size_t i = 0; i < n; ++i) d[i] = C::store(a[i] / static_cast<W>(divisor));
    } else {
      for (size_t i = 0; i < n; ++i) d[i] = C::store(a[i]);
    }
  });
}

}  // namespace paratrain::comm::kernels
