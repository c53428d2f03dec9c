#include "paratrain/kernels/registry.h"

namespace paratrain::kernels {

const Registry& registry() {
  static const Registry r = [] {
    Registry t;
    cpu::register_kernels(t);
    cpu::register_half_loss_kernels(t);
    return t;
  }();
  return r;
}

}  // namespace paratrain::kernels
