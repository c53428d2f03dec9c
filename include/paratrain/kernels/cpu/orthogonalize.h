// Gram-Schmidt on the columns of a tall, thin matrix: PowerSGD's P factor
// (parallel/grad_compression.h) between its two all-reduces.
//
// The columns are made orthonormal in place, in double precision, with a second
// orthogonalisation pass ("twice is enough": it removes what rounding left of the first when
// a column is nearly dependent on the earlier ones). A column that is exactly zero after
// projection stays zero instead of being divided by zero (a vanishing gradient); NaN and inf
// propagate. The CUDA kernel of the same table (kernels/cuda/basic.h) follows these rules
// with its sums in another order, so its columns match to double rounding before the f32
// store. Thread-safety: a pure function of its buffer (callers may run it on different P
// concurrently); it keeps nothing between calls.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// P (n, r), row-major: column k is P[i * r + k]. Overwrite.
void orthogonalize_columns(float* P, int64_t n, int64_t r);

}  // namespace paratrain::kernels::cpu
