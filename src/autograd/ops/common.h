// Shared helpers of the op implementations (private to src/autograd/ops).
#pragma once

#include <memory>

#include "paratrain/autograd/engine.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::ops::detail {

namespace k = paratrain::kernels::cpu;  // constants and shape helpers only; kernels via kernel()
using kernels::kernel;  // kernel(&Registry::gelu_forward, x): the kernel for x's (device, dtype)
using kernels::Registry;

// x as a contiguous f32 tensor; InputError naming the op otherwise.
Tensor f32_contiguous(const Tensor& x, const char* op, const char* what);
// x as a contiguous i32 tensor of token ids / labels.
Tensor i32_contiguous(const Tensor& x, const char* op, const char* what);
void expect_same_shape(const Tensor& a, const Tensor& b, const char* op);

// Records a LambdaNode named `name` for outputs produced from `inputs`.
inline void record_lambda(const char* name, std::initializer_list<const Tensor*> inputs,
                          std::initializer_list<Tensor*> outputs, autograd::LambdaNode::Fn fn) {
  autograd::record(std::make_shared<autograd::LambdaNode>(name, std::move(fn)), inputs, outputs);
}

// The gradient g as a contiguous f32 tensor (materialising zeros if undefined).
Tensor grad_or_zeros(const Tensor& g, const Shape& shape);

}  // namespace paratrain::ops::detail

namespace paratrain::ops::detail {
// Records a LambdaNode whose backward also receives the node (to ask needs_input_grad(i)).
template <typename Fn>
void record_with_node(const char* name, std::initializer_list<const Tensor*> inputs,
                      std::initializer_list<Tensor*> outputs, Fn fn) {
  auto node = std::make_shared<autograd::LambdaNode>(name, nullptr);
  autograd::record(node, inputs, outputs);
  autograd::Node* raw = node.get();
  node->set_fn([fn = std::move(fn), raw](std::vector<Tensor>& g) { return fn(*raw, g); });
}
}  // namespace paratrain::ops::detail
