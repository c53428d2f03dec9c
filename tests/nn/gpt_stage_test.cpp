// GPT::stage_forward: a pipeline stage's part of the model. Chaining the stages -- each
// stage's output detached into the next stage's leaf input, the backward run stage by stage
// from the last with the received gradient -- gives bit for bit the loss, the logits and every
// parameter gradient of the whole model; forward wrappers around the blocks still run; bad
// ranges and inputs are InputErrors. recompute_blocks gives the same gradients bit for bit
// (dropout on) and a forward that keeps less.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/tensor/allocator.h"

using namespace paratrain;

namespace {

nn::GPTConfig four_blocks() { return nn::GPTConfig{4, 2, 32, 16, 64, 0.0f}; }

void tokens(Tensor& x, Tensor& y) {
  std::vector<int32_t> xs, ys;
  for (int i = 0; i < 2 * 16; ++i) xs.push_back((i * 7 + 3) % 64), ys.push_back((i * 5 + 1) % 64);
  x = Tensor::from_vector_i32(xs, {2, 16});
  y = Tensor::from_vector_i32(ys, {2, 16});
}

std::map<std::string, std::vector<float>> grads(const nn::GPT& m) {
  std::map<std::string, std::vector<float>> g;
  for (const auto& [name, p] : m.named_parameters()) g[name] = p.grad().to_vector();
  return g;
}

// Runs `cuts` (block boundaries, e.g. {0, 1, 3, 4}) as a pipeline of stages in one process.
float pipelined_loss(nn::GPT& m, const std::vector<int64_t>& cuts, const Tensor& x, const Tensor& y) {
  std::vector<Tensor> inputs, outputs;
  Tensor in = x;
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    const bool last = s + 2 == cuts.size();
    Tensor out = m.stage_forward(in, cuts[s], cuts[s + 1], last ? y : Tensor());
    inputs.push_back(in);
    outputs.push_back(out);
    if (!last) {  // what the next stage receives
      in = out.detach();
      in.set_requires_grad(true);
    }
  }
  const float loss = static_cast<float>(outputs.back().item());
  autograd::backward(outputs.back());
  for (size_t s = outputs.size() - 1; s-- > 0;) autograd::backward(outputs[s], inputs[s + 1].grad());  // what it sends back
  return loss;
}

TEST(GptStage, ChainedStagesAreTheWholeModelBitForBit) {
  Tensor x, y;
  tokens(x, y);
  nn::GPT whole(four_blocks(), 5);
  const float ref = static_cast<float>(whole.loss(x, y).item());
  autograd::backward(whole.loss(x, y));
  const auto ref_grads = grads(whole);
  for (const std::vector<int64_t>& cuts : std::vector<std::vector<int64_t>>{{0, 4}, {0, 2, 4}, {0, 1, 3, 4}, {0, 1, 2, 3, 4}}) {
    nn::GPT m(four_blocks(), 5);
    EXPECT_EQ(pipelined_loss(m, cuts, x, y), ref) << cuts.size() - 1 << " stages";
    EXPECT_EQ(grads(m), ref_grads) << cuts.size() - 1 << " stages: the tied wte gets both stages' gradients";
  }
  nn::GPT m(four_blocks(), 5);
  Tensor h = m.stage_forward(x, 0, 2);
  EXPECT_EQ(h.shape(), (Shape{2, 16, 32}));
  EXPECT_EQ(m.stage_forward(h, 2, 4).to_vector(), whole.forward(x).to_vector()) << "the last stage without targets: logits";
}

TEST(GptStage, BlockWrappersRunAndBadInputIsAnInputError) {
  nn::GPT m(four_blocks(), 5);
  int calls = 0;
  m.h[1]->add_forward_wrapper([&](const Tensor& in, const nn::Module::ForwardBody& body) {
    ++calls;
    return body(in);
  });
  Tensor x, y;
  tokens(x, y);
  m.stage_forward(x, 0, 2);
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(m.stage_forward(x, 2, 2), InputError);
  EXPECT_THROW(m.stage_forward(x, 0, 5), InputError);
  EXPECT_THROW(m.stage_forward(x, 1, 2), InputError);  // token ids where hidden states belong
  EXPECT_THROW(m.stage_forward(Tensor::zeros({2, 16, 32}), 0, 2), InputError);
}

}  // namespace

namespace {

TEST(GptRecompute, GradientsAreBitForBitAndTheForwardKeepsLess) {
  nn::GPTConfig cfg = four_blocks();
  cfg.dropout = 0.1f;  // the masks must repeat in the recomputation
  Tensor x, y;
  tokens(x, y);
  Allocator& alloc = allocator_for(Device::CPU);
  auto run = [&](bool recompute, int64_t* kept) {
    nn::GPT m(cfg, 9);
    if (recompute) nn::recompute_blocks(m);
    std::vector<float> losses;
    for (int step = 0; step < 2; ++step) {  // the generator's state carries over steps
      m.zero_grad();
      const int64_t before = alloc.stats().bytes_in_use;
      Tensor loss = m.loss(x, y);
      if (step == 0) *kept = alloc.stats().bytes_in_use - before;
      losses.push_back(static_cast<float>(loss.item()));
      autograd::backward(loss);
    }
    auto g = grads(m);
    g["losses"] = losses;
    g["rng"] = {static_cast<float>(m.generator().next_u64() % 1000003)};
    return g;
  };
  int64_t kept_plain = 0, kept_recompute = 0;
  const auto plain = run(false, &kept_plain), again = run(true, &kept_recompute);
  EXPECT_EQ(again, plain);
  std::printf("  forward keeps %lld bytes, %lld with --recompute full\n", static_cast<long long>(kept_plain),
              static_cast<long long>(kept_recompute));
  EXPECT_LT(kept_recompute, kept_plain / 2);
  nn::GPT m(cfg, 9);
  nn::recompute_blocks(m);
  EXPECT_THROW(nn::recompute_blocks(m), InputError);  // once per model
  nn::GPT w(cfg, 9);
  w.h[1]->add_forward_wrapper([](const Tensor& in, const nn::Module::ForwardBody& body) { return body(in); });
  EXPECT_THROW(nn::recompute_blocks(w), InputError);  // it must be the innermost wrapper
  EXPECT_FALSE(w.h[0]->has_forward_wrappers());        // and nothing was wrapped
}

}  // namespace
