#include "paratrain/autograd/engine.h"

#include <unordered_map>

#include "engine_detail.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::autograd {

namespace {
thread_local bool g_grad_enabled = true;
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs) {
  auto& edges = node->next_edges();
  edges.clear();
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    Edge e;
    if (t && t->defined() && t->requires_grad()) {
      const auto& meta = t->autograd_meta_ptr();
      if (meta->grad_fn) {
        e.node = meta->grad_fn;
        e.output_nr = meta->output_nr;
      } else {
        e.leaf = meta;
      }
    }
    edges.push_back(std::move(e));
  }
  node->set_num_outputs(static_cast<int>(outputs.size()));
  if (trace::enabled()) node->trace_label = trace::current_label();
  node->output_shapes.clear();
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor* out = outputs[i];
    node->output_shapes.push_back(out->shape());
    AutogradMeta& m = out->autograd_meta();
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = static_cast<int>(i);
  }
}

void record(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
            std::initializer_list<Tensor*> outputs) {
  record(node, std::vector<const Tensor*>(inputs), std::vector<Tensor*>(outputs));
}

void register_grad_ready_hook(Tensor& param, std::function<void(Tensor&)> fn) {
  PT_CHECK(param.is_leaf(), "grad-ready hooks are for leaf tensors (parameters)");
  param.autograd_meta().grad_ready_hooks.push_back(std::move(fn));
}

using detail::accumulate_leaf;
using detail::add_grad;
using detail::fire_hooks;

void backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  PT_CHECK(root.defined(), "backward() of an undefined tensor");
  if (!root.requires_grad())
    PT_THROW(InputError, "backward(): the tensor does not require grad (no parameter took part in computing it)");
  Tensor seed = grad;
  if (!seed.defined()) {
    PT_CHECK(root.numel() == 1, "backward() without a gradient needs a one-element tensor, got ", root.to_string());
    seed = root.new_full(root.shape(), 1.0);
  }
  NoGradGuard no_grad;
  const auto& root_meta = root.autograd_meta_ptr();
  if (!root_meta->grad_fn) {  // backward of a leaf
    accumulate_leaf(*root_meta, seed);
    fire_hooks(*root_meta);
    return;
  }

  // Reverse post-order DFS = a topological order from the root towards the leaves.
  // `order` owns the nodes: clearing a node's edges below must not free one still to run.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_map<Node*, int> state;  // 1 = on stack, 2 = done
  std::unordered_map<AutogradMeta*, int> leaf_pending;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
  stack.push_back({root_meta->grad_fn, 0});
  state[root_meta->grad_fn.get()] = 1;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    auto& edges = node->next_edges();
    if (next < edges.size()) {
      const Edge& e = edges[next++];
      if (e.leaf) leaf_pending[e.leaf.get()]++;
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

  struct Slot {
    std::vector<Tensor> grads;
    std::vector<bool> owned;
  };
  std::unordered_map<Node*, Slot> pending;
  auto slot_of = [&](Node* n) -> Slot& {
    Slot& s = pending[n];
    if (s.grads.empty()) {
      s.grads.resize(n->num_outputs());
      s.owned.resize(n->num_outputs(), false);
    }
    return s;
  };
  {
    Slot& s = slot_of(root_meta->grad_fn.get());
    bool owned = false;
    add_grad(s.grads[root_meta->output_nr], owned, seed);
    s.owned[root_meta->output_nr] = owned;
  }

  detail::BackwardSpans spans;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = it->get();
    auto found = pending.find(node);
    if (found == pending.end()) continue;  // no gradient reached this node
    spans.at(*node);
    std::vector<Tensor> grads_out = std::move(found->second.grads);
    pending.erase(found);
    std::vector<Tensor> grads_in;
    {
      profiler::OpScope scope(node->name(), true);
      grads_in = node->backward(grads_out);
    }
    grads_out.clear();
    auto& edges = node->next_edges();
    PT_CHECK(grads_in.size() == edges.size(), node->name(), " returned ", grads_in.size(), " gradients for ",
             edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (e.node) {
        Slot& s = slot_of(e.node.get());
        bool owned = s.owned[e.output_nr];
        add_grad(s.grads[e.output_nr], owned, grads_in[i]);
        s.owned[e.output_nr] = owned;
      } else if (e.leaf) {
        accumulate_leaf(*e.leaf, grads_in[i]);
        if (--leaf_pending[e.leaf.get()] == 0) fire_hooks(*e.leaf);
      }
    }
    if (!retain_graph) node->next_edges().clear();
  }
}

}  // namespace paratrain::autograd
