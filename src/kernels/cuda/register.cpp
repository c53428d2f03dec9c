#include "kernels/cuda/register.h"

namespace paratrain::kernels::cuda {

void register_kernels(Registry& r) {
  register_basic_kernels(r);
  register_layer_kernels(r);
  // the reductions into device memory (reduce_into.h)
  register_reduce_into_kernels(r);
}

}  // namespace paratrain::kernels::cuda
