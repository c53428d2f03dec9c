// Gradient bookkeeping shared by the engine's backward() and the split backward
// (split_backward.cpp); private to src/autograd. Inline, so backward() compiles as before.
#pragma once

#include "paratrain/autograd/node.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::autograd::detail {

// dst += src, elementwise (same shape, same dtype: a gradient has its tensor's dtype), by the
// dispatch point's add kernel for that dtype.
inline void accumulate_into(Tensor& dst, const Tensor& src) {
  PT_CHECK(dst.shape() == src.shape(), "gradient shape ", shape_str(src.shape()), " does not match ",
           shape_str(dst.shape()));
  PT_CHECK(dst.dtype() == src.dtype(), "gradient dtype ", dtype_name(src.dtype()), " does not match ",
           dtype_name(dst.dtype()));
  Tensor s = src.contiguous();
  kernels::kernel(&kernels::Registry::add, dst)(dst.data_ptr(), dst.data_ptr(), s.data_ptr(), dst.numel());
}

// The gradient buffer of one tensor: the first contribution is kept as is (no copy), later
// ones are summed into a private copy.
inline void add_grad(Tensor& slot, bool& owned, const Tensor& g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = g.is_contiguous() ? g : g.contiguous();
    owned = false;
    return;
  }
  if (!owned) {
    slot = slot.clone();
    owned = true;
  }
  accumulate_into(slot, g);
}

inline void accumulate_leaf(AutogradMeta& meta, const Tensor& g) {
  if (!g.defined()) return;
  if (!meta.grad) {
    // Take the incoming gradient as .grad when nothing else refers to its storage (the usual
    // case: a buffer the op just made); otherwise own a fresh copy, since it may be a view of
    // something the graph still uses.
    const bool exclusive = g.storage().use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
                           g.nbytes() == g.storage()->nbytes() && !g.autograd_meta_ptr();
    meta.grad = std::make_shared<Tensor>(exclusive ? g : g.clone());
  } else {
    accumulate_into(*meta.grad, g);
  }
}

inline void fire_hooks(AutogradMeta& meta) {
  if (meta.grad_ready_hooks.empty() || !meta.grad) return;
  for (auto& h : meta.grad_ready_hooks) h(*meta.grad);
}

}  // namespace paratrain::autograd::detail
