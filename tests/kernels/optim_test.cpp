#include <cmath>
#include <cstring>
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

// The multi-tensor update is the single-tensor calls in list order, bit for bit: sizes from
// 0 to thousands, each tensor with its own weight decay.
TEST(Optim, AdamWMultiTensorIsTheSingleTensorCallsBitForBit) {
  const std::vector<int64_t> sizes = {5, 0, 1003, 1, 4096, 77};
  std::vector<std::vector<float>> p, g, m, v;
  for (size_t k = 0; k < sizes.size(); ++k) {
    p.push_back(randn(sizes[k], 20 + k)), g.push_back(randn(sizes[k], 40 + k));
    m.push_back(std::vector<float>(sizes[k], 0.01f)), v.push_back(std::vector<float>(sizes[k], 0.002f));
  }
  auto p1 = p, m1 = m, v1 = v;
  std::vector<AdamWTensor> list;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const float wd = k % 2 ? 0.0f : 0.1f;
    adamw_update(p1[k].data(), g[k].data(), m1[k].data(), v1[k].data(), sizes[k], 1e-3f, 0.9f, 0.95f, 1e-8f, wd, 3);
    list.push_back({p[k].data(), g[k].data(), m[k].data(), v[k].data(), sizes[k], wd});
  }
  adamw_update_multi(list.data(), static_cast<int64_t>(list.size()), 1e-3f, 0.9f, 0.95f, 1e-8f, 3);
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(0, std::memcmp(p[k].data(), p1[k].data(), sizes[k] * 4)) << "tensor " << k;
    EXPECT_EQ(0, std::memcmp(m[k].data(), m1[k].data(), sizes[k] * 4)) << "tensor " << k;
    EXPECT_EQ(0, std::memcmp(v[k].data(), v1[k].data(), sizes[k] * 4)) << "tensor " << k;
  }
  EXPECT_THROW(adamw_update_multi(list.data(), 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0), InputError);
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

// ZeRO updates each rank's pieces of a tensor separately: the bits must not depend on where
// an element sits (vector body or tail, which thread's chunk).
TEST(Optim, UpdatingInPiecesGivesTheSameBitsAsWhole) {
  const int64_t n = 1003;
  const std::vector<int64_t> cuts = {0, 5, 13, 334, 669, 1000, n};
  for (bool adamw : {true, false}) {
    auto p_whole = randn(n, 3), p_parts = p_whole;
    std::vector<float> m1(n, 0.0f), v1(n, 0.0f), m2 = m1, v2 = v1;
    for (int64_t t = 1; t <= 5; ++t) {
      auto g = randn(n, 40 + t);
      if (adamw) {
        adamw_update(p_whole.data(), g.data(), m1.data(), v1.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        for (size_t c = 0; c + 1 < cuts.size(); ++c)
          adamw_update(p_parts.data() + cuts[c], g.data() + cuts[c], m2.data() + cuts[c], v2.data() + cuts[c],
                       cuts[c + 1] - cuts[c], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
      } else {
        sgd_update(p_whole.data(), g.data(), m1.data(), n, 0.1f, 0.9f, 0.0f, 0.01f, false, t == 1);
        for (size_t c = 0; c + 1 < cuts.size(); ++c)
          sgd_update(p_parts.data() + cuts[c], g.data() + cuts[c], m2.data() + cuts[c], cuts[c + 1] - cuts[c], 0.1f,
                     0.9f, 0.0f, 0.01f, false, t == 1);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&p_whole[i], &p_parts[i], sizeof(float)), 0)
          << (adamw ? "adamw" : "sgd") << " element " << i << ": " << p_whole[i] << " vs " << p_parts[i];
      ASSERT_EQ(std::memcmp(&m1[i], &m2[i], sizeof(float)), 0) << (adamw ? "adamw" : "sgd") << " state " << i;
    }
  }
}

}  // namespace
}  // namespace paratrain::kernels::cpu
