// Every kernel table of the dispatch point (kernels/dispatch.h), one per op, with the
// signatures of the typed CPU kernels (kernels/cpu/*.h, whose shape legends are the
// contract) with their f32 buffers erased to void*.
//
//   kernels::kernel(&Registry::gelu_forward, x)(out.data_ptr(), x.data_ptr(), n);
//   kernels::registry().gemm.at(Device::CPU, DType::F32)(...);   // raw buffers
//
// registry() fills the tables on first use: the CPU kernels for f32 (and every other
// (device, dtype) a backend registers). Thread-safe (a function-local static; read-only
// afterwards). Lifetime: the whole program.
#pragma once

#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/dispatch.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels {

#define PT_KERNEL_TABLE(name) KernelTable<Erased<decltype(cpu::name)>> name{#name}

struct Registry {
  // gemm.h
  PT_KERNEL_TABLE(gemm);
  PT_KERNEL_TABLE(gemm_batched);
  // A and B in the table's dtype (bf16), C and the accumulation f32: cpu::gemm_batched_bf16.
  KernelTable<Erased<decltype(cpu::gemm_batched)>> gemm_batched_to_f32{"gemm_batched_to_f32"};
  // A linear layer's forward with its bias: out (M,N) = A (M,K) op(B) + bias (N) in every row,
  // op(B) = B (K,N), or B^T with B (N,K) when trans_b; contiguous (lda K, ldb K or N, ldc N),
  // all in the table's dtype. The CPU's is its gemm, then its bias_add (the bits of the two
  // calls); CUDA's is one cuBLASLt GEMM with the bias epilogue (f32 accumulation, the bias
  // added before the one rounding to the output type), so the output is written once.
  KernelTable<void(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
                   void* out)>
      gemm_bias{"gemm_bias"};
  // A linear layer with its bias and the tanh GELU after it (a GPT MLP's c_fc):
  // pre (M,N) = A op(B) + bias as gemm_bias, out (M,N) = gelu(pre); pre is what the GELU's
  // backward needs. The CPU's is its gemm_bias, then its gelu_forward (the bits of the two);
  // CUDA's is one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue (pre and out both written from
  // the f32 accumulator, each rounded once), where the shape allows it (N % 8 == 0).
  KernelTable<void(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
                   void* pre, void* out)>
      gemm_bias_gelu{"gemm_bias_gelu"};
  // elementwise.h
  PT_KERNEL_TABLE(fill);
  PT_KERNEL_TABLE(copy);
  PT_KERNEL_TABLE(add);
  PT_KERNEL_TABLE(sub);
  PT_KERNEL_TABLE(mul);
  PT_KERNEL_TABLE(scale);
  PT_KERNEL_TABLE(axpy);
  PT_KERNEL_TABLE(mul_acc);
  PT_KERNEL_TABLE(relu_forward);
  PT_KERNEL_TABLE(relu_backward);
  PT_KERNEL_TABLE(gelu_forward);
  PT_KERNEL_TABLE(gelu_backward);
  PT_KERNEL_TABLE(tanh_forward);
  PT_KERNEL_TABLE(tanh_backward);
  PT_KERNEL_TABLE(sigmoid_forward);
  PT_KERNEL_TABLE(sigmoid_backward);
  PT_KERNEL_TABLE(bias_add);
  PT_KERNEL_TABLE(bias_backward);
  PT_KERNEL_TABLE(dropout_forward);
  PT_KERNEL_TABLE(dropout_backward);
  PT_KERNEL_TABLE(dropout_mask);  // keyed by (device, U8)
  PT_KERNEL_TABLE(strided_add);
  // layernorm.h, softmax.h, attention.h, embedding.h, conv.h
  PT_KERNEL_TABLE(layernorm_forward);
  PT_KERNEL_TABLE(layernorm_backward);
  PT_KERNEL_TABLE(softmax_forward);
  PT_KERNEL_TABLE(softmax_backward);
  PT_KERNEL_TABLE(log_softmax_forward);
  PT_KERNEL_TABLE(log_softmax_backward);
  PT_KERNEL_TABLE(crossentropy_forward);
  PT_KERNEL_TABLE(crossentropy_backward);
  PT_KERNEL_TABLE(softmax_row_max);
  PT_KERNEL_TABLE(softmax_row_exp_sum);
  PT_KERNEL_TABLE(attention_forward);
  PT_KERNEL_TABLE(attention_backward);
  // attention_parts.h (attention by batched GEMMs): split/merge keyed by x's dtype, the row
  // passes by f32
  PT_KERNEL_TABLE(attention_split_heads);
  PT_KERNEL_TABLE(attention_merge_heads);
  PT_KERNEL_TABLE(attention_chunk_softmax);
  PT_KERNEL_TABLE(attention_chunk_probs);
  PT_KERNEL_TABLE(attention_chunk_dscores);
  PT_KERNEL_TABLE(attention_rowdot);
  PT_KERNEL_TABLE(embedding_forward);
  PT_KERNEL_TABLE(embedding_backward);
  PT_KERNEL_TABLE(vocab_embedding_forward);
  PT_KERNEL_TABLE(vocab_embedding_backward);
  PT_KERNEL_TABLE(encoder_forward);
  PT_KERNEL_TABLE(encoder_backward);
  PT_KERNEL_TABLE(conv2d_forward);
  PT_KERNEL_TABLE(conv2d_backward);
  PT_KERNEL_TABLE(maxpool2d_forward);
  PT_KERNEL_TABLE(maxpool2d_backward);
  // conversions: cast_from_f32 is keyed by the dtype it writes, cast_to_f32 by the one it reads
  KernelTable<void(void* out, const void* in, int64_t n)> cast_from_f32{"cast_from_f32"};
  KernelTable<void(void* out, const void* in, int64_t n)> cast_to_f32{"cast_to_f32"};
  // reduce.h
  PT_KERNEL_TABLE(sum);
  PT_KERNEL_TABLE(sum_squares);
  PT_KERNEL_TABLE(all_finite);
  // reduce_into.h: the reductions that keep their value in device memory (no host sync);
  // keyed by the dtype of x (fill_scaled: of out; crossentropy_*: the f32 losses)
  PT_KERNEL_TABLE(sum_squares_into);
  PT_KERNEL_TABLE(nonfinite_into);
  PT_KERNEL_TABLE(sum_scaled);
  PT_KERNEL_TABLE(fill_scaled);
  PT_KERNEL_TABLE(crossentropy_mean);
  PT_KERNEL_TABLE(crossentropy_grad_scale);
  // vocab_shard_ce.h (tensor parallelism's cross-entropy), keyed by the logits' dtype
  // (vocab_shard_losses: f32, its sums)
  PT_KERNEL_TABLE(vocab_shard_row_max);
  PT_KERNEL_TABLE(vocab_shard_exp_sums);
  PT_KERNEL_TABLE(vocab_shard_losses);
  PT_KERNEL_TABLE(vocab_shard_ce_backward);
  // optim.h: parameters, gradients and state in the table's dtype
  PT_KERNEL_TABLE(adamw_update);
  PT_KERNEL_TABLE(adamw_update_multi);
  PT_KERNEL_TABLE(sgd_update);
  // orthogonalize.h: PowerSGD's factor, f32
  PT_KERNEL_TABLE(orthogonalize_columns);
};

#undef PT_KERNEL_TABLE

// The tables, filled on first use.
const Registry& registry();

// The kernel of `table` for t's (device, dtype); NoKernelError naming the kernel, the device
// and the dtype when there is none.
template <typename Table>
auto kernel(Table Registry::*table, const Tensor& t) {
  return (registry().*table).at(t.device(), t.dtype());
}

namespace cpu {
// Puts the CPU kernels into `r` (f32; the half types where a kernel exists).
void register_kernels(Registry& r);
// Cross-entropy on bf16/f16 logits with f32 math (src/kernels/cpu/half_loss.cpp).
void register_half_loss_kernels(Registry& r);
// The vocabulary-shard cross-entropy passes (src/kernels/cpu/vocab_shard_ce.cpp).
void register_vocab_shard_kernels(Registry& r);
}  // namespace cpu

namespace cuda {
// Puts the CUDA kernels into `r` for Device::CUDA (src/kernels/cuda; builds with CUDA only).
// They take device pointers of the current device and run on its compute stream
// (tensor/cuda.h); a kernel returning a value (sum, all_finite) waits for that stream, the
// reduce_into.h ones (their result in device memory) do not.
void register_kernels(Registry& r);
}  // namespace cuda

}  // namespace paratrain::kernels
