// The CUDA layer kernels (kernels/cuda/layers.h) in the dispatch tables for Device::CUDA:
// f32 for LayerNorm, softmax, log-softmax, cross-entropy and attention; bf16 where the CPU
// registers bf16 for the same table (attention, cross-entropy), with the CPU's buffer
// dtypes (lse, losses and dlosses f32); conv2d and max-pool for f32, bf16 and f16, as the CPU
// (conv.h). softmax_row_max and softmax_row_exp_sum return a
// host float per row and have no CUDA kernel (NoKernelError).
#include "kernels/cuda/conv.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/register.h"

namespace paratrain::kernels::cuda {

void register_layer_kernels(Registry& r) {
  constexpr Device G = Device::CUDA;
  constexpr DType F = DType::F32, BF = DType::BF16;
  r.layernorm_forward.set(G, F, erase<&cuda::layernorm_forward>);
  r.layernorm_backward.set(G, F, erase<&cuda::layernorm_backward>);
  r.softmax_forward.set(G, F, erase<&cuda::softmax_forward>);
  r.softmax_backward.set(G, F, erase<&cuda::softmax_backward>);
  r.log_softmax_forward.set(G, F, erase<&cuda::log_softmax_forward>);
  r.log_softmax_backward.set(G, F, erase<&cuda::log_softmax_backward>);
  r.crossentropy_forward.set(G, F, erase<&cuda::crossentropy_forward>);
  r.crossentropy_forward.set(G, BF, erase<&cuda::crossentropy_forward_bf16>);
  r.crossentropy_backward.set(G, F, erase<&cuda::crossentropy_backward>);
  r.crossentropy_backward.set(G, BF, erase<&cuda::crossentropy_backward_bf16>);
  r.attention_forward.set(G, F, erase<&cuda::attention_forward>);
  r.attention_forward.set(G, BF, erase<&cuda::attention_forward_bf16>);
  r.attention_backward.set(G, F, erase<&cuda::attention_backward>);
  r.attention_backward.set(G, BF, erase<&cuda::attention_backward_bf16>);
#define PT_CUDA_ALL(name)                              \
  r.name.set(G, F, &cuda::name<DType::F32>);           \
  r.name.set(G, BF, &cuda::name<DType::BF16>);         \
  r.name.set(G, DType::F16, &cuda::name<DType::F16>)
  PT_CUDA_ALL(conv2d_forward);
  PT_CUDA_ALL(conv2d_backward);
  PT_CUDA_ALL(maxpool2d_forward);
  PT_CUDA_ALL(maxpool2d_backward);
#undef PT_CUDA_ALL
}

}  // namespace paratrain::kernels::cuda
