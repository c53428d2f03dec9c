#include "kernels/cuda/register.h"

namespace paratrain::kernels::cuda {

void register_layer_kernels(Registry&) {}

}  // namespace paratrain::kernels::cuda
