// Gram-Schmidt on P's columns in double (kernels/cpu/orthogonalize.h).
#include "paratrain/kernels/cpu/orthogonalize.h"

#include <cmath>
#include <vector>

#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {

void orthogonalize_columns(float* P, int64_t n, int64_t r) {
  if (n < 0 || r < 0) PT_THROW(InputError, "orthogonalize_columns: negative size ", n, " x ", r);
  // Columns into double, column-major, so each is contiguous.
  std::vector<double> c(static_cast<size_t>(n * r));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < r; ++k) c[k * n + i] = P[i * r + k];
  for (int64_t k = 0; k < r; ++k) {
    double* ck = c.data() + k * n;
    // Subtract the projections on the earlier (unit) columns, twice.
    for (int pass = 0; pass < 2 && k > 0; ++pass)
      for (int64_t j = 0; j < k; ++j) {
        const double* cj = c.data() + j * n;
        double d = 0;
        for (int64_t i = 0; i < n; ++i) d += cj[i] * ck[i];
        for (int64_t i = 0; i < n; ++i) ck[i] -= d * cj[i];
      }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += ck[i] * ck[i];
    norm = std::sqrt(norm);
    const double inv = norm == 0 ? 0.0 : 1.0 / norm;
    for (int64_t i = 0; i < n; ++i) ck[i] *= inv;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < r; ++k) P[i * r + k] = static_cast<float>(c[k * n + i]);
}

}  // namespace paratrain::kernels::cpu
