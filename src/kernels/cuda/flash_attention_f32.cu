// The fused causal attention in f32 on the CUDA cores (kernels/cuda/layers.h,
// attention_{forward,backward}_flash_f32; the kernels: flash_attention_f32_kernel.cuh). f32
// q/k/v, out, dout, dqkv and lse; head sizes 32, 64 and 128, qkv and dout (which the kernels
// read in 16-byte vectors) 16-byte aligned, B * NH up to 65535, and a GPU whose blocks may opt
// into the shared memory the head size needs: anything else is "not handled" (false, with the
// reason in words), for the caller to run another form. The backward's D (B*NH*T f32) comes
// from the device's caching allocator (stream-ordered).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/flash_attention_f32_kernel.cuh"
#include "kernels/cuda/flash_launch.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda {
namespace {

using flash32::Shape;

// The kernels' shared-memory opt-in (above the 48 KiB default), once per device.
template <int HS>
struct FlashF32Setup {
  FlashF32Setup() {
    const int fwd = Shape<HS>::kForwardBytes, bwd = Shape<HS>::kBackwardBytes;
    PT_CUDA_CHECK(
        cudaFuncSetAttribute(flash32::forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, fwd));
    PT_CUDA_CHECK(cudaFuncSetAttribute(flash32::backward_keys_kernel<HS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bwd));
    PT_CUDA_CHECK(cudaFuncSetAttribute(flash32::backward_queries_kernel<HS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bwd));
  }
};

template <int HS>
constexpr int64_t shared_bytes() {
  return std::max(Shape<HS>::kForwardBytes, Shape<HS>::kBackwardBytes);
}

template <int HS>
void launch_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  detail::per_device<FlashF32Setup<HS>>();
  const dim3 grid(detail::ceil_div(T, flash32::kRows), static_cast<unsigned>(B * NH));
  flash32::forward_kernel<HS><<<grid, flash32::kThreads, Shape<HS>::kForwardBytes, detail::stream()>>>(
      out, lse, qkv, T, C, static_cast<int>(NH), 1.0f / std::sqrt(static_cast<float>(HS)));
  PT_CUDA_CHECK_LAUNCH();
}

template <int HS>
void launch_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                     int64_t T, int64_t C, int64_t NH) {
  detail::per_device<FlashF32Setup<HS>>();
  const cudaStream_t s = detail::stream();
  Tensor D = Tensor::empty({B * NH * T}, DType::F32, Device::CUDA, ::paratrain::cuda::current_device());
  auto* d = static_cast<float*>(D.data_ptr());
  flash32::rowdot_kernel<HS><<<detail::ceil_div(B * NH * T, flash32::kRowdotRows), 32 * flash32::kRowdotRows, 0, s>>>(
      d, dout, out, B, T, C, static_cast<int>(NH));
  PT_CUDA_CHECK_LAUNCH();
  const dim3 grid(detail::ceil_div(T, flash32::kRows), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int bytes = Shape<HS>::kBackwardBytes;
  flash32::backward_keys_kernel<HS><<<grid, flash32::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C,
                                                                          static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
  flash32::backward_queries_kernel<HS><<<grid, flash32::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C,
                                                                             static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t flash_attention_f32_shared_bytes(int64_t head_size) {
  return detail::for_flash_head_sizes(head_size, [](auto hs) { return shared_bytes<hs()>(); });
}

std::string flash_attention_f32_refusal(int64_t B, int64_t T, int64_t C, int64_t NH, const void* qkv,
                                        const void* dout) {
  detail::check_flash_sizes(B, T, C, NH, "flash_attention_refusal", "flash f32");
  const int64_t bytes = flash_attention_f32_shared_bytes(C / NH);
  if (std::string no = detail::flash_shape_refusal(B, T, C, NH, bytes, flash32::kRows); !no.empty()) return no;
  return detail::flash_device_refusal(C, NH, bytes, detail::per_device<detail::FlashDevice>(), qkv, dout);
}

bool attention_forward_flash_f32(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t NH, std::string* why) {
  std::string no = flash_attention_f32_refusal(B, T, C, NH, qkv, nullptr);
  if (!no.empty()) {
    if (why) *why = std::move(no);
    return false;
  }
  if (B == 0 || T == 0) return true;
  detail::with_flash_head_size(C / NH, [&](auto hs) { launch_forward<hs()>(out, lse, qkv, B, T, C, NH); });
  return true;
}

bool attention_backward_flash_f32(float* dqkv, const float* dout, const float* qkv, const float* out,
                                  const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (!lse || !flash_attention_f32_refusal(B, T, C, NH, qkv, dout).empty()) return false;
  if (B == 0 || T == 0) return true;
  detail::with_flash_head_size(C / NH, [&](auto hs) { launch_backward<hs()>(dqkv, dout, qkv, out, lse, B, T, C, NH); });
  return true;
}

}  // namespace paratrain::kernels::cuda
