// The fused causal attention in f32 arithmetic on the CUDA cores (kernels/cuda/layers.h,
// attention_{forward,backward}_flash_f32; the kernels: flash_attention_f32_kernel.cuh). f32,
// bf16 or f16 q/k/v, out, dout and dqkv (widened to f32 in shared memory, results rounded
// once), f32 lse; head sizes 32, 64 and 128, qkv and dout (which the kernels read in 16-byte
// vectors) 16-byte aligned, B * NH up to 65535, and a GPU whose blocks may opt into the shared
// memory the head size needs: anything else is "not handled" (false, with the reason in
// words), for the caller to run another form. The backward's D (B*NH*T f32) comes from the
// device's caching allocator (stream-ordered).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/flash_attention_f32_kernel.cuh"
#include "kernels/cuda/flash_launch.h"
#include "kernels/cuda/flash_rowdot.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda {
namespace {

using flash32::Shape;

// The kernels' shared-memory opt-in (above the 48 KiB default), once per device.
template <int HS, typename E>
struct FlashF32Setup {
  FlashF32Setup() {
    detail::allow_shared_bytes(Shape<HS>::kForwardBytes, flash32::forward_kernel<HS, E>);
    detail::allow_shared_bytes(Shape<HS>::kBackwardBytes, flash32::backward_keys_kernel<HS, E>,
                               flash32::backward_queries_kernel<HS, E>);
  }
};

template <int HS>
constexpr int64_t shared_bytes() {
  return std::max(Shape<HS>::kForwardBytes, Shape<HS>::kBackwardBytes);
}

template <int HS, typename E>
void launch_forward(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  using S = typename E::S;
  detail::per_device<FlashF32Setup<HS, E>>();
  const dim3 grid(detail::ceil_div(T, flash32::kRows), static_cast<unsigned>(B * NH));
  flash32::forward_kernel<HS, E><<<grid, flash32::kThreads, Shape<HS>::kForwardBytes, detail::stream()>>>(
      static_cast<S*>(out), lse, static_cast<const S*>(qkv), T, C, static_cast<int>(NH),
      1.0f / std::sqrt(static_cast<float>(HS)));
  PT_CUDA_CHECK_LAUNCH();
}

template <int HS, typename E>
void launch_backward(void* dqkv_, const void* dout_, const void* qkv_, const void* out_, const float* lse, int64_t B,
                     int64_t T, int64_t C, int64_t NH) {
  using S = typename E::S;
  auto* dqkv = static_cast<S*>(dqkv_);
  const auto *dout = static_cast<const S*>(dout_), *qkv = static_cast<const S*>(qkv_),
             *out = static_cast<const S*>(out_);
  detail::per_device<FlashF32Setup<HS, E>>();
  const cudaStream_t s = detail::stream();
  const Tensor D = detail::flash_rowdot<HS, E>(dout, out, B, T, C, NH);
  const auto* d = static_cast<const float*>(D.data_ptr());
  const dim3 grid(detail::ceil_div(T, flash32::kRows), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int bytes = Shape<HS>::kBackwardBytes;
  flash32::backward_keys_kernel<HS, E><<<grid, flash32::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C,
                                                                             static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
  flash32::backward_queries_kernel<HS, E><<<grid, flash32::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C,
                                                                                static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
}

// f(detail::Elem<dtype>{}) for f32, bf16 and f16; InputError for any other dtype.
template <typename F>
auto with_element(DType dtype, const char* who, F&& f) {
  switch (dtype) {
    case DType::F32: return f(detail::Elem<DType::F32>{});
    case DType::BF16: return f(detail::Elem<DType::BF16>{});
    case DType::F16: return f(detail::Elem<DType::F16>{});
    default:
      PT_THROW(InputError, who, " (cuda, flash f32): dtype ", dtype_name(dtype),
               " (the f32-arithmetic flash kernels take f32, bf16 and f16)");
  }
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

bool attention_forward_flash_f32(DType dtype, void* out, float* lse, const void* qkv, int64_t B, int64_t T,
                                 int64_t C, int64_t NH, std::string* why) {
  return with_element(dtype, "attention_forward", [&](auto e) {
    std::string no = flash_attention_f32_refusal(B, T, C, NH, qkv, nullptr);
    if (!no.empty()) {
      if (why) *why = std::move(no);
      return false;
    }
    if (B == 0 || T == 0) return true;
    detail::with_flash_head_size(C / NH,
                                 [&](auto hs) { launch_forward<hs(), decltype(e)>(out, lse, qkv, B, T, C, NH); });
    return true;
  });
}

bool attention_backward_flash_f32(DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  return with_element(dtype, "attention_backward", [&](auto e) {
    if (!lse || !flash_attention_f32_refusal(B, T, C, NH, qkv, dout).empty()) return false;
    if (B == 0 || T == 0) return true;
    detail::with_flash_head_size(C / NH, [&](auto hs) {
      launch_backward<hs(), decltype(e)>(dqkv, dout, qkv, out, lse, B, T, C, NH);
    });
    return true;
  });
}

}  // namespace paratrain::kernels::cuda
