#include "paratrain/kernels/registry.h"

namespace paratrain::kernels {

const Registry& registry() {
  static const Registry r = [] {
    Registry t;
    cpu::register_kernels(t);
    cpu::register_half_loss_kernels(t);
    cpu::register_vocab_shard_kernels(t);
#if PARATRAIN_HAVE_CUDA
    cuda::register_kernels(t);
#endif
    return t;
  }();
  return r;
}

}  // namespace paratrain::kernels
