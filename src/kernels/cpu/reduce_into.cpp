// The reductions into a buffer (kernels/cpu/reduce_into.h): each is its host-returning
// reduce.h / half.h kernel with the value stored, so the values are those kernels' bit for bit.
#include "paratrain/kernels/cpu/reduce_into.h"

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/elementwise.h"
#include "paratrain/kernels/cpu/half.h"
#include "paratrain/kernels/cpu/reduce.h"
#include "paratrain/kernels/cpu/softmax.h"

namespace paratrain::kernels::cpu {
namespace {

void check_count(int64_t n, const char* who) {
  if (n < 0) PT_THROW(InputError, who, ": negative element count ", n);
}

// out[i] = bits for i in [0, n), threaded as the elementwise kernels.
void fill_bits(uint16_t* out, uint16_t bits, int64_t n) {
  detail::parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = bits;
  });
}

}  // namespace

void sum_squares_into(double* slot, const float* x, int64_t n) {
  check_count(n, "sum_squares_into");
  *slot = sum_squares(x, n);
}

void nonfinite_into(int32_t* flag, const float* x, int64_t n) {
  check_count(n, "nonfinite_into");
  if (!all_finite(x, n)) *flag = 1;
}

void sum_scaled(float* out, const float* x, double factor, int64_t n) {
  check_count(n, "sum_scaled");
  *out = static_cast<float>(sum(x, n) * factor);
}

void fill_scaled(float* out, const float* g, double factor, int64_t n) {
  check_count(n, "fill_scaled");
  fill(out, static_cast<float>(static_cast<double>(*g) * factor), n);
}

void crossentropy_mean(float* out, int64_t* count, const float* losses, const int32_t* targets, int64_t N) {
  check_count(N, "crossentropy_mean");
  int64_t c = 0;
  for (int64_t i = 0; i < N; ++i) c += targets[i] != kIgnoreIndex;
  const double total = sum(losses, N);
  *count = c;
  *out = static_cast<float>(c ? total / static_cast<double>(c) : 0.0);
}

void crossentropy_grad_scale(float* dlosses, const float* g, const int64_t* count, int64_t N) {
  check_count(N, "crossentropy_grad_scale");
  const int64_t c = *count;
  const float s = c ? static_cast<float>(static_cast<double>(*g) / static_cast<double>(c)) : 0.0f;
  fill(dlosses, s, N);
}

namespace half {

template <DType T>
void sum_squares_into(double* slot, const uint16_t* x, int64_t n) {
  check_count(n, "sum_squares_into");
  *slot = sum_squares<T>(x, n);
}
template <DType T>
void nonfinite_into(int32_t* flag, const uint16_t* x, int64_t n) {
  check_count(n, "nonfinite_into");
  if (!all_finite<T>(x, n)) *flag = 1;
}
template <DType T>
void sum_scaled(float* out, const uint16_t* x, double factor, int64_t n) {
  check_count(n, "sum_scaled");
  *out = static_cast<float>(sum<T>(x, n) * factor);
}
// The rounding of Tensor::fill_ (tensor/dtype.h's f32_to_bf16 / f32_to_f16 of the float).
template <DType T>
void fill_scaled(uint16_t* out, const float* g, double factor, int64_t n) {
  check_count(n, "fill_scaled");
  const float v = static_cast<float>(static_cast<double>(*g) * factor);
  fill_bits(out, T == DType::BF16 ? ::paratrain::f32_to_bf16(v) : ::paratrain::f32_to_f16(v), n);
}

#define PT_HALF_INST(name, params) \
  template void name<DType::BF16> params; \
  template void name<DType::F16> params;
PT_HALF_INST(sum_squares_into, (double*, const uint16_t*, int64_t))
PT_HALF_INST(nonfinite_into, (int32_t*, const uint16_t*, int64_t))
PT_HALF_INST(sum_scaled, (float*, const uint16_t*, double, int64_t))
PT_HALF_INST(fill_scaled, (uint16_t*, const float*, double, int64_t))
#undef PT_HALF_INST

}  // namespace half

}  // namespace paratrain::kernels::cpu
