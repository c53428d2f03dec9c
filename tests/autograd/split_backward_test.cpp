// backward_input + DeferredWeightGradients::run (split_backward.h) on small graphs: the
// gradients are bit for bit those of backward(); I asks a node only for the edges towards the
// inputs and W for the others; hooks fire once, in the right part; checkpoint regions defer
// their parameters' part; destroying the W part unrun frees all it held; misuse is an
// InputError that says what to do. (The GPT stage tests are tests/nn/split_backward_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/checkpoint.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/split_backward.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/random.h"
#include "support/error_of.h"

using namespace paratrain;
using autograd::backward_input;
using autograd::DeferredWeightGradients;
using ::testing::HasSubstr;
using paratrain::testing::error_of;

namespace {

Tensor randn(const Shape& s, uint64_t seed, bool requires_grad = true) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  fill_normal(t, g, 0.0f, 0.5f);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// A two-layer MLP block with a residual, layer norm and every multi-input op whose edges mix
// interior tensors and parameters (linear, layer_norm, mul, sub, bmm, add_bias).
struct Net {
  Tensor w1 = randn({8, 16}, 1), b1 = randn({16}, 2), w2 = randn({16, 8}, 3), b2 = randn({8}, 4);
  Tensor lw = randn({8}, 5), lb = randn({8}, 6), m = randn({4, 8}, 7), s = randn({4, 8}, 8);
  Tensor bb = randn({2, 8, 3}, 9), ab = randn({8}, 10);
  std::vector<Tensor*> params() { return {&w1, &b1, &w2, &b2, &lw, &lb, &m, &s, &bb, &ab}; }
  Tensor forward(const Tensor& x) const {
    Tensor h = ops::gelu(ops::linear(ops::layer_norm(x, lw, lb), w1, b1, true));
    Tensor y = ops::add(x, ops::linear(h, w2, b2, true));
    y = ops::sub(ops::mul(y, m), s);
    const int64_t rows = y.size(0);
    Tensor z = ops::bmm(ops::reshape(y, {2, rows / 2, 8}), bb);  // (2, rows/2, 3)
    return ops::add(ops::sum(z), ops::sum(ops::add_bias(ops::tanh(y), ab)));
  }
};

std::map<std::string, std::vector<float>> grads_of(Net& n, const Tensor& x) {
  std::map<std::string, std::vector<float>> g;
  int i = 0;
  for (Tensor* p : n.params()) g["p" + std::to_string(i++)] = p->grad().defined() ? p->grad().to_vector() : std::vector<float>{};
  g["x"] = x.grad().defined() ? x.grad().to_vector() : std::vector<float>{};
  return g;
}

TEST(SplitBackward, InputThenWeightIsBackwardBitForBit) {
  Net full, split;
  Tensor x1 = randn({4, 8}, 42), x2 = randn({4, 8}, 42);
  autograd::backward(full.forward(x1));
  DeferredWeightGradients w = backward_input(split.forward(x2), Tensor(), {x2});
  EXPECT_TRUE(w.pending());
  EXPECT_EQ(x2.grad().to_vector(), x1.grad().to_vector()) << "I gives the input gradient";
  for (Tensor* p : split.params()) EXPECT_FALSE(p->grad().defined()) << "I computes no parameter gradient";
  EXPECT_GT(w.deferred_nodes(), 0);
  w.run();
  EXPECT_FALSE(w.pending());
  EXPECT_EQ(grads_of(split, x2), grads_of(full, x1));
  // Accumulation into existing .grad (a second micro-batch) too.
  autograd::backward(full.forward(x1));
  backward_input(split.forward(x2), Tensor(), {x2}).run();
  EXPECT_EQ(grads_of(split, x2), grads_of(full, x1));
}

TEST(SplitBackward, UnderAutocastTheWeightCastsAreDeferredToo) {
  Net full, split;
  Tensor x1 = randn({4, 8}, 42), x2 = randn({4, 8}, 42);
  Tensor y1, y2;
  {
    autograd::AutocastGuard cast(DType::BF16);
    y1 = full.forward(x1);
    y2 = split.forward(x2);
  }
  autograd::backward(y1);
  DeferredWeightGradients w = backward_input(y2, Tensor(), {x2});
  for (Tensor* p : split.params()) EXPECT_FALSE(p->grad().defined());
  w.run();
  EXPECT_EQ(grads_of(split, x2), grads_of(full, x1));
}

TEST(SplitBackward, NoInputsDefersEverythingAndTheRootSeedToo) {
  Net full, split;
  Tensor x1 = randn({4, 8}, 42, false), x2 = randn({4, 8}, 42, false);
  Tensor g = randn({}, 11, false);
  autograd::backward(full.forward(x1), g);
  DeferredWeightGradients w = backward_input(split.forward(x2), g, {});
  for (Tensor* p : split.params()) EXPECT_FALSE(p->grad().defined());
  w.run();
  EXPECT_EQ(grads_of(split, x2), grads_of(full, x1));
  // A leaf as the root: into .grad now when it is an input, in W when not.
  Tensor a = randn({3}, 1), b = randn({3}, 2), ga = randn({3}, 3, false);
  backward_input(a, ga, {a});
  EXPECT_EQ(a.grad().to_vector(), ga.to_vector());
  DeferredWeightGradients wb = backward_input(b, ga, {});
  EXPECT_FALSE(b.grad().defined());
  wb.run();
  EXPECT_EQ(b.grad().to_vector(), ga.to_vector());
}

// A node with an interior edge (towards the input) and a leaf edge, recording which edges
// each call of its backward had active.
class Probe final : public autograd::Node {
 public:
  std::vector<std::vector<bool>> calls;
  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    calls.push_back({needs_input_grad(0), needs_input_grad(1)});
    Tensor d0, d1;
    if (needs_input_grad(0)) d0 = ops::scale(g[0], 2.0f);
    if (needs_input_grad(1)) d1 = ops::scale(g[0], 3.0f);
    return {d0, d1};
  }
  const char* name() const override { return "probe"; }
};

TEST(SplitBackward, INeedsOnlyTheInputEdgesAndWOnlyTheOthers) {
  Tensor x = randn({3}, 1), w = randn({3}, 2);
  Tensor hx = ops::tanh(x);
  auto probe = std::make_shared<Probe>();
  Tensor out = Tensor::zeros({3});
  autograd::record(probe, {&hx, &w}, {&out});
  DeferredWeightGradients d = backward_input(out, Tensor::full({3}, 1.0), {x});
  ASSERT_EQ(probe->calls.size(), 1u);
  EXPECT_EQ(probe->calls[0], (std::vector<bool>{true, false})) << "I: only the edge towards x";
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  d.run();
  ASSERT_EQ(probe->calls.size(), 2u);
  EXPECT_EQ(probe->calls[1], (std::vector<bool>{false, true})) << "W: only the leaf edge";
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{3, 3, 3}));
}

TEST(SplitBackward, HooksFireOnceInputsInIParametersInW) {
  Net n;
  Tensor x = randn({4, 8}, 42);
  std::vector<std::string> fired;
  bool in_w = false;
  autograd::register_grad_ready_hook(x, [&](Tensor&) { fired.push_back(in_w ? "x in W" : "x"); });
  int i = 0;
  for (Tensor* p : n.params()) {
    const std::string name = "p" + std::to_string(i++);
    autograd::register_grad_ready_hook(*p, [&, name](Tensor& g) {
      EXPECT_TRUE(g.defined());
      fired.push_back(in_w ? name : name + " in I");
    });
  }
  DeferredWeightGradients d = backward_input(n.forward(x), Tensor(), {x});
  EXPECT_EQ(fired, (std::vector<std::string>{"x"}));
  in_w = true;
  d.run();
  ASSERT_EQ(fired.size(), 1 + n.params().size());
  std::sort(fired.begin() + 1, fired.end());
  std::vector<std::string> want;
  for (size_t k = 0; k < n.params().size(); ++k) want.push_back("p" + std::to_string(k));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(std::vector<std::string>(fired.begin() + 1, fired.end()), want) << "each parameter's hook once, in W";
}

TEST(SplitBackward, CheckpointRegionsDeferTheirParameters) {
  Net full, split;
  Generator g1(3), g2(3);
  auto region = [](Net& n, Generator& g) {
    return [&n, &g](const Tensor& in) {
      Tensor h = ops::dropout(ops::linear(in, n.w1, n.b1, true), 0.3f, true, g);
      return ops::linear(ops::gelu(h), n.w2, n.b2, true);
    };
  };
  Tensor x1 = randn({4, 8}, 42), x2 = randn({4, 8}, 42);
  Tensor y1 = ops::sum(ops::mul(autograd::checkpoint(region(full, g1), ops::tanh(x1), &g1), full.m));
  Tensor y2 = ops::sum(ops::mul(autograd::checkpoint(region(split, g2), ops::tanh(x2), &g2), split.m));
  autograd::backward(y1);
  DeferredWeightGradients d = backward_input(y2, Tensor(), {x2});
  EXPECT_EQ(x2.grad().to_vector(), x1.grad().to_vector());
  for (Tensor* p : {&split.w1, &split.b1, &split.w2, &split.b2, &split.m})
    EXPECT_FALSE(p->grad().defined()) << "the region's parameters wait for W";
  d.run();
  EXPECT_EQ(grads_of(split, x2), grads_of(full, x1));
}

TEST(SplitBackward, DestroyingTheWeightPartUnrunFreesEverything) {
  Allocator& alloc = allocator_for(Device::CPU);
  Net n;
  Tensor x = randn({64, 8}, 42);
  Tensor big_m = randn({64, 8}, 7), big_s = randn({64, 8}, 8);
  n.m = big_m;
  n.s = big_s;
  const int64_t before = alloc.stats().bytes_in_use;
  int64_t held = 0, forward_kept = 0;
  {
    Tensor y = n.forward(x);
    forward_kept = alloc.stats().bytes_in_use - before;
    DeferredWeightGradients d = backward_input(y, Tensor(), {x});
    y = Tensor();
    held = alloc.stats().bytes_in_use - before - static_cast<int64_t>(x.grad().nbytes());
    EXPECT_TRUE(d.pending());
  }
  x.set_grad(Tensor());
  EXPECT_EQ(alloc.stats().bytes_in_use, before) << "W's nodes, saved tensors and gradients are all released";
  for (Tensor* p : n.params()) EXPECT_FALSE(p->grad().defined());
  EXPECT_GT(held, 0) << "W's part was held until then";
  EXPECT_GT(forward_kept, 0);
  // reset() releases the same way, and after run() nothing is left either.
  {
    DeferredWeightGradients d = backward_input(n.forward(x), Tensor(), {x});
    d.reset();
    EXPECT_FALSE(d.pending());
  }
  x.set_grad(Tensor());
  EXPECT_EQ(alloc.stats().bytes_in_use, before);
  backward_input(n.forward(x), Tensor(), {x}).run();
  x.set_grad(Tensor());
  int64_t grads = 0;
  for (Tensor* p : n.params()) grads += static_cast<int64_t>(p->grad().nbytes()), p->set_grad(Tensor());
  EXPECT_GT(grads, 0);
  EXPECT_EQ(alloc.stats().bytes_in_use, before);
}

TEST(SplitBackward, MisuseIsAnInputErrorThatSaysWhatToDo) {
  Net n;
  Tensor x = randn({4, 8}, 42);
  DeferredWeightGradients d = backward_input(n.forward(x), Tensor(), {x});
  d.run();
  EXPECT_THAT(error_of<InputError>([&] { d.run(); }), HasSubstr("run() called twice"));
  EXPECT_THAT(error_of<InputError>([&] { DeferredWeightGradients().run(); }),
              HasSubstr("no backward_input() returned"));
  DeferredWeightGradients moved = backward_input(n.forward(x), Tensor(), {x});
  DeferredWeightGradients to = std::move(moved);
  EXPECT_THAT(error_of<InputError>([&] { moved.run(); }), HasSubstr("moved from"));
  to.reset();
  EXPECT_THAT(error_of<InputError>([&] { to.run(); }), HasSubstr("after reset()"));

  x.set_grad(Tensor());
  Tensor y = n.forward(x);
  Tensor h = ops::tanh(x);
  Tensor c = randn({4, 8}, 1, false);
  Tensor other = randn({4, 8}, 2);
  EXPECT_THAT(error_of<InputError>([&] { backward_input(y, Tensor(), {h}); }),
              AllOf(HasSubstr("input 0"), HasSubstr("is not a leaf"), HasSubstr("tanh"), HasSubstr("detach()")));
  EXPECT_THAT(error_of<InputError>([&] { backward_input(y, Tensor(), {x, c}); }),
              AllOf(HasSubstr("input 1"), HasSubstr("does not require grad"), HasSubstr("set_requires_grad(true)")));
  other.set_name("h.0.in");
  EXPECT_THAT(error_of<InputError>([&] { backward_input(y, Tensor(), {x, other}); }),
              AllOf(HasSubstr("input 1 ('h.0.in'"), HasSubstr("is not reached from the root")));
  EXPECT_THAT(error_of<InputError>([&] { backward_input(y, Tensor(), {Tensor()}); }),
              HasSubstr("input 0 is undefined"));
  EXPECT_THAT(error_of<InputError>([&] { backward_input(ops::sum(c), Tensor(), {}); }),
              HasSubstr("does not require grad"));
  EXPECT_THAT(error_of<InputError>([&] { backward_input(ops::tanh(x), Tensor(), {x}); }),
              HasSubstr("one-element root"));
  EXPECT_FALSE(x.grad().defined()) << "a refused call computed nothing";
  // The graph was not consumed by the refused calls.
  backward_input(y, Tensor(), {x}).run();
  EXPECT_TRUE(x.grad().defined());
}

}  // namespace
