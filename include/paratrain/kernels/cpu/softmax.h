// Softmax and log-softmax over the last dimension (rows), and fused softmax + cross-entropy.
//
// All in f32 with max subtraction. Backward functions accumulate (dinp += ...), except
// crossentropy_backward, which writes dlogits (=) and may run in place over the logits.
//
// Buffers are the caller's, rows of the last dimension contiguous; nothing is kept after a
// call.
// Thread-safety: calls from different threads on distinct buffers are safe; each call may
// itself run on the kernel thread pool (kernels::cpu::set_num_threads).
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// Targets equal to kIgnoreIndex contribute loss 0 and gradient 0 (torch's ignore_index,
// which paratrain sets to -1).
constexpr int32_t kIgnoreIndex = -1;

// out (N,C), inp (N,C)
void softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
// dinp (N,C) += out * (dout - sum_c dout*out); out the forward's output
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);
// out (N,C) = inp - logsumexp(inp row)
void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
// dinp (N,C) += dout - exp(out) * sum_c dout; out the forward's output
void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                          int64_t C);

// Fused softmax + cross-entropy. Row n of the logits (and of dlogits) starts at n * ld, ld >= V
// (a row stride past V keeps rows aligned for a GEMM that writes or reads them, e.g. GPT-2's
// V = 50257 in rows of 50304); elements [V, ld) of a row are neither read nor written.
// losses (N), lse (N), logits (N,V; rows ld apart), targets (N) int32 in [0,V) or kIgnoreIndex
// losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]] (0 for ignored rows);
// lse[n] = logsumexp(logits[n,:]) saved for the backward (may be nullptr if unused).
// V up to any size (GPT-2's 50257 included). A target outside [0,V) throws InputError.
void crossentropy_forward(float* losses, float* lse, const float* logits,
                          const int32_t* targets, int64_t N, int64_t V, int64_t ld);
// dlogits (N,V; rows ld apart) = (softmax(logits) - onehot(target)) * dlosses[n]   (OVERWRITES; 0 rows for
// ignored targets). dlosses (N) per-row upstream gradient (e.g. 1/count for a mean loss),
// lse (N) from the forward. dlogits may equal logits (in place).
void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits,
                           const float* lse, const int32_t* targets, int64_t N, int64_t V, int64_t ld);

// One row of a vocabulary shard (the vocab-parallel cross-entropy computes its softmax from
// per-rank pieces): the max of x[0..n), and the sum of exp(x[c] - sub) over c < n, writing
// the exponentials to out[0..n) when out is not null (out may be x). Vectorised like the
// kernels above; f32.
float softmax_row_max(const float* x, int64_t n);
float softmax_row_exp_sum(float* out, const float* x, int64_t n, float sub);

}  // namespace paratrain::kernels::cpu
