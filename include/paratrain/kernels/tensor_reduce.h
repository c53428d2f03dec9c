// Values over a list of tensors that a training step reads once (the gradient norm, the loss
// scaler's inf check, the micro-batch losses), without a host/device sync per tensor: one
// kernel per tensor writes its term into device memory (reduce_into.h's reductions, or a copy
// of a scalar: a slot per tensor, one flag per device), then ONE copy per device brings them to
// the host.
//
// Every tensor must be contiguous; undefined and empty tensors are skipped. The kernels run
// on the current device's compute stream, so a CUDA tensor must be on the current device (as
// for every kernel call). The values are those of the per-tensor kernels (kernels/cpu/reduce.h):
// on the CPU, bit for bit what summing the host-returning sum_squares in list order gives.
// Thread-safety: calls on distinct tensors are safe from any thread.
#pragma once

#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels {

// 0.0 + sum_squares(ts[0]) + sum_squares(ts[1]) + ..., added in list order on the host.
double sum_of_squares(const std::vector<Tensor>& ts);
// True when no element of any tensor is inf or NaN.
bool all_finite(const std::vector<Tensor>& ts);
// The values of one-element f32, bf16 or f16 tensors (item() of each, in list order), read with
// one copy per device: a training step's micro-batch losses, read once after the step, not
// once per micro-batch. InputError for an undefined tensor, one of another size or dtype.
std::vector<double> values_of(const std::vector<Tensor>& scalars);

}  // namespace paratrain::kernels
