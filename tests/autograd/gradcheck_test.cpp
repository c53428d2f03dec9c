// Finite-difference gradient checks of every differentiable op, through the autograd engine.
//
// For f(inputs) -> out, the test takes loss = sum(out * R) with a fixed random R, computes
// d loss / d input by backward(), and compares each element with the central difference
// (loss(x + h) - loss(x - h)) / 2h evaluated in f32 (the kernels are f32) with accumulation of
// the loss in double. Tolerances are stated per check and printed on failure.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"

using namespace paratrain;

namespace {

Tensor randn(const Shape& s, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::empty(s);
  Generator g(seed);
  fill_normal(t, g, 0.0f, std);
  return t;
}

double weighted_sum(const Tensor& out, const Tensor& r) {
  auto o = out.to_vector();
  auto w = r.to_vector();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += double(o[i]) * w[i];
  return s;
}

// Checks the gradient of every input in `inputs` that requires grad.
void gradcheck(const std::string& name, std::vector<Tensor> inputs,
               const std::function<Tensor(const std::vector<Tensor>&)>& f, double h = 1e-2,
               double rtol = 2e-2, double atol = 2e-3) {
  for (auto& t : inputs)
    if (dtype_is_float(t.dtype())) t.set_requires_grad(true);
  Tensor out = f(inputs);
  Tensor r = randn(out.shape(), 99);
  Tensor loss = ops::sum(ops::mul(out, r));
  autograd::backward(loss);
  autograd::NoGradGuard ng;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!dtype_is_float(x.dtype())) continue;
    ASSERT_TRUE(x.grad().defined()) << name << ": input " << k << " got no gradient";
    auto analytic = x.grad().to_vector();
    float* p = x.data<float>();
    double max_abs = 0;
    std::vector<double> numeric(analytic.size());
    for (int64_t i = 0; i < x.numel(); ++i) {
      float orig = p[i];
      p[i] = orig + static_cast<float>(h);
      double plus = weighted_sum(f(inputs), r);
      p[i] = orig - static_cast<float>(h);
      double minus = weighted_sum(f(inputs), r);
      p[i] = orig;
      numeric[i] = (plus - minus) / (2 * h);
      max_abs = std::max(max_abs, std::fabs(numeric[i]));
    }
    for (size_t i = 0; i < analytic.size(); ++i) {
      double tol = atol * std::max(1.0, max_abs) + rtol * std::fabs(numeric[i]);
      ASSERT_NEAR(analytic[i], numeric[i], tol) << name << ": input " << k << " element " << i << " (max |grad| "
                                                << max_abs << ")";
    }
  }
}

}  // namespace

TEST(GradCheck, Elementwise) {
  gradcheck("add", {randn({3, 5}, 1), randn({3, 5}, 2)}, [](auto& in) { return ops::add(in[0], in[1]); });
  gradcheck("sub", {randn({3, 5}, 1), randn({3, 5}, 2)}, [](auto& in) { return ops::sub(in[0], in[1]); });
  gradcheck("mul", {randn({3, 5}, 1), randn({3, 5}, 2)}, [](auto& in) { return ops::mul(in[0], in[1]); });
  gradcheck("scale", {randn({7}, 1)}, [](auto& in) { return ops::scale(in[0], -2.5f); });
  gradcheck("relu", {randn({4, 9}, 3)}, [](auto& in) { return ops::relu(in[0]); }, 1e-3);
  gradcheck("gelu", {randn({4, 9}, 3)}, [](auto& in) { return ops::gelu(in[0]); });
  gradcheck("tanh", {randn({4, 9}, 3)}, [](auto& in) { return ops::tanh(in[0]); });
  gradcheck("sigmoid", {randn({4, 9}, 3)}, [](auto& in) { return ops::sigmoid(in[0]); });
  gradcheck("sum", {randn({4, 3}, 4)}, [](auto& in) { return ops::sum(in[0]); });
  gradcheck("mean", {randn({4, 3}, 4)}, [](auto& in) { return ops::mean(in[0]); });
  gradcheck("reshape", {randn({4, 3}, 4)}, [](auto& in) { return ops::reshape(in[0], {2, 6}); });
}

TEST(GradCheck, LinearAlgebra) {
  gradcheck("matmul", {randn({2, 3, 5}, 1), randn({5, 4}, 2)}, [](auto& in) { return ops::matmul(in[0], in[1]); });
  gradcheck("matmul_t", {randn({6, 5}, 1), randn({4, 5}, 2)},
            [](auto& in) { return ops::matmul(in[0], in[1], true); });
  gradcheck("bmm", {randn({2, 3, 5}, 1), randn({2, 5, 4}, 2)}, [](auto& in) { return ops::bmm(in[0], in[1]); });
  gradcheck("linear_conv1d", {randn({2, 3, 5}, 1), randn({5, 4}, 2), randn({4}, 3)},
            [](auto& in) { return ops::linear(in[0], in[1], in[2], true); });
  gradcheck("linear_torch", {randn({3, 5}, 1), randn({4, 5}, 2), randn({4}, 3)},
            [](auto& in) { return ops::linear(in[0], in[1], in[2], false); });
  gradcheck("linear_gelu_conv1d", {randn({2, 3, 5}, 1), randn({5, 4}, 2), randn({4}, 3)},
            [](auto& in) { return ops::linear_gelu(in[0], in[1], in[2], true); }, 1e-3);
  gradcheck("linear_gelu_torch", {randn({3, 5}, 1), randn({4, 5}, 2), randn({4}, 3)},
            [](auto& in) { return ops::linear_gelu(in[0], in[1], in[2], false); }, 1e-3);
}

TEST(GradCheck, NormAndSoftmax) {
  gradcheck("layer_norm", {randn({3, 8}, 1), randn({8}, 2), randn({8}, 3)},
            [](auto& in) { return ops::layer_norm(in[0], in[1], in[2]); }, 1e-2, 3e-2, 3e-3);
  gradcheck("softmax", {randn({3, 7}, 1)}, [](auto& in) { return ops::softmax(in[0]); });
  gradcheck("log_softmax", {randn({3, 7}, 1)}, [](auto& in) { return ops::log_softmax(in[0]); });
}

TEST(GradCheck, EmbeddingsAttentionLoss) {
  Tensor tokens = Tensor::from_vector_i32({1, 4, 2, 2, 0, 3}, {2, 3});
  gradcheck("embedding", {tokens, randn({5, 4}, 1)}, [](auto& in) { return ops::embedding(in[0], in[1]); });
  gradcheck("gpt_embedding", {tokens, randn({5, 4}, 1), randn({6, 4}, 2)},
            [](auto& in) { return ops::gpt_embedding(in[0], in[1], in[2]); });
  gradcheck("attention", {randn({2, 5, 12}, 7, 0.5f)},
            [](auto& in) { return ops::causal_self_attention(in[0], 2); });
  Tensor targets = Tensor::from_vector_i32({1, -1, 4, 0, 2, 3}, {2, 3});
  gradcheck("cross_entropy", {randn({2, 3, 5}, 3), targets},
            [](auto& in) { return ops::cross_entropy(in[0], in[1]); });
  // the tied head + loss, V = 5 in rows of 64
  gradcheck("linear_cross_entropy", {randn({2, 3, 4}, 4), randn({5, 4}, 5), targets},
            [](auto& in) { return ops::linear_cross_entropy(in[0], in[1], in[2]); });
}

TEST(GradCheck, Images) {
  gradcheck("conv2d", {randn({2, 2, 5, 5}, 1), randn({3, 2, 3, 3}, 2, 0.5f), randn({3}, 3)},
            [](auto& in) { return ops::conv2d(in[0], in[1], in[2], 1, 1); });
  gradcheck("conv2d_stride2", {randn({1, 2, 6, 6}, 1), randn({2, 2, 3, 3}, 2, 0.5f), randn({2}, 3)},
            [](auto& in) { return ops::conv2d(in[0], in[1], in[2], 2, 0); });
  gradcheck("max_pool2d", {randn({2, 2, 4, 4}, 5)}, [](auto& in) { return ops::max_pool2d(in[0], 2, 2); }, 1e-3);
}

TEST(GradCheck, DropoutMatchesItsMask) {
  Generator g(5);
  Tensor x = randn({1000}, 1);
  x.set_requires_grad(true);
  Tensor y = ops::dropout(x, 0.25f, true, g);
  autograd::backward(ops::sum(y));
  auto xv = x.to_vector(), yv = y.to_vector(), gv = x.grad().to_vector();
  int zeros = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0.0f) {
      zeros++;
      EXPECT_EQ(gv[i], 0.0f);
    } else {
      EXPECT_NEAR(yv[i], xv[i] / 0.75f, 1e-6);
      EXPECT_NEAR(gv[i], 1 / 0.75f, 1e-6);
    }
  }
  EXPECT_NEAR(zeros, 250, 50);
}
