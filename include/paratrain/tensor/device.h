// Where a tensor lives: a device kind (cpu, cuda) and, for cuda, the GPU's index.
//
// DeviceSpec is the value users write ("cpu", "cuda", "cuda:1"); parse_device() reads it
// (InputError naming the text otherwise) and str() writes it back. "cuda" without an index
// means the current device of the calling thread (tensor/cuda.h), resolved when memory is
// allocated, so a tensor always knows its GPU (Tensor::device_index()).
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>

namespace paratrain {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

struct DeviceSpec {
  Device kind = Device::CPU;
  int index = -1;  // cuda: the GPU, -1 = the current device; cpu: ignored
  // "cpu", "cuda", "cuda:1".
  std::string str() const;
  bool operator==(const DeviceSpec&) const = default;
};

// "cpu" | "cuda" | "cuda:N" (N >= 0); InputError otherwise. Does not check the GPU is there.
DeviceSpec parse_device(const std::string& text);

}  // namespace paratrain
