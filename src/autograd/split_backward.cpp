// The split backward (split_backward.h). The walk is the engine's (engine.cpp): the same
// reverse post-order DFS, so the same node order and the same summation order at every
// tensor; I runs the nodes that reach an input, each with the edges towards the inputs only,
// and W runs, in that same order, the rest of those nodes on the gradients they got in I, and
// the nodes that reach no input.
#include "paratrain/autograd/split_backward.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "engine_detail.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::autograd {

using detail::accumulate_leaf;
using detail::add_grad;
using detail::fire_hooks;

struct DeferredWeightGradients::State {
  enum class Kind {
    kRest,   // ran in I on its edges towards the inputs; W runs it on `grad_outputs` with the others
    kInner,  // ran in I whole, but left its inner graph's W part (`inner`, a checkpoint region)
    kAll,    // reaches no input: W runs it as backward() does, on what reaches it in W
  };
  struct Step {
    std::shared_ptr<Node> node;
    Kind kind = Kind::kAll;
    std::vector<Tensor> grad_outputs;  // kRest: what it received in I
    std::function<void()> inner;       // a checkpoint region's own W part (may be empty)
  };
  std::vector<Step> steps;  // in the engine's order
  // The root when no input is below it: W seeds it.
  std::shared_ptr<Node> root_node;
  int root_output_nr = 0;
  std::shared_ptr<AutogradMeta> root_leaf;
  Tensor seed;
  // Edges into each leaf that is not an input, counted down in W to fire its hooks.
  std::unordered_map<AutogradMeta*, int> leaf_pending;
};

namespace {

struct Slot {
  std::vector<Tensor> grads;
  std::vector<bool> owned;
};

class Slots {
 public:
  Slot& of(Node* n) {
    Slot& s = pending_[n];
    if (s.grads.empty()) {
      s.grads.resize(n->num_outputs());
      s.owned.resize(n->num_outputs(), false);
    }
    return s;
  }
  void add(Node* n, int output_nr, const Tensor& g) {
    Slot& s = of(n);
    bool owned = s.owned[output_nr];
    add_grad(s.grads[output_nr], owned, g);
    s.owned[output_nr] = owned;
  }
  // The gradients that reached n (moved out), or false when none did.
  bool take(Node* n, std::vector<Tensor>& out) {
    auto found = pending_.find(n);
    if (found == pending_.end()) return false;
    out = std::move(found->second.grads);
    pending_.erase(found);
    return true;
  }

 private:
  std::unordered_map<Node*, Slot> pending_;
};

std::string describe(const Tensor& t) {
  std::string s = t.to_string();
  if (t.autograd_meta_ptr() && !t.autograd_meta_ptr()->name.empty()) s = "'" + t.autograd_meta_ptr()->name + "' " + s;
  return s;
}

// Passes a node's input gradients along its (active) edges.
void propagate(Node* node, std::vector<Tensor>& grads_in, Slots& slots,
               std::unordered_map<AutogradMeta*, int>& leaf_pending) {
  auto& edges = node->next_edges();
  PT_CHECK(grads_in.size() == edges.size(), node->name(), " returned ", grads_in.size(), " gradients for ", edges.size(),
           " inputs");
  for (size_t i = 0; i < edges.size(); ++i) {
    const Edge& e = edges[i];
    if (e.node) {
      slots.add(e.node.get(), e.output_nr, grads_in[i]);
    } else if (e.leaf) {
      accumulate_leaf(*e.leaf, grads_in[i]);
      if (--leaf_pending[e.leaf.get()] == 0) fire_hooks(*e.leaf);
    }
  }
}

}  // namespace

DeferredWeightGradients::DeferredWeightGradients() = default;
DeferredWeightGradients::~DeferredWeightGradients() = default;
DeferredWeightGradients::DeferredWeightGradients(std::unique_ptr<State> state)
    : state_(std::move(state)), status_(Status::kPending) {}
DeferredWeightGradients::DeferredWeightGradients(DeferredWeightGradients&& o) noexcept
    : state_(std::move(o.state_)), status_(o.status_) {
  o.status_ = Status::kEmpty;
}
DeferredWeightGradients& DeferredWeightGradients::operator=(DeferredWeightGradients&& o) noexcept {
  if (this != &o) {
    state_ = std::move(o.state_);
    status_ = o.status_;
    o.status_ = Status::kEmpty;
  }
  return *this;
}

bool DeferredWeightGradients::pending() const { return status_ == Status::kPending; }

void DeferredWeightGradients::reset() {
  state_.reset();
  if (status_ == Status::kPending) status_ = Status::kReleased;
}

int64_t DeferredWeightGradients::deferred_nodes() const {
  if (!state_) return 0;
  int64_t n = 0;
  for (const auto& s : state_->steps) n += s.kind == State::Kind::kInner ? (s.inner ? 1 : 0) : 1 + (s.inner ? 1 : 0);
  return n + (state_->root_leaf ? 1 : 0);
}

void DeferredWeightGradients::run() {
  switch (status_) {
    case Status::kPending:
      break;
    case Status::kRan:
      PT_THROW(InputError, "DeferredWeightGradients::run() called twice: the weight gradients of this backward_input() "
                           "were already computed and accumulated into .grad; run each one once, and call "
                           "backward_input() again for the next pass");
    case Status::kReleased:
      PT_THROW(InputError, "DeferredWeightGradients::run() after reset(): what the weight gradients needed was released "
                           "without computing them; run() before reset(), or redo the forward and backward_input()");
    case Status::kEmpty:
      PT_THROW(InputError, "DeferredWeightGradients::run() on an object no backward_input() returned (default-"
                           "constructed or moved from): run the one backward_input() returned");
  }
  status_ = Status::kRan;
  std::unique_ptr<State> st = std::move(state_);
  NoGradGuard no_grad;
  Slots slots;
  if (st->root_leaf) {
    accumulate_leaf(*st->root_leaf, st->seed);
    fire_hooks(*st->root_leaf);
  }
  if (st->root_node) slots.add(st->root_node.get(), st->root_output_nr, st->seed);
  st->seed = Tensor();
  st->root_node.reset();
  detail::BackwardSpans spans("backward weights ");
  for (auto& step : st->steps) {
    if (step.inner) {
      std::function<void()> inner = std::move(step.inner);
      step.inner = nullptr;
      inner();
    }
    if (step.kind == State::Kind::kInner) continue;
    Node* node = step.node.get();
    spans.at(*node);
    std::vector<Tensor> grads_out;
    if (step.kind == State::Kind::kRest) {
      grads_out = std::move(step.grad_outputs);
    } else if (!slots.take(node, grads_out)) {
      step.node.reset();
      continue;  // no gradient reached this node
    }
    std::vector<Tensor> grads_in;
    {
      profiler::OpScope scope(node->name(), true);
      grads_in = node->backward(grads_out);
    }
    grads_out.clear();
    propagate(node, grads_in, slots, st->leaf_pending);
    node->next_edges().clear();
    step.node.reset();
  }
}

DeferredWeightGradients split_backward_impl(const Tensor& root, const Tensor& grad, const std::vector<Tensor>& inputs,
                                            bool inputs_must_be_reached) {
  if (!root.defined()) PT_THROW(InputError, "backward_input(): the root tensor is undefined");
  if (!root.requires_grad())
    PT_THROW(InputError, "backward_input(): the root tensor does not require grad (no parameter or input took part in "
                         "computing it)");
  std::unordered_set<AutogradMeta*> input_set;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) PT_THROW(InputError, "backward_input(): input ", i, " is undefined");
    if (!t.requires_grad())
      PT_THROW(InputError, "backward_input(): input ", i, " (", describe(t),
               ") does not require grad: call set_requires_grad(true) on the stage's input before its forward");
    if (t.autograd_meta_ptr()->grad_fn)
      PT_THROW(InputError, "backward_input(): input ", i, " (", describe(t), ") is not a leaf (an op, ",
               t.autograd_meta_ptr()->grad_fn->name(),
               ", computed it): pass the leaf the stage's forward started from, e.g. the received activation "
               "x.detach() with set_requires_grad(true)");
    input_set.insert(t.autograd_meta_ptr().get());
  }
  Tensor seed = grad;
  if (!seed.defined()) {
    if (root.numel() != 1)
      PT_THROW(InputError, "backward_input() without a gradient needs a one-element root, got ", root.to_string(),
               ": pass the gradient of the stage's output");
    seed = root.new_full(root.shape(), 1.0);
  }
  auto not_reached = [&](const std::unordered_set<AutogradMeta*>& reached) {
    if (!inputs_must_be_reached) return;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (!reached.count(inputs[i].autograd_meta_ptr().get()))
        PT_THROW(InputError, "backward_input(): input ", i, " (", describe(inputs[i]),
                 ") is not reached from the root: the root was not computed from it (was it detached, or "
                 "replaced after the forward?); pass the tensors the stage's forward consumed");
  };

  NoGradGuard no_grad;
  auto st = std::make_unique<DeferredWeightGradients::State>();
  const auto& root_meta = root.autograd_meta_ptr();
  if (!root_meta->grad_fn) {  // the root is a leaf
    std::unordered_set<AutogradMeta*> reached{root_meta.get()};
    not_reached(reached);
    if (input_set.count(root_meta.get())) {
      accumulate_leaf(*root_meta, seed);
      fire_hooks(*root_meta);
    } else {
      st->root_leaf = root_meta;
      st->seed = seed;
    }
    return DeferredWeightGradients(std::move(st));
  }

  // The engine's walk: reverse post-order DFS; `order` owns the nodes during I.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_map<Node*, int> state;  // 1 = on stack, 2 = done
  std::unordered_map<AutogradMeta*, int> input_pending;
  std::unordered_set<AutogradMeta*> reached;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
  stack.push_back({root_meta->grad_fn, 0});
  state[root_meta->grad_fn.get()] = 1;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    auto& edges = node->next_edges();
    if (next < edges.size()) {
      const Edge& e = edges[next++];
      if (e.leaf) {
        reached.insert(e.leaf.get());
        if (input_set.count(e.leaf.get()))
          input_pending[e.leaf.get()]++;
        else
          st->leaf_pending[e.leaf.get()]++;
      }
      if (e.node && state[e.node.get()] == 0) {
        state[e.node.get()] = 1;
        stack.push_back({e.node, 0});
      }
    } else {
      state[node.get()] = 2;
      order.push_back(node);
      stack.pop_back();
    }
  }
  not_reached(reached);

  // Which nodes reach an input (post-order: a node's producers come before it).
  std::unordered_set<Node*> reaches;
  for (const auto& n : order) {
    for (const Edge& e : n->next_edges()) {
      if ((e.leaf && input_set.count(e.leaf.get())) || (e.node && reaches.count(e.node.get()))) {
        reaches.insert(n.get());
        break;
      }
    }
  }
  auto towards_input = [&](const Edge& e) {
    return (e.leaf && input_set.count(e.leaf.get())) || (e.node && reaches.count(e.node.get()));
  };

  Slots slots;
  Node* root_node = root_meta->grad_fn.get();
  if (reaches.count(root_node)) {
    slots.add(root_node, root_meta->output_nr, seed);
  } else {
    st->root_node = root_meta->grad_fn;
    st->root_output_nr = root_meta->output_nr;
    st->seed = seed;
  }

  using Kind = DeferredWeightGradients::State::Kind;
  detail::BackwardSpans spans;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = it->get();
    if (!reaches.count(node)) {
      st->steps.push_back({*it, Kind::kAll, {}, nullptr});
      continue;
    }
    std::vector<Tensor> grads_out;
    if (!slots.take(node, grads_out)) continue;  // no gradient reached this node
    spans.at(*node);
    // The node's edges towards the inputs stay active for I; the others wait for W.
    auto& edges = node->next_edges();
    std::vector<Edge> rest(edges.size());
    bool has_rest = false;
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].active() || towards_input(edges[i])) continue;
      rest[i] = std::move(edges[i]);
      edges[i] = Edge{};
      has_rest = true;
    }
    std::vector<Tensor> grads_in;
    std::function<void()> inner;
    {
      profiler::OpScope scope(node->name(), true);
      if (has_rest) {
        std::vector<Tensor> copy = grads_out;  // W needs them as they came
        grads_in = node->backward_split(copy, inner);
      } else {
        grads_in = node->backward_split(grads_out, inner);
      }
    }
    propagate(node, grads_in, slots, input_pending);
    grads_in.clear();
    if (has_rest) {
      edges = std::move(rest);  // only the edges W follows: what fed only I can be freed
      st->steps.push_back({*it, Kind::kRest, std::move(grads_out), std::move(inner)});
    } else {
      edges.clear();
      if (inner) st->steps.push_back({*it, Kind::kInner, {}, std::move(inner)});
    }
  }

  // Keep of the nodes that reach no input those W can reach (from the root, or from a node's
  // deferred rest); the others would get no gradient in backward() either.
  std::unordered_set<Node*> live;
  if (st->root_node) live.insert(st->root_node.get());
  std::vector<DeferredWeightGradients::State::Step> kept;
  kept.reserve(st->steps.size());
  for (auto& s : st->steps) {
    if (s.kind == Kind::kAll && !live.count(s.node.get())) continue;
    if (s.kind != Kind::kInner)
      for (const Edge& e : s.node->next_edges())
        if (e.node) live.insert(e.node.get());
    if (s.kind == Kind::kInner) s.node.reset();  // W needs only its inner part
    kept.push_back(std::move(s));
  }
  st->steps = std::move(kept);
  return DeferredWeightGradients(std::move(st));
}

DeferredWeightGradients backward_input(const Tensor& root, const Tensor& grad, const std::vector<Tensor>& inputs) {
  return split_backward_impl(root, grad, inputs, true);
}

}  // namespace paratrain::autograd
