// A GPT's forward and backward in the trace (base/trace.h): with the sink on, one span
// "forward <part>" and one "backward <part>" per part (embedding, each block, ln_f, head), the
// backward ones in reverse order, per part and not per op; with recompute full the backward
// still shows every block; with the sink off nothing is recorded.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/trace.h"
#include "paratrain/nn/gpt.h"

using namespace paratrain;

namespace {

std::vector<std::string> names_of(const trace::Recording& r, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : r.events)
    if (std::string(e.name).rfind(prefix, 0) == 0) out.push_back(e.name);
  return out;
}

trace::Recording one_step(nn::RecomputeMode mode, bool on) {
  nn::GPT m(nn::GPTConfig{3, 2, 32, 8, 48, 0.0f}, 5);
  nn::recompute_blocks(m, mode);
  std::vector<int32_t> xs(16), ys(16);
  for (int i = 0; i < 16; ++i) xs[i] = (i * 7 + 3) % 48, ys[i] = (i * 5 + 1) % 48;
  Tensor x = Tensor::from_vector_i32(xs, {2, 8}), y = Tensor::from_vector_i32(ys, {2, 8});
  if (on) trace::start();
  Tensor loss = m.loss(x, y);
  autograd::backward(loss);
  trace::stop();
  return trace::take();
}

TEST(GptTrace, OneForwardAndOneBackwardSpanPerPart) {
  trace::Recording r = one_step(nn::RecomputeMode::None, true);
  EXPECT_EQ(names_of(r, "forward "),
            (std::vector<std::string>{"forward embedding", "forward block 0", "forward block 1", "forward block 2",
                                      "forward ln_f", "forward head"}));
  EXPECT_EQ(names_of(r, "backward "),
            (std::vector<std::string>{"backward head", "backward ln_f", "backward block 2", "backward block 1",
                                      "backward block 0", "backward embedding"}));
  for (const auto& e : r.events) EXPECT_EQ(e.track, trace::this_thread_track()) << e.name;
}

TEST(GptTrace, RecomputedBlocksStillShowTheirBackward) {
  trace::Recording r = one_step(nn::RecomputeMode::Full, true);
  const auto b = names_of(r, "backward block");
  EXPECT_EQ(b, (std::vector<std::string>{"backward block 2", "backward block 1", "backward block 0"}));
}

TEST(GptTrace, OffRecordsNothing) {
  trace::Recording r = one_step(nn::RecomputeMode::None, false);
  EXPECT_TRUE(r.events.empty());
}

}  // namespace
