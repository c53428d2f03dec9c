// The element rules of CUDA kernels run on the CPU (tests/kernels/*_emulated_test.cpp): the
// kernels' E::S, E::load (widen to f32) and E::store (round once) through the CPU's
// conversions (tensor/dtype.h), bit for bit what detail::Elem does on a GPU, and the dtype
// whose CPU kernels (the registry's tables) they are checked against.
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::emulated {

struct F32 {
  using S = float;
  static constexpr DType kType = DType::F32;
  static float load(float v) { return v; }
  static float store(float f) { return f; }
};
struct BF16 {
  using S = uint16_t;
  static constexpr DType kType = DType::BF16;
  static float load(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t store(float f) { return f32_to_bf16(f); }
};
struct F16 {
  using S = uint16_t;
  static constexpr DType kType = DType::F16;
  static float load(uint16_t v) { return f16_to_f32(v); }
  static uint16_t store(float f) { return f32_to_f16(f); }
};

}  // namespace paratrain::kernels::emulated
