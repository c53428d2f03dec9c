// ops::linear_cross_entropy, the tied LM head and its loss in one op (Embedding::tied_loss):
// on the CPU it is cross_entropy(matmul(x, w^T)) to the bit, loss and both gradients, in f32 and
// under bf16 autocast, whether or not V needs the padded row stride; its errors; a GPT's loss
// is its node. (On a GPU against the CPU: tests/gpu/train_on_gpu_test.cpp.)
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "support/error_of.h"

using namespace paratrain;

namespace {

Tensor randn(const Shape& s, uint64_t seed) {
  Tensor x = Tensor::empty(s);
  Generator g(seed);
  fill_normal(x, g, 0.0f, 1.0f);
  return x;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const std::vector<float> x = a.to(DType::F32).to_vector(), y = b.to(DType::F32).to_vector();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << what << " element " << i;
}

const char* node_name(const Tensor& t) {
  const auto& meta = t.autograd_meta_ptr();
  return meta && meta->grad_fn ? meta->grad_fn->name() : "(leaf)";
}

}  // namespace

TEST(LinearCrossEntropy, RowStrideIsVRoundedUpTo64) {
  EXPECT_EQ(ops::logits_row_stride(1), 64);
  EXPECT_EQ(ops::logits_row_stride(64), 64);
  EXPECT_EQ(ops::logits_row_stride(65), 128);
  EXPECT_EQ(ops::logits_row_stride(50257), 50304);  // GPT-2's, as llm.c pads it
}

TEST(LinearCrossEntropy, IsCrossEntropyOfTheTiedLogitsBitForBit) {
  for (bool bf16 : {false, true})
    for (int64_t V : {64, 77}) {  // rows already aligned, and padded to 128
      const std::string what = std::string(bf16 ? "bf16" : "f32") + " V=" + std::to_string(V);
      const int64_t C = 24;
      const Tensor x0 = randn({2, 5, C}, 1), w0 = randn({V, C}, 2);
      std::vector<int32_t> t(10);
      for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 37 + 5) % V);
      t[3] = -1;  // ignored
      const Tensor targets = Tensor::from_vector_i32(t, {2, 5});
      Tensor loss[2], gx[2], gw[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = x0.clone(), w = w0.clone();
        x.set_requires_grad(true);
        w.set_requires_grad(true);
        {
          autograd::AutocastGuard cast(bf16 ? DType::BF16 : DType::F32);
          loss[fused] = fused ? ops::linear_cross_entropy(x, w, targets)
                              : ops::cross_entropy(ops::matmul(x, w, /*trans_b=*/true), targets);
        }
        EXPECT_STREQ(node_name(loss[fused]), fused ? "linear_cross_entropy" : "cross_entropy") << what;
        EXPECT_EQ(loss[fused].dtype(), DType::F32) << what;
        autograd::backward(ops::scale(loss[fused], 3.0f));
        gx[fused] = x.grad(), gw[fused] = w.grad();
      }
      expect_same_bits(loss[1], loss[0], what + " loss");
      expect_same_bits(gx[1], gx[0], what + " d input");
      expect_same_bits(gw[1], gw[0], what + " d weight");
      EXPECT_GT(loss[1].item(), 1.0f) << what;  // a real loss: random logits over V classes
    }
}

TEST(LinearCrossEntropy, NamesMisfitShapes) {
  const Tensor x = randn({3, 8}, 1), w = randn({11, 8}, 2), t = Tensor::from_vector_i32({1, 2, 3}, {3});
  using paratrain::testing::error_of;
  const std::pair<std::function<void()>, std::string> cases[] = {
      {[&] { ops::linear_cross_entropy(x, randn({11, 7}, 2), t); },
       "linear_cross_entropy: input [3, 8] does not fit weight [11, 7]"},
      {[&] { ops::linear_cross_entropy(x, w, Tensor::from_vector_i32({1, 2}, {2})); },
       "linear_cross_entropy: 2 targets for 3 rows of input [3, 8]"},
      {[&] { ops::linear_cross_entropy(x, randn({0, 8}, 2), t); },
       "linear_cross_entropy: the weight has no rows (V = 0)"},
      {[&] { ops::linear_cross_entropy(x, w, Tensor::from_vector_i32({1, 11, 3}, {3})); },  // target >= V
       "crossentropy_forward: target 11 at row 1 is outside [0,11)"},
  };
  for (const auto& [call, want] : cases) {
    const std::string got = error_of<InputError>(call);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot:  " << got;
  }
}

TEST(LinearCrossEntropy, IsTheGptLossNode) {
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-nano");
  cfg.vocab_size = 77;
  nn::GPT model(cfg, 3);
  const Tensor tokens = Tensor::from_vector_i32({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor targets = Tensor::from_vector_i32({2, 3, 4, 5, 6, 76}, {2, 3});
  const Tensor loss = model.loss(tokens, targets);
  EXPECT_STREQ(node_name(loss), "linear_cross_entropy");
  // the same number as the logits' cross-entropy
  EXPECT_EQ(loss.item(), ops::cross_entropy(model.forward(tokens), targets).item());
}
