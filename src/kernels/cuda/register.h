// The CUDA kernels' registration, one function per group of kernels (src/kernels/cuda/*).
#pragma once

#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cuda {
// GEMM (cuBLASLt), elementwise, casts, reductions, the inf check, embedding, optimizers.
void register_basic_kernels(Registry& r);
// LayerNorm, softmax, fused softmax + cross-entropy, fused causal attention, conv2d, max-pool.
void register_layer_kernels(Registry& r);
// The reductions into device memory: sum_squares_into, nonfinite_into, sum_scaled,
// fill_scaled, crossentropy_mean, crossentropy_grad_scale (reduce_into.h), and the
// vocabulary-shard cross-entropy passes (vocab_shard_ce.h).
void register_reduce_into_kernels(Registry& r);
}  // namespace paratrain::kernels::cuda
