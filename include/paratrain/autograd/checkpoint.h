// Activation recomputation (activation checkpointing): run a function without keeping the
// activations its backward needs, and run it again when backward reaches it.
//
// checkpoint(fn, x, gen) computes y = fn(x) with grad mode off, so nothing inside fn is
// saved, and records one node on y. When backward reaches it, the node restores `gen`'s
// state of the forward (dropout masks repeat), re-enters the forward's autocast state, runs
// fn on x detached (x' requires grad) with the graph, backpropagates the incoming gradient
// through it -- the parameters' gradients accumulate there and their grad-ready hooks fire
// -- puts `gen` back, and passes x'.grad on to x's graph. Same ops in the same order, so
// the gradients are bit for bit those of fn run with its graph. When grad mode is off, or x
// does not require a gradient (no graph to continue), it is just fn(x). Under the split
// backward (split_backward.h) the node recomputes in I the same way but backpropagates only
// x's part there; its parameters' part waits, with the recomputed graph, for run().
//
// Thread-safety: the calling thread's grad and autocast modes. Lifetime: fn, its captures
// and gen must live until the backward has run (or the graph is dropped).
#pragma once

#include <functional>

#include "paratrain/tensor/random.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::autograd {

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, Generator* gen = nullptr);

}  // namespace paratrain::autograd
