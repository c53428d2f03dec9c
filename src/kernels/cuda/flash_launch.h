// What the flash attention launchers share (flash_attention.cu: the tensor-core kernels;
// flash_attention_f32.cu: the f32 ones): the head sizes they are compiled for, the size checks,
// what the current GPU offers them, and the reasons in words they give for not taking an
// attention (kernels/cuda/layers.h, flash_attention_refusal). Host code (a test compiles it
// too); FlashDevice is made once per device (detail::per_device) and any thread may ask for it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/launch.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::kernels::cuda::detail {

// f(std::integral_constant<int, HS>) for head size 32, 64 or 128 (any other runs 128: callers
// refuse other head sizes first).
template <typename F>
void with_flash_head_size(int64_t hs, F&& f) {
  switch (hs) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}

// `per_head_size(HS)` for head sizes 32, 64 and 128; 0 for any other.
template <typename F>
int64_t for_flash_head_sizes(int64_t hs, F&& per_head_size) {
  if (hs != 32 && hs != 64 && hs != 128) return 0;
  int64_t r = 0;
  with_flash_head_size(hs, [&](auto h) { r = per_head_size(h); });
  return r;
}

// Lets blocks of each kernel have `bytes` of dynamic shared memory (above the 48 KiB default);
// once per device and kernel is enough (callers hold it in a detail::per_device struct).
template <typename... Kernels>
void allow_shared_bytes(int bytes, Kernels... kernels) {
  for (const void* kernel : {reinterpret_cast<const void*>(kernels)...})
    PT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// InputError for sizes no attention has (`who` and `form` name the call).
inline void check_flash_sizes(int64_t B, int64_t T, int64_t C, int64_t NH, const char* who, const char* form) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    PT_THROW(InputError, who, " (cuda, ", form, "): bad sizes B=", B, " T=", T, " C=", C, " NH=", NH);
}

// What a GPU offers the kernels: its index, its compute capability as __CUDA_ARCH__ spells it
// (9.0: 900) and the shared memory a block may opt into (Turing: 64 KiB). The default
// constructor asks the current GPU (once per device: detail::per_device).
struct FlashDevice {
  int index = 0;
  int arch = 0;
  int64_t max_shared = 0;
  FlashDevice(int index_, int arch_, int64_t max_shared_) : index(index_), arch(arch_), max_shared(max_shared_) {}
  FlashDevice() : index(::paratrain::cuda::current_device()) {
    int major = 0, minor = 0, optin = 0;
    PT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
    PT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
    PT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
    arch = 100 * major + 10 * minor;
    max_shared = optin;
  }
};

// Why kernels needing `bytes` of shared memory a block (0: not compiled for this head size),
// with blocks of `rows` rows, do not take this shape, without asking a GPU; "" when they may.
inline std::string flash_shape_refusal(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t bytes, int rows) {
  using paratrain::detail::concat;
  if (bytes == 0) return concat("head size ", C / NH, " (they take 32, 64 and 128)");
  if (B * NH > 65535) return concat("B * NH = ", B * NH, ", more than one launch takes (65535)");
  if ((T + rows - 1) / rows > 0x7fffffff) return concat("T = ", T);
  return "";
}

// Why the device has no WMMA on `dtype` (which needs compute capability min_arch, __CUDA_ARCH__'s
// spelling), "" when it has.
inline std::string flash_arch_refusal(const FlashDevice& device, int min_arch, const char* dtype) {
  if (device.arch >= min_arch) return "";
  return paratrain::detail::concat("cuda:", device.index, " is compute capability ", device.arch / 100, ".",
                                   device.arch / 10 % 10, ", and WMMA on ", dtype, " needs ", min_arch / 100, ".",
                                   min_arch / 10 % 10);
}

// Why the device's blocks cannot have `bytes` of shared memory ("" when they can), then
// why qkv or dout (which the kernels read in 16-byte vectors; either may be null) are not taken.
inline std::string flash_device_refusal(int64_t C, int64_t NH, int64_t bytes, const FlashDevice& device,
                                        const void* qkv, const void* dout) {
  using paratrain::detail::concat;
  if (bytes > device.max_shared)
    return concat("head size ", C / NH, " needs ", bytes, " bytes of shared memory a block, and cuda:", device.index,
                  " gives ", device.max_shared);
  for (const auto& [name, p] : {std::pair{"qkv", qkv}, std::pair{"dout", dout}})
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return concat(name, " is not 16-byte aligned");
  return "";
}

}  // namespace paratrain::kernels::cuda::detail
