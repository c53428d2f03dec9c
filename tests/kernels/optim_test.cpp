#include <cmath>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::randn;

TEST(Optim, AdamWMatchesTorchFormula) {
  const int64_t n = 1003;
  auto p = randn(n, 1), m = std::vector<float>(n, 0.0f), v = m;
  std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-6f, wd = 0.1f;
  for (int64_t t = 1; t <= 10; ++t) {
    auto g = randn(n, 10 + t);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t);
    for (int64_t i = 0; i < n; ++i) {
      pd[i] *= 1.0 - double(lr) * wd;
      md[i] = b1 * md[i] + (1.0 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1.0 - b2) * double(g[i]) * g[i];
      double denom = std::sqrt(vd[i]) / std::sqrt(1.0 - std::pow(double(b2), double(t))) + eps;
      pd[i] -= (lr / (1.0 - std::pow(double(b1), double(t)))) * md[i] / denom;
    }
  }
  EXPECT_TRUE(all_close(p, pd, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(m, md, 1e-6, 1e-4));
  EXPECT_THROW(adamw_update(p.data(), p.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, 0), InputError);
}

TEST(Optim, SgdMomentumNesterovWeightDecay) {
  const int64_t n = 77;
  for (bool nesterov : {false, true})
    for (float damp : {0.0f, 0.25f}) {
      auto p = randn(n, 2);
      std::vector<float> buf(n, 99.0f);  // garbage: the first step must overwrite it
      std::vector<double> pd(p.begin(), p.end()), bd(n);
      const float lr = 0.1f, mom = 0.9f, wd = 0.01f;
      for (int step = 0; step < 4; ++step) {
        auto g = randn(n, 20 + step);
        sgd_update(p.data(), g.data(), buf.data(), n, lr, mom, damp, wd, nesterov, step == 0);
        for (int64_t i = 0; i < n; ++i) {
          double d = g[i] + double(wd) * pd[i];
          bd[i] = step == 0 ? d : mom * bd[i] + (1.0 - damp) * d;
          d = nesterov ? d + mom * bd[i] : bd[i];
          pd[i] -= lr * d;
        }
      }
      EXPECT_TRUE(all_close(p, pd, 1e-5, 1e-5)) << "nesterov " << nesterov << " damp " << damp;
    }
  // plain SGD, no buffer
  std::vector<float> p = {1.0f, 2.0f}, g = {0.5f, -1.0f};
  sgd_update(p.data(), g.data(), nullptr, 2, 0.1f, 0.0f, 0.0f, 0.0f, false, true);
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  EXPECT_FLOAT_EQ(p[1], 2.1f);
}

}  // namespace
}  // namespace paratrain::kernels::cpu
