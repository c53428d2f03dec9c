// Nodes of the reverse-mode tape.
//
// Every differentiable op that sees an input requiring a gradient (and grad mode on) records
// one Node: its backward function and one Edge per input. An Edge points either at the Node
// that produced the input (interior tensor) or at the input's AutogradMeta (a leaf, whose
// .grad accumulates). The graph is freed as soon as the last Tensor referring to it dies.
//
// Lifetimes: a Node is owned by shared_ptrs -- the grad_fn of the tensors it produced and the
// edges of the nodes recorded after it -- and keeps alive what its backward needs (saved
// tensors). backward() releases the graph it ran over unless retain_graph (engine.h); a graph
// nobody refers to is freed with its saved tensors.
// Thread-safety: none inside. A graph is recorded and run on one thread (grad mode is per
// thread); two threads may record and run disjoint graphs at the same time, not one graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::autograd {

struct Edge {
  std::shared_ptr<Node> node;          // producer of the input (interior), or null
  int output_nr = 0;                   // which output of `node`
  std::shared_ptr<AutogradMeta> leaf;  // leaf requiring grad, or null
  bool active() const { return node != nullptr || leaf != nullptr; }
};

class Node {
 public:
  virtual ~Node() = default;
  // grad_outputs[i] is the gradient of the loss w.r.t. output i (undefined when no path led
  // there). Returns one gradient per input, undefined where next_edges()[i] is inactive.
  virtual std::vector<Tensor> backward(std::vector<Tensor>& grad_outputs) = 0;
  virtual const char* name() const = 0;
  // For the split backward (split_backward.h), by nodes that run a graph of their own inside
  // backward (activation recomputation, checkpoint.h): returns what backward() returns, but
  // may leave the gradients of that inner graph's leaves (its parameters) for later, in
  // `weight_part`: calling it once computes them (and fires their grad-ready hooks);
  // destroying it uncalled releases what it holds. Default: backward(), nothing left.
  virtual std::vector<Tensor> backward_split(std::vector<Tensor>& grad_outputs, std::function<void()>& weight_part) {
    (void)weight_part;
    return backward(grad_outputs);
  }

  std::vector<Edge>& next_edges() { return next_; }
  bool needs_input_grad(size_t i) const { return i < next_.size() && next_[i].active(); }
  int num_outputs() const { return num_outputs_; }
  void set_num_outputs(int n) { num_outputs_ = n; }
  // Output shapes, so a missing output gradient can be materialised as zeros when needed.
  std::vector<Shape> output_shapes;
  // The trace scope label (base/trace.h) current when the node was recorded, or nullptr; the
  // engine opens one "backward <label>" span per run of nodes with the same label.
  const char* trace_label = nullptr;

 private:
  std::vector<Edge> next_;
  int num_outputs_ = 1;
};

}  // namespace paratrain::autograd
