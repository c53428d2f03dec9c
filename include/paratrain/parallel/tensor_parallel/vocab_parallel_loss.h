// Vocab-parallel cross-entropy (Megatron-LM; REFERENCE.md, "Megatron tensor parallelism"):
// the mean cross-entropy of logits whose vocabulary dimension is split across the ranks of a
// tensor-parallel group, without any rank holding the [positions x vocab] logits.
//
// The vocabulary is padded to tp x Vl; rank r holds columns [r Vl, (r + 1) Vl). Per position:
// local max over the valid columns, all-reduce MAX; local sum of exp(logit - max) and the
// target's logit (0 on the ranks that do not hold it), one all-reduce SUM of both;
// loss = max + log(sumexp) - target logit. Backward is local: (softmax - onehot) * g / count on
// this rank's columns. Communication: one MAX all-reduce of N floats and one SUM all-reduce
// of 2N floats forward (timed into the TpGroup's stats), none backward.
//
// Arithmetic is f32 for every logits dtype (f32, bf16, f16): half logits are read as f32 one
// row at a time, never widened as a whole; the gradient is rounded to the logits' dtype once.
// The op does not consult autocast: it is already the f32 loss autocast asks for. The passes
// are the kernels of kernels/cpu/vocab_shard_ce.h, on the logits' device (CPU or CUDA); the
// mean and the count of non-ignored targets stay on that device (crossentropy_mean), and the
// backward reads its scale there, so nothing waits for a read-back. On the CPU a bad target is
// an InputError before the first all-reduce; on a GPU its loss is NaN (as ops::cross_entropy).
// Memory beyond the inputs: a few N-float buffers, and the gradient (N x Vl in the logits'
// dtype) in backward. Each row is computed by one thread (CPU) or one block (CUDA), so the
// result does not depend on the thread count.
//
// Thread-safety: a collective of `tp` (see comm_ops.h): every rank of the group calls it with
// the same positions, targets and vocab_size, in the same order as its other tp ops; one
// thread per rank.
#pragma once

#include <cstdint>
#include <memory>

#include "paratrain/parallel/tensor_parallel/comm_ops.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::parallel {

// logits (..., Vl): this rank's columns [vocab_start, vocab_start + Vl) of the vocabulary
// padded to tp x Vl; columns at or beyond vocab_size (padding) count as -inf (they never
// change the loss or get a gradient). targets (...) global token ids (i32; other integer
// types are converted), -1 = ignored. Returns the mean cross-entropy over the non-ignored
// positions as a one-element f32 tensor, the same value on every rank of tp (equal to
// ops::cross_entropy of the whole logits to f32 rounding); 0 when every target is ignored.
// When logits require grad, records a node whose backward writes this rank's dlogits
// (0 in the padding and on ignored rows); targets get no gradient.
//
// InputError (before any communication) for: logits not floating point or Vl == 0, targets
// not integer or not one per row of logits, vocab_start != tp->rank() * Vl, vocab_size
// outside [1, tp->size() * Vl], a target outside [-1, vocab_size). Every rank sees the same
// targets and sizes, so they all throw; a rank alone with a bad vocab_start leaves its peers
// waiting in the collective until the group's timeout.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                                    const std::shared_ptr<TpGroup>& tp);

// vocab_parallel_cross_entropy(matmul(hidden, weight, /*trans_b=*/true), ...) as one op
// (ops::linear_loss): the tied head of a vocab-parallel embedding and its loss, with this
// rank's logits only inside the op, in rows of ops::logits_row_stride(Vl) elements (16-byte
// aligned for cuBLASLt's fast GEMMs; GPT-2's 50257 over 2 ranks is 25129 columns a rank).
// hidden (..., C) as it reaches the head (already copied to or gathered over tp), weight
// (Vl, C) this rank's rows of the padded vocabulary; the same value and gradients as the two
// ops (bit for bit on the CPU). The same errors, naming the hidden states instead of the logits,
// and InputError for a weight that is not 2-D with rows or hidden states that do not fit it.
Tensor vocab_parallel_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                           int64_t vocab_start, int64_t vocab_size,
                                           const std::shared_ptr<TpGroup>& tp);

}  // namespace paratrain::parallel
