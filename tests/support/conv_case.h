// One convolution's shape for the conv kernel tests (the GPU's against the CPU's, and the
// CUDA passes' CPU emulation): N images of Ci x H x W, Co filters of K x K, stride, padding,
// with or without a bias; name() spells it for a failure's trace. Plain data.
#pragma once

#include <cstdint>
#include <string>

namespace paratrain::test {

struct ConvCase {
  int64_t N, Ci, H, W, Co, K, stride, pad;
  bool bias;
  std::string name() const {
    return "N" + std::to_string(N) + " Ci" + std::to_string(Ci) + " " + std::to_string(H) + "x" + std::to_string(W) +
           " Co" + std::to_string(Co) + " K" + std::to_string(K) + " s" + std::to_string(stride) + " p" +
           std::to_string(pad) + (bias ? " bias" : " no bias");
  }
};

}  // namespace paratrain::test
