// Element-wise checks of a kernel's result against a reference (GPU or emulated kernels against
// the CPU's), each reporting at most five failing elements, then their count:
//  - expect_same_bits(got, want, what): the same bits in every element (NaNs included), for
//    any element type (float, bf16/f16 bits, int32 indices);
//  - expect_close(got, want, tol, what[, base]): where the order of sums differs. With
//    M = max |want| over the tensor, each element must satisfy
//      |got - want| <= tol.rtol |want| + tol.atol_frac M       (NaN fails);
//    with `base` (the values a gradient held before the kernel added to it), the increments
//    got - base and want - base are compared instead (M their largest), with 4 f32 ulps of
//    |base| for the adds themselves.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace paratrain::test {

template <typename S>
void expect_same_bits(const std::vector<S>& got, const std::vector<S>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(S)) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << +got[i] << ", want " << +want[i];
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements differ";
}

struct Tolerance {
  double rtol, atol_frac;
};

inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tolerance tol,
                         const std::string& what, const std::vector<float>* base = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  auto inc = [&](const std::vector<float>& v, size_t i) { return base ? v[i] - (*base)[i] : v[i]; };
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(inc(want, i))));
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = inc(got, i), w = inc(want, i);
    double allowed = tol.rtol * std::fabs(w) + tol.atol_frac * m;
    if (base) allowed += 4 * std::ldexp(std::fabs(static_cast<double>((*base)[i])), -23);
    if (!(std::fabs(g - w) <= allowed) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (|diff| "
                    << std::fabs(g - w) << " > " << allowed << ", max |want| " << m << ")";
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements out of tolerance";
}

}  // namespace paratrain::test
