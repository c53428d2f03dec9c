// The CPU kernels in the dispatch tables (kernels/registry.h): every kernel for f32; for
// bf16 and f16 the half kernels of kernels/cpu/half.h (GEMMs, elementwise, activations,
// bias, dropout, strided_add, attention, conv, max-pool, sum/sum_squares/all_finite) and
// the casts. LayerNorm, softmax, log_softmax, cross-entropy, embedding/encoder and the
// optimizers stay f32 only (the mixed-precision policy): asking them for a half type is a
// NoKernelError. register_reduce_into adds the reductions into a buffer (reduce_into.h).
#include "paratrain/kernels/cpu/half.h"
#include "paratrain/kernels/cpu/reduce_into.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cpu {

static void register_reduce_into(Registry& r);

namespace {
// gemm_bias on the CPU: this dtype's gemm, then its bias_add (registry.h).
template <DType T>
void gemm_then_bias_add(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B,
                        const void* bias, void* out) {
  const Registry& r = registry();
  r.gemm.at(Device::CPU, T)(false, trans_b, M, N, K, 1.0f, A, K, B, trans_b ? K : N, 0.0f, out, N);
  r.bias_add.at(Device::CPU, T)(out, bias, M, N);
}
// gemm_bias_gelu on the CPU: its gemm_bias, then its gelu_forward (registry.h).
template <DType T>
void gemm_bias_then_gelu(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B,
                         const void* bias, void* pre, void* out) {
  const Registry& r = registry();
  r.gemm_bias.at(Device::CPU, T)(trans_b, M, N, K, A, B, bias, pre);
  r.gelu_forward.at(Device::CPU, T)(out, pre, M * N);
}
}  // namespace

void register_kernels(Registry& r) {
  constexpr Device C = Device::CPU;
  constexpr DType F = DType::F32;
#define PT_CPU_F32(name) r.name.set(C, F, erase<&cpu::name>)
  PT_CPU_F32(gemm);
  PT_CPU_F32(gemm_batched);
  PT_CPU_F32(fill);
  PT_CPU_F32(copy);
  PT_CPU_F32(add);
  PT_CPU_F32(sub);
  PT_CPU_F32(mul);
  PT_CPU_F32(scale);
  PT_CPU_F32(axpy);
  PT_CPU_F32(mul_acc);
  PT_CPU_F32(relu_forward);
  PT_CPU_F32(relu_backward);
  PT_CPU_F32(gelu_forward);
  PT_CPU_F32(gelu_backward);
  PT_CPU_F32(tanh_forward);
  PT_CPU_F32(tanh_backward);
  PT_CPU_F32(sigmoid_forward);
  PT_CPU_F32(sigmoid_backward);
  PT_CPU_F32(bias_add);
  PT_CPU_F32(bias_backward);
  PT_CPU_F32(dropout_forward);
  PT_CPU_F32(dropout_backward);
  r.dropout_mask.set(C, DType::U8, erase<&cpu::dropout_mask>);
  PT_CPU_F32(strided_add);
  PT_CPU_F32(layernorm_forward);
  PT_CPU_F32(layernorm_backward);
  PT_CPU_F32(softmax_forward);
  PT_CPU_F32(softmax_backward);
  PT_CPU_F32(log_softmax_forward);
  PT_CPU_F32(softmax_row_max);
  PT_CPU_F32(softmax_row_exp_sum);
  PT_CPU_F32(log_softmax_backward);
  PT_CPU_F32(crossentropy_forward);
  PT_CPU_F32(crossentropy_backward);
  PT_CPU_F32(attention_forward);
  PT_CPU_F32(attention_backward);
  PT_CPU_F32(attention_split_heads);
  PT_CPU_F32(attention_merge_heads);
  PT_CPU_F32(attention_chunk_softmax);
  PT_CPU_F32(attention_chunk_probs);
  PT_CPU_F32(attention_chunk_dscores);
  PT_CPU_F32(attention_rowdot);
  r.attention_split_heads.set(C, DType::BF16, erase<&cpu::attention_split_heads_bf16>);
  r.attention_split_heads.set(C, DType::F16, erase<&cpu::attention_split_heads_f16>);
  r.gemm_batched_to_f32.set(C, DType::BF16, erase<&cpu::gemm_batched_bf16>);
  r.attention_merge_heads.set(C, DType::BF16, erase<&cpu::attention_merge_heads_bf16>);
  r.attention_merge_heads.set(C, DType::F16, erase<&cpu::attention_merge_heads_f16>);
  PT_CPU_F32(embedding_forward);
  PT_CPU_F32(embedding_backward);
  PT_CPU_F32(vocab_embedding_forward);
  PT_CPU_F32(vocab_embedding_backward);
  PT_CPU_F32(encoder_forward);
  PT_CPU_F32(encoder_backward);
  PT_CPU_F32(conv2d_forward);
  PT_CPU_F32(conv2d_backward);
  PT_CPU_F32(maxpool2d_forward);
  PT_CPU_F32(maxpool2d_backward);
  PT_CPU_F32(sum);
  PT_CPU_F32(sum_squares);
  PT_CPU_F32(all_finite);
  PT_CPU_F32(adamw_update);
  PT_CPU_F32(adamw_update_multi);
  PT_CPU_F32(sgd_update);
  PT_CPU_F32(orthogonalize_columns);
#undef PT_CPU_F32
#define PT_CPU_HALF(name)                                      \
  r.name.set(C, DType::BF16, erase<&half::name<DType::BF16>>); \
  r.name.set(C, DType::F16, erase<&half::name<DType::F16>>)
  PT_CPU_HALF(gemm);
  PT_CPU_HALF(gemm_batched);
  PT_CPU_HALF(fill);
  PT_CPU_HALF(copy);
  PT_CPU_HALF(add);
  PT_CPU_HALF(sub);
  PT_CPU_HALF(mul);
  PT_CPU_HALF(scale);
  PT_CPU_HALF(axpy);
  PT_CPU_HALF(mul_acc);
  PT_CPU_HALF(relu_forward);
  PT_CPU_HALF(relu_backward);
  PT_CPU_HALF(gelu_forward);
  PT_CPU_HALF(gelu_backward);
  PT_CPU_HALF(tanh_forward);
  PT_CPU_HALF(tanh_backward);
  PT_CPU_HALF(sigmoid_forward);
  PT_CPU_HALF(sigmoid_backward);
  PT_CPU_HALF(bias_add);
  PT_CPU_HALF(bias_backward);
  PT_CPU_HALF(dropout_forward);
  PT_CPU_HALF(dropout_backward);
  PT_CPU_HALF(strided_add);
  PT_CPU_HALF(attention_forward);
  PT_CPU_HALF(attention_backward);
  PT_CPU_HALF(conv2d_forward);
  PT_CPU_HALF(conv2d_backward);
  PT_CPU_HALF(maxpool2d_forward);
  PT_CPU_HALF(maxpool2d_backward);
  PT_CPU_HALF(sum);
  PT_CPU_HALF(sum_squares);
  PT_CPU_HALF(all_finite);
#undef PT_CPU_HALF
  r.cast_from_f32.set(C, DType::BF16, erase<&cpu::f32_to_bf16>);
  r.cast_from_f32.set(C, DType::F16, erase<&cpu::f32_to_f16>);
  r.cast_from_f32.set(C, F, erase<&cpu::copy>);
  r.cast_to_f32.set(C, DType::BF16, erase<&cpu::bf16_to_f32>);
  r.cast_to_f32.set(C, DType::F16, erase<&cpu::f16_to_f32>);
  r.cast_to_f32.set(C, F, erase<&cpu::copy>);
  r.gemm_bias.set(C, F, &gemm_then_bias_add<DType::F32>);
  r.gemm_bias.set(C, DType::BF16, &gemm_then_bias_add<DType::BF16>);
  r.gemm_bias.set(C, DType::F16, &gemm_then_bias_add<DType::F16>);
  r.gemm_bias_gelu.set(C, F, &gemm_bias_then_gelu<DType::F32>);
  r.gemm_bias_gelu.set(C, DType::BF16, &gemm_bias_then_gelu<DType::BF16>);
  r.gemm_bias_gelu.set(C, DType::F16, &gemm_bias_then_gelu<DType::F16>);
  register_reduce_into(r);
}

// reduce_into.h: f32, and bf16/f16 for the ones over a gradient or an op's input
void register_reduce_into(Registry& r) {
  constexpr Device C = Device::CPU;
  constexpr DType F = DType::F32;
#define PT_CPU_INTO(name)                                      \
  r.name.set(C, F, erase<&cpu::name>);                         \
  r.name.set(C, DType::BF16, erase<&half::name<DType::BF16>>); \
  r.name.set(C, DType::F16, erase<&half::name<DType::F16>>)
  PT_CPU_INTO(sum_squares_into);
  PT_CPU_INTO(nonfinite_into);
  PT_CPU_INTO(sum_scaled);
  PT_CPU_INTO(fill_scaled);
#undef PT_CPU_INTO
  r.crossentropy_mean.set(C, F, erase<&cpu::crossentropy_mean>);
  r.crossentropy_grad_scale.set(C, F, erase<&cpu::crossentropy_grad_scale>);
}

}  // namespace paratrain::kernels::cpu
