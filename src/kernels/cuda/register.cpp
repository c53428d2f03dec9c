#include "kernels/cuda/register.h"

namespace paratrain::kernels::cuda {

void register_kernels(Registry& r) {
  register_basic_kernels(r);
  register_layer_kernels(r);
}

}  // namespace paratrain::kernels::cuda
