#include "paratrain/kernels/registry.h"

namespace paratrain::kernels {

const Registry& registry() {
  static const Registry r = [] {
    Registry t;
    cpu::register_kernels(t);
    // After the kernels: registry() is not usable inside the registration, but these only
    // look up the cast tables when they run.
    cpu::register_half_loss_kernels(t);
    return t;
  }();
  return r;
}

}  // namespace paratrain::kernels
