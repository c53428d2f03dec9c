#include <gtest/gtest.h>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"

using namespace paratrain;

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor w = Tensor::from_vector({1, 2, 3}, {3}).set_requires_grad(true);
  for (int i = 0; i < 2; ++i) autograd::backward(ops::sum(ops::mul(w, w)));
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{4, 8, 12}));
}

TEST(Engine, SharedInputsSumTheirGradients) {
  Tensor x = Tensor::from_vector({1, -2}, {2}).set_requires_grad(true);
  Tensor y = ops::add(ops::scale(x, 3.0f), ops::mul(x, x));  // 3x + x^2
  autograd::backward(ops::sum(y));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5, -1}));
}

TEST(Engine, HooksFireOnceWhenGradientIsFinal) {
  Tensor a = Tensor::from_vector({1, 2}, {2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector({3, 4}, {2}).set_requires_grad(true);
  std::vector<std::string> fired;
  std::vector<float> seen;
  autograd::register_grad_ready_hook(a, [&](Tensor& g) {
    fired.push_back("a");
    seen = g.to_vector();
  });
  autograd::register_grad_ready_hook(b, [&](Tensor&) { fired.push_back("b"); });
  // a is used twice (early and late in the graph); its hook must fire after both uses.
  Tensor y = ops::mul(ops::add(a, b), a);
  autograd::backward(ops::sum(y));
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "a"), 1);
  EXPECT_EQ(seen, (std::vector<float>{2 * 1 + 3, 2 * 2 + 4}));
}

TEST(Engine, NoGradScopeRecordsNothing) {
  Tensor w = Tensor::from_vector({1, 2}, {2}).set_requires_grad(true);
  {
    autograd::NoGradGuard g;
    Tensor y = ops::mul(w, w);
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_TRUE(ops::mul(w, w).requires_grad());
}

TEST(Engine, BackwardOfConstantIsAnInputError) {
  Tensor c = Tensor::from_vector({1}, {1});
  EXPECT_THROW(autograd::backward(ops::sum(c)), InputError);
}
