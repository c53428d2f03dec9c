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

// x as a contiguous floating-point tensor (f32, bf16, f16); InputError naming the op otherwise.
// The op's kernel is then found by x's dtype (NoKernelError when it has none).
Tensor float_contiguous(const Tensor& x, const char* op, const char* what);
// InputError unless every defined tensor has a's dtype ("op: weight is f32, input is bf16").
void expect_same_dtype(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts);
// InputError unless every defined tensor is on the first one's device ("linear: input is on
// cuda:0 but weight is on cpu (move the module with Module::to)"), and, when that is a GPU,
// unless it is the calling thread's current GPU (the kernels run there, tensor/cuda.h).
// An op's outputs and gradients are then allocated on that device (Tensor::new_empty).
void expect_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts);

// dst = src converted to dst's dtype (both contiguous, same numel, floating point), through
// the kernels' cast tables.
void convert_into(Tensor& dst, const Tensor& src);
// src converted to dtype t (src itself when it already is t). No graph.
Tensor convert(const Tensor& src, DType t);
// The wider of two floating dtypes for an elementwise op: f32 unless both are the same half.
DType widest(DType a, DType b);
// A handle on `half` (the cached half copy of parameter `param`) recorded in the graph as
// `param` cast: its gradient reaches `param` converted to param's dtype.
Tensor cast_view(const Tensor& half, const Tensor& param);
// x as a contiguous i32 tensor of token ids / labels.
Tensor i32_contiguous(const Tensor& x, const char* op, const char* what);
void expect_same_shape(const Tensor& a, const Tensor& b, const char* op);

// Records a LambdaNode named `name` for outputs produced from `inputs`.
inline void record_lambda(const char* name, std::initializer_list<const Tensor*> inputs,
                          std::initializer_list<Tensor*> outputs, autograd::LambdaNode::Fn fn) {
  autograd::record(std::make_shared<autograd::LambdaNode>(name, std::move(fn)), inputs, outputs);
}

// The gradient g as a contiguous tensor; f32 zeros of `shape` on `device` if undefined.
Tensor grad_or_zeros(const Tensor& g, const Shape& shape, DeviceSpec device);

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
