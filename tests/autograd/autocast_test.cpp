// Autocast: the policy decides each op's precision, parameters are cast once and reused
// until the cache is invalidated, and gradients reach f32 parameters as f32.
#include <gtest/gtest.h>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"

using namespace paratrain;
using autograd::AutocastGuard;
using autograd::autocast_input;
using autograd::CastPolicy;

TEST(Autocast, PolicyTableCoversEveryOp) {
  for (const char* op : {"linear", "matmul", "bmm", "causal_self_attention", "conv2d"})
    EXPECT_EQ(autograd::autocast_policy(op), CastPolicy::kLowerPrecision) << op;
  for (const char* op : {"layer_norm", "softmax", "log_softmax"})
    EXPECT_EQ(autograd::autocast_policy(op), CastPolicy::kFloat32) << op;
  for (const char* op : {"add", "sub", "mul"}) EXPECT_EQ(autograd::autocast_policy(op), CastPolicy::kPromote) << op;
  for (const char* op : {"scale", "relu", "gelu", "tanh", "sigmoid", "sum", "mean", "reshape", "dropout", "max_pool2d",
                         "embedding", "gpt_embedding", "to_dtype", "cross_entropy"})
    EXPECT_EQ(autograd::autocast_policy(op), CastPolicy::kKeep) << op;
  EXPECT_THROW(autograd::autocast_policy("no_such_op"), InternalError);
}

TEST(Autocast, InputsAreCastByThePolicyOnlyInsideTheGuard) {
  Tensor x = Tensor::from_vector({1.0f, 2.5f, -3.0f}, {3});
  EXPECT_EQ(autocast_input("linear", x).dtype(), DType::F32);  // off
  {
    AutocastGuard g(DType::BF16);
    EXPECT_TRUE(autograd::autocast_enabled());
    Tensor xb = autocast_input("linear", x);
    EXPECT_EQ(xb.dtype(), DType::BF16);
    EXPECT_EQ(xb.to_vector(), x.to_vector());  // exactly representable values
    EXPECT_EQ(autocast_input("layer_norm", xb).dtype(), DType::F32);
    EXPECT_EQ(autocast_input("gelu", xb).dtype(), DType::BF16);
    EXPECT_EQ(autocast_input("gelu", x).dtype(), DType::F32);
    {
      AutocastGuard inner(DType::F16);
      EXPECT_EQ(autocast_input("conv2d", x).dtype(), DType::F16);
      AutocastGuard off(DType::F32);
      EXPECT_FALSE(autograd::autocast_enabled());
      EXPECT_EQ(autocast_input("conv2d", x).dtype(), DType::F32);
    }
    EXPECT_EQ(autograd::autocast_dtype(), DType::BF16);  // nesting restores
  }
  EXPECT_FALSE(autograd::autocast_enabled());
  EXPECT_THROW(AutocastGuard(DType::I32), InputError);
}

TEST(Autocast, ParametersAreCastOncePerStepAndGradientsComeBackAsF32) {
  Tensor p = Tensor::from_vector({1.0f, 2.0f, 4.0f, 8.0f}, {4});
  p.set_requires_grad(true);
  autograd::WeightCastCache cache;
  const void* first = nullptr;
  for (int micro = 0; micro < 3; ++micro) {
    AutocastGuard g(DType::BF16, &cache);
    Tensor pb = autocast_input("linear", p);
    ASSERT_EQ(pb.dtype(), DType::BF16);
    if (!first) first = pb.data_ptr();
    EXPECT_EQ(pb.data_ptr(), first) << "micro-batch " << micro << " re-converted the parameter";
    autograd::backward(ops::sum(ops::to_dtype(pb, DType::F32)));
  }
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().dtype(), DType::F32);
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{3, 3, 3, 3}));  // three micro-batches of d(sum)/dp = 1
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.bytes(), 4u * 2);
  // An optimizer step changes p: without invalidate() the copy is stale by design; after it,
  // the next use refreshes the same buffer.
  p.data<float>()[0] = 16.0f;
  cache.invalidate();
  AutocastGuard g(DType::BF16, &cache);
  Tensor pb = autocast_input("linear", p);
  EXPECT_EQ(pb.data_ptr(), first);
  EXPECT_EQ(pb.to_vector()[0], 16.0f);
}

TEST(Autocast, ToDtypeRoundsLikeTorchAndItsGradientReturnsInTheInputsDtype) {
  Tensor x = Tensor::from_vector({1.0f + 1.0f / 512, 3.0f}, {2});  // 1+2^-9 rounds to 1 in bf16 (nearest even)
  x.set_requires_grad(true);
  Tensor b = ops::to_dtype(x, DType::BF16);
  EXPECT_EQ(b.to_vector()[0], 1.0f);
  Tensor h = ops::to_dtype(x, DType::F16);
  EXPECT_EQ(h.to_vector()[0], 1.0f + 1.0f / 512);  // f16 keeps 10 bits
  autograd::backward(ops::sum(ops::to_dtype(ops::to_dtype(b, DType::F16), DType::F32)));
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 1}));
  EXPECT_THROW(ops::to_dtype(x, DType::I32), InputError);
}
