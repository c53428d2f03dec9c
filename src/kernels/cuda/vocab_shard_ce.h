// The vocabulary-shard cross-entropy passes on CUDA (kernels/cpu/vocab_shard_ce.h is the
// contract; src/kernels/cuda/vocab_shard_ce.cu says how they differ), with the erased
// signatures of the dispatch tables. T = F32, BF16, F16: the logits' and dlogits' dtype;
// row_max, sums, lse, losses and scale are f32 device buffers; sizes are host values. Each
// call only enqueues on the current device's compute stream. Thread-safety: any thread.
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cuda {

template <DType T>
void vocab_shard_row_max(void* row_max, const void* logits, const int32_t* targets, int64_t N, int64_t Vl,
                         int64_t valid);
template <DType T>
void vocab_shard_exp_sums(void* sums, const void* logits, const void* row_max, const int32_t* targets, int64_t N,
                          int64_t Vl, int64_t valid, int64_t vocab_start);
void vocab_shard_losses(void* losses, void* lse, const void* sums, const int32_t* targets, int64_t N,
                        int64_t vocab_size);
template <DType T>
void vocab_shard_ce_backward(void* dlogits, const void* logits, const void* lse, const void* scale,
                             const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start);

}  // namespace paratrain::kernels::cuda
