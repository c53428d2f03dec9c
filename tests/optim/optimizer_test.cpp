#include "paratrain/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace paratrain;
using optim::LRSchedule;

TEST(LRSchedule, LinearWarmupThenCosineToMinLr) {
  LRSchedule s;
  s.kind = LRSchedule::Kind::Cosine;
  s.lr = 1.0, s.min_lr = 0.1, s.warmup = 4, s.total = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);                       // start of the decay
  EXPECT_NEAR(s.at(9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_NEAR(s.at(14), 0.1, 1e-12);                    // the end
  EXPECT_NEAR(s.at(100), 0.1, 1e-12);                   // stays there
  s.kind = LRSchedule::Kind::Constant;
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_THROW(LRSchedule::parse("wavy"), InputError);
}

TEST(Clipping, GlobalNormAsTorch) {
  Tensor a = Tensor::zeros({2}).set_requires_grad(true), b = Tensor::zeros({1}).set_requires_grad(true);
  a.set_grad(Tensor::from_vector({3, 0}, {2}));
  b.set_grad(Tensor::from_vector({4}, {1}));
  optim::NamedParams p = {{"a", a}, {"b", b}};
  const double norm = optim::grad_norm(p);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  optim::clip_grad_norm(p, 10.0, norm);  // below the limit: unchanged
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{3, 0}));
  optim::clip_grad_norm(p, 1.0, norm);
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_FLOAT_EQ(a.grad().to_vector()[0], 3 * coef);
  EXPECT_FLOAT_EQ(b.grad().to_vector()[0], 4 * coef);
}

TEST(AdamW, DecaysTwoDimensionalWeightsOnlyAndSkipsParametersWithoutGradients) {
  Tensor w = Tensor::full({2, 2}, 1.0).set_requires_grad(true);
  Tensor bias = Tensor::full({2}, 1.0).set_requires_grad(true);
  Tensor unused = Tensor::full({2}, 1.0).set_requires_grad(true);
  w.set_grad(Tensor::zeros({2, 2}));
  bias.set_grad(Tensor::zeros({2}));
  optim::AdamWOptions o;
  o.lr = 0.1, o.weight_decay = 0.5;
  optim::AdamW opt({{"w", w}, {"bias", bias}, {"unused", unused}}, o);
  opt.step();
  EXPECT_FLOAT_EQ(w.to_vector()[0], 1.0f * (1 - 0.1f * 0.5f));  // zero gradient: only the decay
  EXPECT_FLOAT_EQ(bias.to_vector()[0], 1.0f);                     // 1-D: no decay
  EXPECT_FLOAT_EQ(unused.to_vector()[0], 1.0f);
  auto state = opt.state_dict();
  EXPECT_EQ(state.count("w.exp_avg"), 1u);
  EXPECT_EQ(state.count("w.exp_avg_sq"), 1u);
  std::map<std::string, Tensor> bad = state;
  bad["w.exp_avg"] = Tensor::zeros({3});
  EXPECT_THROW(opt.load_state_dict(bad, 1), InputError);
}

TEST(AdamW, PiecesOfParametersDecayByTheWholeParametersDims) {
  // ZeRO gives the optimizer 1-D pieces; set_param_dims says which whole parameter is 2-D.
  Tensor w = Tensor::full({2, 2}, 1.0);
  Tensor piece = w.view({-1}).narrow(0, 1, 2);  // elements 1 and 2 of a 2-D weight
  Tensor bias = Tensor::full({2}, 1.0);
  piece.set_grad(Tensor::zeros({2}));
  bias.set_grad(Tensor::zeros({2}));
  optim::AdamWOptions o;
  o.lr = 0.1, o.weight_decay = 0.5;
  optim::AdamW opt({{"w", piece}, {"bias", bias}}, o);
  opt.set_param_dims({2, 1});
  opt.step();
  const auto v = w.to_vector();
  EXPECT_FLOAT_EQ(v[0], 1.0f);  // not in the piece
  EXPECT_FLOAT_EQ(v[1], 1.0f * (1 - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(v[2], 1.0f * (1 - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(v[3], 1.0f);
  EXPECT_FLOAT_EQ(bias.to_vector()[0], 1.0f);
  EXPECT_THROW(opt.set_param_dims({2}), InputError);  // one value per entry
}
