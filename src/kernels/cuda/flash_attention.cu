// The fused causal attention on tensor cores (kernels/cuda/layers.h,
// attention_{forward,backward}_flash_bf16; the kernels: flash_attention_kernel.cuh). bf16
// q/k/v, out, dout and dqkv, f32 lse; head sizes 32, 64 and 128, C a multiple of 8, the bf16
// buffers the kernels read in 16-byte vectors 16-byte aligned, B * NH up to 65535, a GPU of
// compute capability 8.0 or newer: anything else is "not handled" (false), for the caller to
// run another form. The backward's D
// (B*NH*T f32) comes from the device's caching allocator (stream-ordered).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda::flash {
namespace wmma = nvcuda::wmma;

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) { return detail::Elem<DType::BF16>::store(f); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t v) { return detail::Elem<DType::BF16>::load(v); }

}  // namespace paratrain::kernels::cuda::flash

#include "kernels/cuda/flash_attention_kernel.cuh"

namespace paratrain::kernels::cuda {
namespace {

// The kernels' shared-memory opt-in (above the 48 KiB default), once per device.
template <int HS>
struct FlashSetup {
  FlashSetup() {
    const int fwd = flash::Layout<HS>::kBytes, bwd = flash::BackwardLayout<HS>::kBytes;
    PT_CUDA_CHECK(cudaFuncSetAttribute(flash::flash_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, fwd));
    PT_CUDA_CHECK(
        cudaFuncSetAttribute(flash::flash_backward_keys_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bwd));
    PT_CUDA_CHECK(
        cudaFuncSetAttribute(flash::flash_backward_queries_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bwd));
  }
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the current GPU has bf16 tensor cores (compute capability 8.0 or newer), where the
// kernels have their bodies (flash_attention_kernel.cuh: PT_FLASH_TENSOR_CORES).
struct Bf16TensorCores {
  bool present = false;
  Bf16TensorCores() {
    int major = 0;
    PT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ::paratrain::cuda::current_device()));
    present = major >= 8;
  }
};

// The shapes the kernels take (sizes already checked).
// f(std::integral_constant<int, HS>) for a head size handled() takes.
template <typename F>
void with_head_size(int64_t hs, F&& f) {
  switch (hs) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}

bool handled(int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  return (hs == 32 || hs == 64 || hs == 128) && C % 8 == 0 && B * NH <= 65535 &&
         (T + flash::kRows - 1) / flash::kRows <= 0x7fffffff && detail::per_device<Bf16TensorCores>().present;
}

void check_sizes(int64_t B, int64_t T, int64_t C, int64_t NH, const char* who) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    PT_THROW(InputError, who, " (cuda, flash): bad sizes B=", B, " T=", T, " C=", C, " NH=", NH);
}

template <int HS>
void launch_backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out, const float* lse,
                     int64_t B, int64_t T, int64_t C, int64_t NH) {
  detail::per_device<FlashSetup<HS>>();
  cudaStream_t s = detail::stream();
  Tensor D = Tensor::empty({B * NH * T}, DType::F32, Device::CUDA, ::paratrain::cuda::current_device());
  auto* d = static_cast<float*>(D.data_ptr());
  const int rows_per_block = 8;  // a warp per row, 256 threads
  flash::rowdot_kernel<<<detail::ceil_div(B * NH * T, rows_per_block), 32 * rows_per_block, 0, s>>>(
      d, dout, out, B, T, C, static_cast<int>(NH));
  PT_CUDA_CHECK_LAUNCH();
  const dim3 grid(detail::ceil_div(T, flash::kRows), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int bytes = flash::BackwardLayout<HS>::kBytes;
  flash::flash_backward_keys_kernel<HS><<<grid, flash::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, B, T, C,
                                                                           static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
  flash::flash_backward_queries_kernel<HS><<<grid, flash::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, B, T, C,
                                                                              static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
}

template <int HS>
void launch(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  detail::per_device<FlashSetup<HS>>();
  const dim3 grid(detail::ceil_div(T, flash::kRows), static_cast<unsigned>(B * NH));
  flash::flash_forward_kernel<HS><<<grid, flash::kThreads, flash::Layout<HS>::kBytes, detail::stream()>>>(
      out, lse, qkv, B, T, C, static_cast<int>(NH), 1.0f / std::sqrt(static_cast<float>(HS)));
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_forward_flash_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C,
                                  int64_t NH) {
  check_sizes(B, T, C, NH, "attention_forward");
  if (!handled(B, T, C, NH) || !aligned16(qkv)) return false;
  if (B == 0 || T == 0) return true;
  with_head_size(C / NH, [&](auto hs) { launch<hs()>(out, lse, qkv, B, T, C, NH); });
  return true;
}

bool attention_backward_flash_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                                   const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_sizes(B, T, C, NH, "attention_backward");
  if (!handled(B, T, C, NH) || !aligned16(qkv) || !aligned16(dout) || !lse) return false;
  if (B == 0 || T == 0) return true;
  with_head_size(C / NH, [&](auto hs) { launch_backward<hs()>(dqkv, dout, qkv, out, lse, B, T, C, NH); });
  return true;
}

}  // namespace paratrain::kernels::cuda
