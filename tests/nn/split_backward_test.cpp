// The split backward (autograd/split_backward.h) on real GPT pipeline stages: backward_input
// then run() gives every parameter's gradient and the stage input's gradient bit for bit as
// backward() does -- middle, first and last stages, dropout on, autocast bf16, blocks
// recomputed (nn::recompute_blocks) -- with no parameter gradient computed in I; hooks fire
// once each, parameters' in W; the W part holds what it needs only and releases all of it
// when dropped unrun. (Their times: bench/split_backward_bench.cpp.)
// (Here rather than in tests/autograd: test_autograd does not link the nn layer.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/split_backward.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;
using autograd::backward_input;
using autograd::DeferredWeightGradients;

namespace {

using Grads = std::map<std::string, std::vector<float>>;

struct Variant {
  float dropout;
  bool bf16;
  bool recompute;
  std::string str() const {
    return std::string("dropout ") + std::to_string(dropout) + (bf16 ? ", autocast bf16" : "") +
           (recompute ? ", recompute_blocks" : "");
  }
};

nn::GPTConfig small(float dropout) { return nn::GPTConfig{4, 2, 32, 16, 64, dropout}; }

Tensor randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  fill_normal(t, g, 0.0f, 1.0f);
  return t;
}

void tokens(Tensor& x, Tensor& y) {
  std::vector<int32_t> xs, ys;
  for (int i = 0; i < 2 * 16; ++i) xs.push_back((i * 7 + 3) % 64), ys.push_back((i * 5 + 1) % 64);
  x = Tensor::from_vector_i32(xs, {2, 16});
  y = Tensor::from_vector_i32(ys, {2, 16});
}

Grads grads(const nn::GPT& m) {
  Grads g;
  for (const auto& [name, p] : m.named_parameters())
    g[name] = p.grad().defined() ? p.grad().to_vector() : std::vector<float>{};
  return g;
}

int defined_grads(const nn::GPT& m) {
  int n = 0;
  for (const auto& [name, p] : m.named_parameters()) n += p.grad().defined();
  return n;
}

// One stage's forward and backward, [first, end) of a fresh model (seed 5: both runs get the
// same weights and dropout masks); the whole backward() when !split, else backward_input then
// run(). Returns every parameter's gradient and the input's ("input"); checks that I left
// every parameter gradient undefined.
Grads stage(const Variant& v, int64_t first, int64_t end, bool split) {
  nn::GPT m(small(v.dropout), 5);
  if (v.recompute) nn::recompute_blocks(m);
  Tensor x, y;
  tokens(x, y);
  const bool first_stage = first == 0, last = end == 4;
  Tensor in = first_stage ? x : randn({2, 16, 32}, 11);
  if (!first_stage) in.set_requires_grad(true);
  Tensor out;
  for (int mb = 0; mb < 2; ++mb) {  // two micro-batches: the second accumulates into .grad
    {
      std::unique_ptr<autograd::AutocastGuard> cast;
      if (v.bf16) cast = std::make_unique<autograd::AutocastGuard>(DType::BF16);
      out = m.stage_forward(in, first, end, last ? y : Tensor());
    }
    Tensor seed = last ? Tensor() : randn({2, 16, 32}, 12 + mb);
    if (!split) {
      autograd::backward(out, seed);
    } else {
      std::vector<Tensor> inputs;
      if (!first_stage) inputs.push_back(in);
      const int before = defined_grads(m);
      DeferredWeightGradients w = backward_input(out, seed, inputs);
      EXPECT_EQ(defined_grads(m), before) << v.str() << ": I computed a parameter gradient";
      if (!first_stage) EXPECT_TRUE(in.grad().defined()) << v.str();
      EXPECT_TRUE(w.pending());
      w.run();
    }
  }
  Grads g = grads(m);
  g["input"] = first_stage ? std::vector<float>{} : in.grad().to_vector();
  g["rng"] = {static_cast<float>(m.generator().next_u64() % 1000003)};
  return g;
}

TEST(SplitBackwardGpt, StagesGiveBackwardsGradientsBitForBit) {
  for (float dropout : {0.0f, 0.1f})
    for (bool bf16 : {false, true})
      for (bool recompute : {false, true}) {
        const Variant v{dropout, bf16, recompute};
        const Grads full = stage(v, 1, 3, false), split = stage(v, 1, 3, true);
        EXPECT_EQ(split, full) << "blocks [1,3), " << v.str();
        EXPECT_FALSE(full.at("input").empty());
        EXPECT_FALSE(full.at("h.1.mlp.c_fc.weight").empty());
        EXPECT_TRUE(full.at("h.0.mlp.c_fc.weight").empty()) << "not in the stage";
      }
  for (const Variant& v : {Variant{0.1f, false, false}, Variant{0.1f, true, true}}) {
    EXPECT_EQ(stage(v, 0, 2, true), stage(v, 0, 2, false)) << "the first stage (tokens, no input gradient), " << v.str();
    EXPECT_EQ(stage(v, 3, 4, true), stage(v, 3, 4, false)) << "the last stage (the loss, tied wte), " << v.str();
  }
}

TEST(SplitBackwardGpt, HooksFireOnceParametersInW) {
  for (bool recompute : {false, true}) {
    nn::GPT m(small(0.1f), 5);
    if (recompute) nn::recompute_blocks(m);
    Tensor in = randn({2, 16, 32}, 11);
    in.set_requires_grad(true);
    bool in_w = false;
    int input_fired = 0;
    std::map<std::string, int> in_i, in_wpart;
    autograd::register_grad_ready_hook(in, [&](Tensor&) { input_fired += in_w ? 100 : 1; });
    for (auto& [name, p] : m.named_parameters()) {
      Tensor t = p;
      const std::string n = name;
      autograd::register_grad_ready_hook(t, [&, n](Tensor& g) {
        EXPECT_TRUE(g.defined());
        ++(in_w ? in_wpart : in_i)[n];
      });
    }
    DeferredWeightGradients w = backward_input(m.stage_forward(in, 1, 3), randn({2, 16, 32}, 12), {in});
    EXPECT_EQ(input_fired, 1) << "the input's hook, once, in I";
    EXPECT_TRUE(in_i.empty()) << "no parameter hook in I";
    in_w = true;
    w.run();
    EXPECT_EQ(input_fired, 1);
    int stage_params = 0;
    for (const auto& [name, p] : m.named_parameters()) {
      const bool in_stage = name.rfind("h.1.", 0) == 0 || name.rfind("h.2.", 0) == 0;
      stage_params += in_stage;
      EXPECT_EQ(in_wpart[name], in_stage ? 1 : 0) << name << (recompute ? " (recomputed)" : "");
    }
    EXPECT_EQ(stage_params, 24);
  }
}

// What W holds after I is what it needs -- the inputs of the deferred Linear and LayerNorm
// nodes, their statistics and the output gradients they got (one (B,T,C) each for LayerNorm,
// (B,T,3C), (B,T,C), (B,T,4C), (B,T,C) for the Linears of a block) -- and no more: less than
// the forward kept plus those gradients (attention's saved tensors, GELU's input and the
// dropout masks went in I). Dropped unrun it frees all; run, all but the gradients.
TEST(SplitBackwardGpt, WHoldsWhatItNeedsAndDroppingItFreesAll) {
  Allocator& alloc = allocator_for(Device::CPU);
  const int64_t B = 2, T = 16, C = 32, row = B * T * C * 4;
  for (bool recompute : {false, true}) {
    for (bool run : {false, true}) {
      nn::GPT m(small(0.1f), 5);
      if (recompute) nn::recompute_blocks(m);
      Tensor in = randn({B, T, C}, 11), seed = randn({B, T, C}, 12);
      in.set_requires_grad(true);
      const int64_t before = alloc.stats().bytes_in_use;
      int64_t kept = 0, held = 0;
      {
        Tensor out = m.stage_forward(in, 1, 3);
        kept = alloc.stats().bytes_in_use - before;
        DeferredWeightGradients w = backward_input(out, seed, {in});
        out = Tensor();
        held = alloc.stats().bytes_in_use - before - static_cast<int64_t>(in.grad().nbytes());
        if (run) w.run();
      }
      int64_t grad_bytes = static_cast<int64_t>(in.grad().nbytes());
      for (const auto& [name, p] : m.named_parameters())
        if (p.grad().defined()) grad_bytes += static_cast<int64_t>(p.grad().nbytes());
      EXPECT_EQ(alloc.stats().bytes_in_use, before + grad_bytes)
          << (run ? "after run() only the gradients are left" : "dropped unrun, the W part frees all it held");
      EXPECT_EQ(defined_grads(m), run ? 24 : 0);
      if (run) continue;
      std::printf("  stage [1,3)%s: the forward keeps %lld bytes, the W part holds %lld after I\n",
                  recompute ? " recomputed" : "", static_cast<long long>(kept), static_cast<long long>(held));
      const int64_t output_grads = 2 * (2 + 3 + 1 + 4 + 1) * row;  // per block: 2 LayerNorms, 4 Linears
      EXPECT_GT(held, 0);
      if (!recompute) EXPECT_LT(held, kept + output_grads) << "I freed what only it needed";
    }
  }
}

}  // namespace
