// Reductions over flat arrays and along one axis.
//
// Full reductions accumulate in double (sum, sum_squares, for loss sums and the global
// gradient norm) and are threaded; the result does not depend on the thread count
// (fixed-size chunks combined in order), so it is reproducible.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// x (n)
double sum(const float* x, int64_t n);
// sum of x[i]^2, for gradient norms
double sum_squares(const float* x, int64_t n);
// max of x; -inf for n == 0; NaN if any element is NaN
float max(const float* x, int64_t n);
// true when no element is inf or NaN (dynamic loss scaling)
bool all_finite(const float* x, int64_t n);

// inp (outer, n, inner), out (outer, inner): out[o,i] = sum_k inp[o,k,i]  (overwrite)
void sum_axis(float* out, const float* inp, int64_t outer, int64_t n, int64_t inner);
// inp (N,C), out (C): out[c] = sum_n inp[n,c]  (sum over rows; overwrite)
void sum_rows(float* out, const float* inp, int64_t N, int64_t C);
// inp (N,C), out (N): out[n] = sum_c inp[n,c]  (sum over columns; overwrite)
void sum_cols(float* out, const float* inp, int64_t N, int64_t C);
// inp (N,C), out (N): out[n] = max_c inp[n,c]; argmax (N) optional (nullptr), first max wins
void max_cols(float* out, int32_t* argmax, const float* inp, int64_t N, int64_t C);

}  // namespace paratrain::kernels::cpu
