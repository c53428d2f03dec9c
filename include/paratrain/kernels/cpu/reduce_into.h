// Reductions that write their result into a buffer instead of returning it to the host, so
// that on a GPU (the CUDA kernels of the same names, src/kernels/cuda/reduce_into.h) the
// value stays in device memory and nothing waits: the loss, the gradient norm's terms and the
// non-finite flag are read back once per step, not once per tensor or micro-batch.
//
// Each CPU kernel here computes exactly the value its host-returning counterpart gives
// (reduce.h; the same chunked double sums, bit for bit), so a CPU run is unchanged whether
// an op reads the value back or keeps it in the buffer. Result buffers are one element
// unless the legend says otherwise; they may not alias the inputs. Negative sizes throw
// InputError.
// Thread-safety: as reduce.h (calls on distinct buffers are safe; each may use the kernel
// thread pool).
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {

// x (n): *slot = sum_squares(x, n)  (double; for the global gradient norm)
void sum_squares_into(double* slot, const float* x, int64_t n);
// x (n): *flag = 1 when an element of x is inf or NaN; otherwise *flag is left as it is, so
// one flag (zeroed by the caller) collects the check of many tensors (dynamic loss scaling)
void nonfinite_into(int32_t* flag, const float* x, int64_t n);
// x (n), out (1) f32: *out = float(sum(x, n) * factor)  (the sum and mean ops' value)
void sum_scaled(float* out, const float* x, double factor, int64_t n);
// g (1) f32, out (n): out[i] = float(double(*g) * factor)  (the sum and mean ops' gradient)
void fill_scaled(float* out, const float* g, double factor, int64_t n);

// The mean of a cross-entropy over its non-ignored rows (softmax.h's crossentropy_forward):
// losses (N), targets (N) int32, out (1), count (1) int64:
//   *count = the number of targets != kIgnoreIndex;
//   *out = float(sum(losses, N) / double(*count)), 0 when *count is 0.
void crossentropy_mean(float* out, int64_t* count, const float* losses, const int32_t* targets, int64_t N);
// Its backward: g (1) the upstream gradient of the mean, count (1) from crossentropy_mean,
// dlosses (N) = float(double(*g) / double(*count)), 0 when *count is 0  (OVERWRITES).
void crossentropy_grad_scale(float* dlosses, const float* g, const int64_t* count, int64_t N);

namespace half {
// The same for x and out in T = BF16, F16 (kernels/cpu/half.h): sums of the widened values as
// half::sum / half::sum_squares; fill_scaled rounds float(double(*g) * factor) to T once (as
// Tensor::fill_ does). g, slot, flag and sum_scaled's out keep their types.
template <DType T> void sum_squares_into(double* slot, const uint16_t* x, int64_t n);
template <DType T> void nonfinite_into(int32_t* flag, const uint16_t* x, int64_t n);
template <DType T> void sum_scaled(float* out, const uint16_t* x, double factor, int64_t n);
template <DType T> void fill_scaled(uint16_t* out, const float* g, double factor, int64_t n);
}  // namespace half

}  // namespace paratrain::kernels::cpu
