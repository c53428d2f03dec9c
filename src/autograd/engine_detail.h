// Gradient bookkeeping shared by the engine's backward() and the split backward
// (split_backward.cpp); private to src/autograd. Inline, so backward() compiles as before.
#pragma once

#include <string>

#include "paratrain/autograd/node.h"
#include "paratrain/base/trace.h"
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
  PT_CHECK(dst.device_spec() == src.device_spec(), "gradient on ", src.device_spec().str(), " for a tensor whose ",
           "gradient is on ", dst.device_spec().str(), " (was the parameter moved after a backward?)");
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

// The backward's trace spans: one "backward <label>" span per run of nodes that carry the
// same scope label (Node::trace_label); at() before each node, the destructor closes the last.
// `prefix` (static): "backward " (the whole backward, or its input-gradient part) or
// "backward weights " (the deferred weight-gradient part of a split backward).
class BackwardSpans {
 public:
  explicit BackwardSpans(const char* prefix = "backward ") : prefix_(prefix) {}
  BackwardSpans(const BackwardSpans&) = delete;
  BackwardSpans& operator=(const BackwardSpans&) = delete;
  ~BackwardSpans() { close(); }
  void at(const Node& n) {
    if (n.trace_label == label_ || !trace::enabled()) return;
    close();
    label_ = n.trace_label;
    if (label_) start_ = trace::now_ns();
  }
  void close() {
    if (!label_) return;
    trace::complete(trace::intern(std::string(prefix_) + label_), "backward", trace::this_thread_track(), start_,
                    trace::now_ns());
    label_ = nullptr;
  }

 private:
  const char* prefix_;
  const char* label_ = nullptr;
  int64_t start_ = 0;
};

}  // namespace paratrain::autograd::detail
