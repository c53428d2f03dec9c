// Shared helpers of the kernel tests: seeded random arrays, closeness checks that print
// the tolerance, max difference and first values, and a central-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/threads.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace paratrain::kernels::cpu::testing {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// |a - b| <= atol + rtol * |b| elementwise; reports the worst element.
template <typename A, typename B>
::testing::AssertionResult all_close(const A& a, const B& b, double atol, double rtol) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " vs " << b.size();
  double worst = 0.0;
  size_t wi = 0;
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    double lim = atol + rtol * std::abs(static_cast<double>(b[i]));
    if (!(d <= lim)) ok = false;
    if (!(d <= worst) || d != d) {
      worst = d;
      wi = i;
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << "atol " << atol << " rtol " << rtol << ": max diff " << worst << " at " << wi << " (got "
    << a[wi] << ", want " << b[wi] << "); first values:";
  for (size_t i = 0; i < std::min<size_t>(4, a.size()); ++i) f << " " << a[i] << "/" << b[i];
  return f;
}

// Central differences of loss() with respect to x[i] for up to max_checks indices spread
// over x, compared with analytic[i]. loss() reads x (which the check perturbs in place).
inline ::testing::AssertionResult grad_check(std::vector<float>& x,
                                             const std::vector<float>& analytic,
                                             const std::function<double()>& loss, float eps,
                                             double atol, double rtol, size_t max_checks = 40) {
  if (x.size() != analytic.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t step = std::max<size_t>(1, x.size() / max_checks);
  // Many tiny forward calls: one thread keeps them fast on a loaded machine.
  const int saved_threads = num_threads();
  set_num_threads(1);
  struct Restore {
    int n;
    ~Restore() { set_num_threads(n); }
  } restore{saved_threads};
  for (size_t i = 0; i < x.size(); i += step) {
    const float orig = x[i];
    x[i] = orig + eps;
    double lp = loss();
    x[i] = orig - eps;
    double lm = loss();
    x[i] = orig;
    double fd = (lp - lm) / (2.0 * eps);
    double d = std::abs(fd - analytic[i]);
    if (!(d <= atol + rtol * std::max(std::abs(fd), std::abs(static_cast<double>(analytic[i])))))
      return ::testing::AssertionFailure()
             << "grad mismatch at " << i << ": finite diff " << fd << " analytic " << analytic[i]
             << " (eps " << eps << " atol " << atol << " rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess();
}

// sum_i w[i] * out[i] in double: the scalar loss whose gradient wrt out is w.
inline double dot(const std::vector<float>& w, const std::vector<float>& out) {
  double s = 0.0;
  for (size_t i = 0; i < w.size(); ++i) s += static_cast<double>(w[i]) * out[i];
  return s;
}

}  // namespace paratrain::kernels::cpu::testing
