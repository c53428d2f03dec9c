// The cross-entropy of logits cut by vocabulary over the ranks of a tensor-parallel group
// (parallel/tensor_parallel/vocab_parallel_loss.h builds the op from these passes and two
// all-reduces). Each rank holds logits (N, Vl) of the vocabulary from vocab_start on, whose
// first `valid` columns are real and the rest padding (never read, gradient 0): the vocabulary
// padded to a multiple of tp, and past a rank's share the columns that align its rows
// (vocab_parallel_linear_cross_entropy's rows of ops::logits_row_stride).
// targets (N) int32 are global ids in [0, vocab_size) or kIgnoreIndex (softmax.h).
//
//   row_max (N)   = max of the row's valid columns; -inf for an ignored row   -> all-reduce max
//   sums (2N)     = [sum exp(x - row_max) over the valid columns | the target's logit when
//                   this rank holds it, else 0]; ignored rows 0               -> all-reduce sum
//   losses (N)    = lse - target logit, with lse = max + log(sum) written over row_max
//                   (0 and -inf left for ignored rows)
//   dlogits (N,Vl) = (exp(x - lse) - onehot(target)) * *scale over the valid columns, 0 in
//                   the padding and in ignored rows (OVERWRITES); scale (1) on the same device
//                   (crossentropy_grad_scale of reduce_into.h: g / count)
//
// Logits and dlogits are f32 (these signatures) or, under the half namespace, bf16/f16 read
// as f32 and rounded once; row_max, sums, losses, lse and scale are f32. The CPU kernels
// assume checked targets (the op checks them before the first all-reduce, as a host loop);
// the CUDA kernels (src/kernels/cuda/vocab_shard_ce.cu) make a bad target's loss NaN instead.
// Thread-safety: calls on distinct buffers are safe; each may use the kernel thread pool.
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {

void vocab_shard_row_max(float* row_max, const float* logits, const int32_t* targets, int64_t N, int64_t Vl,
                         int64_t valid);
void vocab_shard_exp_sums(float* sums, const float* logits, const float* row_max, const int32_t* targets, int64_t N,
                          int64_t Vl, int64_t valid, int64_t vocab_start);
void vocab_shard_losses(float* losses, float* lse, const float* sums, const int32_t* targets, int64_t N,
                        int64_t vocab_size);
void vocab_shard_ce_backward(float* dlogits, const float* logits, const float* lse, const float* scale,
                             const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start);

namespace half {
template <DType T>
void vocab_shard_row_max(float* row_max, const uint16_t* logits, const int32_t* targets, int64_t N, int64_t Vl,
                         int64_t valid);
template <DType T>
void vocab_shard_exp_sums(float* sums, const uint16_t* logits, const float* row_max, const int32_t* targets,
                          int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start);
template <DType T>
void vocab_shard_ce_backward(uint16_t* dlogits, const uint16_t* logits, const float* lse, const float* scale,
                             const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start);
}  // namespace half

}  // namespace paratrain::kernels::cpu
