#include "paratrain/autograd/checkpoint.h"

#include <memory>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/split_backward.h"

namespace paratrain::autograd {

namespace {
// Grad mode on for a scope (the node runs inside backward, where it is off).
class EnableGrad {
 public:
  EnableGrad() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGrad() { set_grad_enabled(prev_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool prev_;
};


// The node checkpoint() records: backward() recomputes fn and runs a whole backward through
// it; backward_split() (split_backward.h) recomputes it the same way but runs only the input
// part there, leaving the parameters' part for the caller's W.
class CheckpointNode final : public Node {
 public:
  using Fn = std::function<Tensor(const Tensor&)>;
  CheckpointNode(Fn fn, Tensor input, Generator* gen, std::array<uint64_t, 4> rng, DType autocast)
      : fn_(std::move(fn)), input_(std::move(input)), gen_(gen), rng_(rng), autocast_(autocast) {}
  const char* name() const override { return "checkpoint"; }

  std::vector<Tensor> backward(std::vector<Tensor>& g) override {
    return run(g, [](const Tensor& y2, const Tensor& seed, const Tensor&) { autograd::backward(y2, seed); });
  }

  std::vector<Tensor> backward_split(std::vector<Tensor>& g, std::function<void()>& weight_part) override {
    return run(g, [&](const Tensor& y2, const Tensor& seed, const Tensor& again) {
      auto rest = std::make_shared<DeferredWeightGradients>(split_backward_impl(y2, seed, {again}, false));
      if (rest->deferred_nodes() > 0) weight_part = [rest] { rest->run(); };
    });
  }

 private:
  // Replays the forward on the input detached (requiring grad) with the graph, under the
  // forward's generator state and autocast, and backpropagates g[0] through it by `back`.
  template <typename Back>
  std::vector<Tensor> run(std::vector<Tensor>& g, Back back) {
    const auto now = gen_ ? gen_->state() : std::array<uint64_t, 4>{};
    if (gen_) gen_->set_state(rng_);
    Tensor again = input_.detach();
    again.set_requires_grad(true);
    {
      EnableGrad grad_on;
      std::unique_ptr<AutocastGuard> cast;
      if (autocast_ != DType::F32) cast = std::make_unique<AutocastGuard>(autocast_);
      Tensor y2 = fn_(again);
      if (gen_) gen_->set_state(now);
      back(y2, g[0].defined() ? g[0] : y2.new_zeros(y2.shape()), again);
    }
    return std::vector<Tensor>{again.grad()};
  }

  Fn fn_;
  Tensor input_;
  Generator* gen_;
  std::array<uint64_t, 4> rng_;
  DType autocast_;
};
}  // namespace

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, Generator* gen) {
  if (!grad_enabled() || !x.requires_grad()) return fn(x);
  const auto rng = gen ? gen->state() : std::array<uint64_t, 4>{};
  const DType autocast = autocast_dtype();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  Tensor out = y.detach();
  record(std::make_shared<CheckpointNode>(fn, x, gen, rng, autocast), {&x}, {&out});
  return out;
}

}  // namespace paratrain::autograd
