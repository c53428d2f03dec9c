// A backward pass in two parts, for zero-bubble pipeline schedules (ZB-H1, arXiv 2401.10241;
// torch.distributed.pipelining's stage_backward_input / stage_backward_weight).
//
// What it is for: a pipeline stage's backward has a part the previous stage waits for -- the
// gradient of the stage's input (I) -- and a part nobody waits for until the optimizer step:
// the gradients of the stage's parameters (W). backward_input() runs I now and returns W as a
// DeferredWeightGradients, to be run() later (in a schedule's bubble).
//
// What it promises:
//  * backward_input(root, grad, inputs) then run() leaves every leaf's .grad bit for bit as
//    autograd::backward(root, grad) leaves it (same ops, same summation order), with or
//    without autocast, dropout, or activation recomputation (checkpoint.h).
//  * I computes only what leads to `inputs`: a node of the graph runs in I exactly when a path
//    from it reaches one of them, and then with only those edges active (needs_input_grad(i)
//    is false for the others: Linear computes dx but not dw, db; LayerNorm dx but not its
//    weight's and bias's); every other node, and the rest of those nodes (the same backward
//    called again with only the other edges active, on the gradients it got in I), runs in W.
//    A checkpoint region reached in I recomputes its forward in I and defers its own W part
//    the same way (its parameters' gradients are computed in run(), not in I).
//  * Grad-ready hooks (engine.h) fire once per pass each: those of `inputs` during I, the
//    moment their gradient is final; every other leaf's during run(), the same way.
//  * The graph is not retained: I frees what backward would free of the nodes that need
//    nothing more; what W needs (the deferred nodes, their saved tensors and the gradients they
//    got) lives until run() -- or until the DeferredWeightGradients is destroyed or reset()
//    without running, which releases all of it and leaves the other leaves' .grad untouched.
//    So between I and W a stage holds, besides what W's nodes saved in the forward, the
//    gradient of each deferred node's output (a Linear's dout: W computes dW = x^T dout): for
//    a GPT block 11 (B,T,C)'s worth, besides the 9 of activations W needs (f32). A
//    checkpoint region recomputes its forward in I, and its W part then holds the region's
//    activations that its parameters' gradients need until run(): the memory recomputation
//    saves is kept only up to I (a schedule that must not hold them runs backward() instead).
//
// Errors (InputError, nothing computed): an input that is undefined, is not a leaf, does not
// require grad, or is not reached from root; a root that does not require grad; run() twice,
// after reset(), or on a DeferredWeightGradients no backward_input returned.
//
// Thread-safety: as backward(): both parts run on the calling thread (grad mode off inside,
// hooks fire there); run() may be called on another thread than backward_input() was, but not
// while anything else uses the same graph or the leaves' gradients.
// Lifetimes: a DeferredWeightGradients owns what W needs (it does not need `root` or the
// input tensors to stay alive); the leaves (parameters) must outlive run(); a
// checkpoint region's function and generator must outlive run() (as they must outlive backward).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::autograd {

class DeferredWeightGradients {
 public:
  DeferredWeightGradients();  // nothing to run: run() is an InputError
  ~DeferredWeightGradients();
  DeferredWeightGradients(DeferredWeightGradients&&) noexcept;
  DeferredWeightGradients& operator=(DeferredWeightGradients&&) noexcept;  // releases what *this held
  DeferredWeightGradients(const DeferredWeightGradients&) = delete;
  DeferredWeightGradients& operator=(const DeferredWeightGradients&) = delete;

  // Runs the W part once: accumulates the remaining leaves' gradients into their .grad and
  // fires their grad-ready hooks, then releases what it held.
  void run();
  // True between backward_input() and run() / reset().
  bool pending() const;
  // Releases what W needs without computing it (as destruction does).
  void reset();
  // Nodes whose backward (or part of it) W will run, counting those inside checkpoint
  // regions; 0 when I did everything.
  int64_t deferred_nodes() const;

  struct State;  // private to the implementation

 private:
  enum class Status { kEmpty, kPending, kRan, kReleased };
  explicit DeferredWeightGradients(std::unique_ptr<State> state);
  friend DeferredWeightGradients split_backward_impl(const Tensor&, const Tensor&, const std::vector<Tensor>&, bool);
  std::unique_ptr<State> state_;
  Status status_ = Status::kEmpty;
};

// Backward from `root`, seeded with `grad` (ones for a one-element root when undefined, as
// backward()), that accumulates gradients into the leaves in `inputs` only (their .grad, as
// backward() does) and returns what computes every other leaf's gradient later.
DeferredWeightGradients backward_input(const Tensor& root, const Tensor& grad, const std::vector<Tensor>& inputs);

// For checkpoint.h: backward_input, where an input no path reaches is no error (its .grad
// stays as it is).
DeferredWeightGradients split_backward_impl(const Tensor& root, const Tensor& grad, const std::vector<Tensor>& inputs,
                                            bool inputs_must_be_reached);

}  // namespace paratrain::autograd
