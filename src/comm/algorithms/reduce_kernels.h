// Elementwise reduction loops used by every algorithm. Written as plain loops over
// contiguous arrays so the compiler vectorises them (-O3 -march=native: AVX-512 where the
// CPU has it); bf16/f16 are widened to f32, combined, and rounded back once per call.
//
// Accumulators (acc_*) keep a running result in the wide type (f32 for bf16/f16/f32, the
// integer type itself otherwise) so the rank-ordered algorithm rounds a 16-bit result only
// once, after the last rank's contribution.
#pragma once

#include <cstddef>

#include "paratrain/comm/types.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm::kernels {

// out[i] = a[i] op b[i]; out may alias a or b.
void reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op);
// buf[i] /= divisor (the last step of kAvg).
void scale_avg(void* buf, size_t n, DType dtype, int divisor);
// out[i] = (a[i] op b[i]) / divisor  (reduce and average in one pass; divisor 1 = plain).
void reduce_avg(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op, int divisor);

// Bytes of one accumulator element for dtype (4 for f32/bf16/f16/i32, 8 for i64).
size_t acc_size(DType dtype);
void acc_load(void* acc, const void* src, size_t n, DType dtype);
void acc_add(void* acc, const void* src, size_t n, DType dtype, ReduceOp op);
// dst = acc (/ divisor for kAvg), rounded to dtype.
void acc_store(void* dst, const void* acc, size_t n, DType dtype, ReduceOp op, int divisor);

}  // namespace paratrain::comm::kernels
