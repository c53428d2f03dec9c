// The basic CUDA kernels (kernels/cuda/basic.h) in the dispatch tables for Device::CUDA:
// every one for f32; for bf16 and f16 the tables the CPU registers for the half types (GEMMs,
// elementwise, activations, bias, dropout, strided_add, sum/sum_squares/all_finite) and the
// casts. Embedding (also vocab_embedding)/encoder and the optimizers stay f32 only, as on the CPU (the
// mixed-precision policy): asking them for a half type is a NoKernelError.
#include "kernels/cuda/basic.h"
#include "kernels/cuda/register.h"

namespace paratrain::kernels::cuda {

void register_basic_kernels(Registry& r) {
  constexpr Device G = Device::CUDA;
#define PT_CUDA_ALL(name)                                   \
  r.name.set(G, DType::F32, &cuda::name<DType::F32>);      \
  r.name.set(G, DType::BF16, &cuda::name<DType::BF16>);    \
  r.name.set(G, DType::F16, &cuda::name<DType::F16>)
  PT_CUDA_ALL(gemm);
  PT_CUDA_ALL(gemm_batched);
  PT_CUDA_ALL(gemm_bias);
  PT_CUDA_ALL(gemm_bias_gelu);
  r.gemm_batched_to_f32.set(G, DType::BF16, &cuda::gemm_batched_to_f32<DType::BF16>);
  PT_CUDA_ALL(fill);
  PT_CUDA_ALL(copy);
  PT_CUDA_ALL(add);
  PT_CUDA_ALL(sub);
  PT_CUDA_ALL(mul);
  PT_CUDA_ALL(scale);
  PT_CUDA_ALL(axpy);
  PT_CUDA_ALL(mul_acc);
  PT_CUDA_ALL(relu_forward);
  PT_CUDA_ALL(relu_backward);
  PT_CUDA_ALL(gelu_forward);
  PT_CUDA_ALL(gelu_backward);
  PT_CUDA_ALL(tanh_forward);
  PT_CUDA_ALL(tanh_backward);
  PT_CUDA_ALL(sigmoid_forward);
  PT_CUDA_ALL(sigmoid_backward);
  PT_CUDA_ALL(bias_add);
  PT_CUDA_ALL(bias_backward);
  PT_CUDA_ALL(dropout_forward);
  PT_CUDA_ALL(dropout_backward);
  r.dropout_mask.set(G, DType::U8, &cuda::dropout_mask);
  PT_CUDA_ALL(strided_add);
  PT_CUDA_ALL(sum);
  PT_CUDA_ALL(sum_squares);
  PT_CUDA_ALL(all_finite);
#undef PT_CUDA_ALL
  r.cast_from_f32.set(G, DType::F32, &cuda::copy<DType::F32>);
  r.cast_from_f32.set(G, DType::BF16, &cuda::cast_from_f32<DType::BF16>);
  r.cast_from_f32.set(G, DType::F16, &cuda::cast_from_f32<DType::F16>);
  r.cast_to_f32.set(G, DType::F32, &cuda::copy<DType::F32>);
  r.cast_to_f32.set(G, DType::BF16, &cuda::cast_to_f32<DType::BF16>);
  r.cast_to_f32.set(G, DType::F16, &cuda::cast_to_f32<DType::F16>);

  constexpr DType F = DType::F32;
  r.embedding_forward.set(G, F, &cuda::embedding_forward);
  r.embedding_backward.set(G, F, &cuda::embedding_backward);
  r.vocab_embedding_forward.set(G, F, &cuda::vocab_embedding_forward);
  r.vocab_embedding_backward.set(G, F, &cuda::vocab_embedding_backward);
  r.encoder_forward.set(G, F, &cuda::encoder_forward);
  r.encoder_backward.set(G, F, &cuda::encoder_backward);
  r.adamw_update.set(G, F, &cuda::adamw_update);
  r.adamw_update_multi.set(G, F, &cuda::adamw_update_multi);
  r.sgd_update.set(G, F, &cuda::sgd_update);
  r.orthogonalize_columns.set(G, F, &cuda::orthogonalize_columns);
}

}  // namespace paratrain::kernels::cuda
