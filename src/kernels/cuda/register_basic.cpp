#include "kernels/cuda/register.h"

namespace paratrain::kernels::cuda {

void register_basic_kernels(Registry&) {}

}  // namespace paratrain::kernels::cuda
