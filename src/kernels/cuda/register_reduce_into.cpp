// The CUDA reductions into device memory (kernels/cuda/reduce_into.h) in the dispatch tables
// for Device::CUDA: the same (dtype) entries as the CPU registers for them (f32, bf16, f16;
// the cross-entropy mean and its gradient scale f32 only), and the vocabulary-shard
// cross-entropy passes of tensor parallelism (vocab_shard_ce.h).
#include "kernels/cuda/reduce_into.h"
#include "kernels/cuda/register.h"
#include "kernels/cuda/vocab_shard_ce.h"

namespace paratrain::kernels::cuda {

void register_reduce_into_kernels(Registry& r) {
  constexpr Device G = Device::CUDA;
#define PT_CUDA_ALL_FLOAT(name)                           \
  r.name.set(G, DType::F32, &cuda::name<DType::F32>);    \
  r.name.set(G, DType::BF16, &cuda::name<DType::BF16>);  \
  r.name.set(G, DType::F16, &cuda::name<DType::F16>)
  PT_CUDA_ALL_FLOAT(sum_squares_into);
  PT_CUDA_ALL_FLOAT(nonfinite_into);
  PT_CUDA_ALL_FLOAT(sum_scaled);
  PT_CUDA_ALL_FLOAT(fill_scaled);
  // tensor parallelism's cross-entropy over a vocabulary shard (vocab_shard_ce.h)
  PT_CUDA_ALL_FLOAT(vocab_shard_row_max);
  PT_CUDA_ALL_FLOAT(vocab_shard_exp_sums);
  PT_CUDA_ALL_FLOAT(vocab_shard_ce_backward);
#undef PT_CUDA_ALL_FLOAT
  r.crossentropy_mean.set(G, DType::F32, &cuda::crossentropy_mean);
  r.crossentropy_grad_scale.set(G, DType::F32, &cuda::crossentropy_grad_scale);
  r.vocab_shard_losses.set(G, DType::F32, &cuda::vocab_shard_losses);
}

}  // namespace paratrain::kernels::cuda
