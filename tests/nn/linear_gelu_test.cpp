// ops::linear_gelu and Linear::forward_gelu: the fused linear + GELU a GPT MLP's c_fc runs.
// On the CPU it is the same kernels as gelu(linear(...)), so the values and every gradient are
// the same bits, in f32 and bf16 and in both weight layouts; a GPT MLP's graph holds the fused
// node; a Linear subclass that overrides forward (a row-parallel layer) keeps its forward.
// (The CUDA kernel, cuBLASLt's GELU_AUX_BIAS epilogue: tests/gpu/basic_kernels_test.cpp.)
#include <gtest/gtest.h>

#include <string>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/nn/layers.h"

using namespace paratrain;

namespace {

Tensor randn(const Shape& s, uint64_t seed, DType t) {
  Tensor x = Tensor::empty(s);
  Generator g(seed);
  fill_normal(x, g, 0.0f, 1.0f);
  return x.to(t);
}

std::vector<float> f32(const Tensor& t) { return t.to(DType::F32).to_vector(); }

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> x = f32(a), y = f32(b);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << what << " element " << i;
}

const char* node_name(const Tensor& t) {
  const auto& meta = t.autograd_meta_ptr();
  return meta && meta->grad_fn ? meta->grad_fn->name() : "(leaf)";
}

}  // namespace

TEST(LinearGelu, IsGeluOfLinearBitForBitWithEveryGradient) {
  for (DType t : {DType::F32, DType::BF16})
    for (bool in_out : {true, false}) {
      const std::string what = std::string(dtype_name(t)) + (in_out ? " (in, out)" : " (out, in)");
      const int64_t K = 24, N = 40;
      const Tensor x0 = randn({2, 5, K}, 1, t), w0 = randn(in_out ? Shape{K, N} : Shape{N, K}, 2, t),
                   b0 = randn({N}, 3, t), r = randn({2, 5, N}, 4, t);
      Tensor grads[2][3];
      Tensor outs[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = x0.clone(), w = w0.clone(), b = b0.clone();
        for (Tensor* p : {&x, &w, &b}) p->set_requires_grad(true);
        outs[fused] = fused ? ops::linear_gelu(x, w, b, in_out) : ops::gelu(ops::linear(x, w, b, in_out));
        EXPECT_STREQ(node_name(outs[fused]), fused ? "linear_gelu" : "gelu") << what;
        autograd::backward(ops::sum(ops::mul(outs[fused], r)));
        grads[fused][0] = x.grad(), grads[fused][1] = w.grad(), grads[fused][2] = b.grad();
      }
      expect_same_bits(outs[1], outs[0], what + " out");
      for (int i = 0; i < 3; ++i) expect_same_bits(grads[1][i], grads[0][i], what + " grad " + std::to_string(i));
      // and it is the GELU of the affine map, not the map: some outputs are well below it
      const std::vector<float> o = f32(outs[1]), lin = f32(ops::linear(x0, w0, b0, in_out));
      int shrunk = 0;
      for (size_t i = 0; i < o.size(); ++i) shrunk += lin[i] < -0.5f && o[i] > lin[i] + 0.25f;
      EXPECT_GT(shrunk, 10) << what;
    }
}

TEST(LinearGelu, NeedsTheBiasAndFittingShapes) {
  const Tensor x = randn({3, 4}, 1, DType::F32), w = randn({4, 6}, 2, DType::F32);
  try {
    ops::linear_gelu(x, w, Tensor(), true);
    ADD_FAILURE() << "linear_gelu ran without a bias";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("linear_gelu: the bias is required"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::linear_gelu(x, w, randn({5}, 3, DType::F32), true), InputError);
  EXPECT_THROW(ops::linear_gelu(x, randn({5, 6}, 2, DType::F32), randn({6}, 3, DType::F32), true), InputError);
}

TEST(LinearGelu, GptMlpRunsTheFusedNodeAndALinearSubclassKeepsItsForward) {
  nn::GPTConfig cfg;
  cfg.n_embd = 16, cfg.n_head = 2, cfg.n_layer = 1, cfg.block_size = 8, cfg.vocab_size = 32;
  Generator gen(7);
  nn::GPTMLP mlp(cfg, gen);
  const Tensor x = randn({2, 3, 16}, 5, DType::F32);
  const Tensor y = mlp.forward(x);
  ASSERT_STREQ(node_name(y), "linear");  // c_proj
  const auto& into_c_proj = y.autograd_meta_ptr()->grad_fn->next_edges()[0];
  ASSERT_TRUE(into_c_proj.node);
  EXPECT_STREQ(into_c_proj.node->name(), "linear_gelu");
  expect_same_bits(y, mlp.c_proj->forward(ops::gelu(mlp.c_fc->forward(x))), "mlp");

  // A subclass whose forward is more than the GEMM: forward_gelu is gelu(its forward).
  struct Doubled : nn::Linear {
    Doubled(Generator& g) : nn::Linear(16, 8, true, nn::WeightLayout::InOut, g) {}
    Tensor forward(const Tensor& in) const override { return ops::scale(nn::Linear::forward(in), 2.0f); }
  };
  const Doubled d(gen);
  const Tensor z = d.forward_gelu(x);
  EXPECT_STREQ(node_name(z), "gelu");
  expect_same_bits(z, ops::gelu(d.forward(x)), "subclass");
}
