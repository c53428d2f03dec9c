#include "paratrain/autograd/checkpoint.h"

#include <memory>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"

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
  Tensor input = x;
  auto node = std::make_shared<LambdaNode>("checkpoint", [fn, input, gen, rng, autocast](std::vector<Tensor>& g) {
    const auto now = gen ? gen->state() : std::array<uint64_t, 4>{};
    if (gen) gen->set_state(rng);
    Tensor again = input.detach();
    again.set_requires_grad(true);
    {
      EnableGrad grad_on;
      std::unique_ptr<AutocastGuard> cast;
      if (autocast != DType::F32) cast = std::make_unique<AutocastGuard>(autocast);
      Tensor y2 = fn(again);
      if (gen) gen->set_state(now);
      backward(y2, g[0].defined() ? g[0] : Tensor::zeros(y2.shape(), y2.dtype()));
    }
    return std::vector<Tensor>{again.grad()};
  });
  record(node, {&x}, {&out});
  return out;
}

}  // namespace paratrain::autograd
