// A steady-state training step takes no fresh memory from the OS: after the first steps have
// filled the caching allocator, later steps are served entirely from its cache.
#include <gtest/gtest.h>

#include "paratrain/autograd/engine.h"
#include "paratrain/nn/classifiers.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"

using namespace paratrain;

namespace {
template <typename Model, typename Batch>
void expect_steady(Model& model, Batch batch) {
  optim::AdamW opt(model.named_parameters(), optim::AdamWOptions{});
  auto step = [&] {
    model.zero_grad();
    autograd::backward(batch());
    opt.step();
  };
  step();
  step();
  Allocator& a = allocator_for(Device::CPU);
  const AllocatorStats before = a.stats();
  for (int i = 0; i < 4; ++i) step();
  const AllocatorStats after = a.stats();
  EXPECT_EQ(after.os_allocations, before.os_allocations) << "steps 3-6 took fresh memory from the OS";
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved);
  EXPECT_GT(after.cache_hits, before.cache_hits);
}
}  // namespace

TEST(SteadyState, GptStepReusesCachedMemory) {
  nn::GPT model(nn::GPTConfig::preset("gpt-nano"), 1);
  std::vector<int32_t> toks(4 * 64);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 31) % 256);
  Tensor x = Tensor::from_vector_i32(toks, {4, 64});
  expect_steady(model, [&] { return model.loss(x, x); });
}

TEST(SteadyState, CnnStepReusesCachedMemory) {
  nn::CNNClassifier model(1);
  Tensor images = Tensor::empty({8, 1, 28, 28});
  Generator g(3);
  fill_normal(images, g, 0.0f, 1.0f);
  Tensor labels = Tensor::from_vector_i32({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  expect_steady(model, [&] { return model.loss(images, labels); });
}
