// The reverse-mode engine: backward(), grad mode, and recording helpers for ops.
//
// backward(root) walks the graph below `root` once, in a deterministic reverse topological
// order, summing gradients that meet at a tensor. Leaves that require grad accumulate into
// .grad (+=; the first contribution allocates it). The moment a leaf's gradient is final for
// this pass (its last incoming edge has been processed), its grad-ready hooks fire in
// registration order on the calling thread: data-parallel training starts communication
// from them. The graph is released after backward unless retain_graph.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "paratrain/autograd/node.h"

namespace paratrain::autograd {

// Grad mode is per thread; NoGradGuard turns recording off in a scope.
bool grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Runs the backward pass from `root`. `grad` defaults to ones for a one-element root.
void backward(const Tensor& root, const Tensor& grad = Tensor(), bool retain_graph = false);

// Registers fn(grad) to run when `param`'s gradient is final in a backward pass.
void register_grad_ready_hook(Tensor& param, std::function<void(Tensor&)> fn);

// ---- for op implementations ----
// True when grad mode is on and any input requires a gradient.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
// Wires `node` to `inputs` (an Edge per input) and marks every output as produced by it.
void record(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
            std::initializer_list<Tensor*> outputs);
void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs);

// A Node whose backward is a lambda; the lambda captures what it saved from forward.
class LambdaNode final : public Node {
 public:
  using Fn = std::function<std::vector<Tensor>(std::vector<Tensor>&)>;
  LambdaNode(const char* name, Fn fn) : name_(name), fn_(std::move(fn)) {}
  std::vector<Tensor> backward(std::vector<Tensor>& g) override { return fn_(g); }
  const char* name() const override { return name_; }
  // For ops whose backward needs to ask the node which inputs need a gradient.
  void set_fn(Fn fn) { fn_ = std::move(fn); }

 private:
  const char* name_;
  Fn fn_;
};

}  // namespace paratrain::autograd
