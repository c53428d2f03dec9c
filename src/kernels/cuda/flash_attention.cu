// The fused causal attention on tensor cores (kernels/cuda/layers.h,
// attention_{forward,backward}_flash; the kernels: flash_attention_kernel.cuh). bf16 or f16
// q/k/v, out, dout and dqkv, f32 lse; head sizes 32, 64 and 128, C a multiple of 8, the 16-bit
// buffers the kernels read in 16-byte vectors 16-byte aligned, B * NH up to 65535, a GPU with
// WMMA on the dtype (bf16: compute capability 8.0 or newer; f16: 7.0) and the shared memory the
// head size needs: anything else is "not handled" (false, with the reason in words), for the
// caller to run another form. The backward's D (B*NH*T f32) comes from the device's caching
// allocator (stream-ordered).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/flash_launch.h"
#include "kernels/cuda/flash_rowdot.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda::flash {
namespace wmma = nvcuda::wmma;

namespace {
// The kernels' 16-bit types (flash_attention_kernel.cuh), rounded to nearest even: bf16 bits
// through the CPU's conversions (detail::Elem), f16 through CUDA's (fewer registers than
// Elem's software widening; the values are the same, NaN payloads aside).
template <typename E>
struct Operand;
template <>
struct Operand<__nv_bfloat16> {
  static constexpr DType kType = DType::BF16;
  static constexpr int kMinArch = 800;  // bf16 WMMA: Ampere
  __device__ static float load(uint16_t v) { return detail::Elem<DType::BF16>::load(v); }
  __device__ static uint16_t store(float f) { return detail::Elem<DType::BF16>::store(f); }
  __device__ static __nv_bfloat16 round(float f) { return __float2bfloat16_rn(f); }
};
template <>
struct Operand<__half> {
  static constexpr DType kType = DType::F16;
  static constexpr int kMinArch = 700;  // f16 WMMA: Volta
  __device__ static float load(uint16_t v) { return __half2float(__ushort_as_half(v)); }
  __device__ static uint16_t store(float f) { return __half_as_ushort(__float2half_rn(f)); }
  __device__ static __half round(float f) { return __float2half_rn(f); }
};
}  // namespace

}  // namespace paratrain::kernels::cuda::flash

#include "kernels/cuda/flash_attention_kernel.cuh"

namespace paratrain::kernels::cuda {
namespace {

// The kernels' shared-memory opt-in (above the 48 KiB default), once per device.
template <int HS, typename E>
struct FlashSetup {
  FlashSetup() {
    detail::allow_shared_bytes(flash::Layout<HS>::kBytes, flash::flash_forward_kernel<HS, E>);
    detail::allow_shared_bytes(flash::BackwardLayout<HS>::kBytes, flash::flash_backward_keys_kernel<HS, E>,
                               flash::flash_backward_queries_kernel<HS, E>);
  }
};

template <int HS>
constexpr int64_t shared_bytes() {
  return std::max(flash::Layout<HS>::kBytes, flash::BackwardLayout<HS>::kBytes);
}

// Why the kernels on E do not take this attention on the current GPU, "" when they do (sizes
// already checked): the shapes first, so that a shape they never take needs no GPU to say so,
// then the GPU, then the buffers they read in 16-byte vectors (dout may be null: the forward).
template <typename E>
std::string refusal(int64_t B, int64_t T, int64_t C, int64_t NH, const void* qkv, const void* dout) {
  const int64_t bytes = flash_attention_shared_bytes(C / NH);
  if (std::string no = detail::flash_shape_refusal(B, T, C, NH, bytes, flash::kRows); !no.empty()) return no;
  const detail::FlashDevice& device = detail::per_device<detail::FlashDevice>();
  using Op = flash::Operand<E>;
  if (std::string no = detail::flash_arch_refusal(device, Op::kMinArch, dtype_name(Op::kType)); !no.empty()) return no;
  return detail::flash_device_refusal(C, NH, bytes, device, qkv, dout);
}

template <int HS, typename E>
void launch_backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out, const float* lse,
                     int64_t B, int64_t T, int64_t C, int64_t NH) {
  detail::per_device<FlashSetup<HS, E>>();
  cudaStream_t s = detail::stream();
  const Tensor D = detail::flash_rowdot<HS, detail::Elem<flash::Operand<E>::kType>>(dout, out, B, T, C, NH);
  const auto* d = static_cast<const float*>(D.data_ptr());
  const dim3 grid(detail::ceil_div(T, flash::kRows), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int bytes = flash::BackwardLayout<HS>::kBytes;
  flash::flash_backward_keys_kernel<HS, E><<<grid, flash::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, B, T, C,
                                                                              static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
  flash::flash_backward_queries_kernel<HS, E><<<grid, flash::kThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, B, T, C,
                                                                                 static_cast<int>(NH), scale);
  PT_CUDA_CHECK_LAUNCH();
}

template <int HS, typename E>
void launch(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  detail::per_device<FlashSetup<HS, E>>();
  const dim3 grid(detail::ceil_div(T, flash::kRows), static_cast<unsigned>(B * NH));
  flash::flash_forward_kernel<HS, E><<<grid, flash::kThreads, flash::Layout<HS>::kBytes, detail::stream()>>>(
      out, lse, qkv, B, T, C, static_cast<int>(NH), 1.0f / std::sqrt(static_cast<float>(HS)));
  PT_CUDA_CHECK_LAUNCH();
}

// f(E{}) for the kernels' type of `dtype` (bf16 or f16).
template <typename F>
auto with_operand(DType dtype, const char* who, F&& f) {
  if (dtype == DType::BF16) return f(__nv_bfloat16{});
  if (dtype == DType::F16) return f(__half{});
  PT_THROW(InputError, who, " (cuda, flash): dtype ", dtype_name(dtype), " (the flash kernels take bf16 and f16)");
}

}  // namespace

int64_t flash_attention_shared_bytes(int64_t head_size) {
  return detail::for_flash_head_sizes(head_size, [](auto hs) { return shared_bytes<hs()>(); });
}

std::string flash_attention_refusal(DType dtype, int64_t B, int64_t T, int64_t C, int64_t NH, const void* qkv,
                                    const void* dout) {
  detail::check_flash_sizes(B, T, C, NH, "flash_attention_refusal", "flash");
  if (dtype == DType::F32) return flash_attention_f32_refusal(B, T, C, NH, qkv, dout);
  if (dtype != DType::BF16 && dtype != DType::F16)
    PT_THROW(InputError, "flash_attention_refusal (cuda): dtype ", dtype_name(dtype),
             " (flash attention takes f32, bf16 and f16)");
  return with_operand(dtype, "flash_attention_refusal",
                      [&](auto e) { return refusal<decltype(e)>(B, T, C, NH, qkv, dout); });
}

bool attention_forward_flash(DType dtype, uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH, std::string* why) {
  detail::check_flash_sizes(B, T, C, NH, "attention_forward", "flash");
  return with_operand(dtype, "attention_forward", [&](auto e) {
    using E = decltype(e);
    if (std::string no = refusal<E>(B, T, C, NH, qkv, nullptr); !no.empty()) {
      if (why) *why = std::move(no);
      return false;
    }
    if (B == 0 || T == 0) return true;
    detail::with_flash_head_size(C / NH, [&](auto hs) { launch<hs(), E>(out, lse, qkv, B, T, C, NH); });
    return true;
  });
}

bool attention_backward_flash(DType dtype, uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                              const uint16_t* out, const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  detail::check_flash_sizes(B, T, C, NH, "attention_backward", "flash");
  return with_operand(dtype, "attention_backward", [&](auto e) {
    using E = decltype(e);
    if (!lse || !refusal<E>(B, T, C, NH, qkv, dout).empty()) return false;
    if (B == 0 || T == 0) return true;
    detail::with_flash_head_size(C / NH,
                                 [&](auto hs) { launch_backward<hs(), E>(dqkv, dout, qkv, out, lse, B, T, C, NH); });
    return true;
  });
}

bool attention_forward_flash(FlashKernels kernels, DType dtype, void* out, float* lse, const void* qkv, int64_t B,
                             int64_t T, int64_t C, int64_t NH, std::string* why) {
  if (kernels == FlashKernels::kF32Arithmetic || dtype == DType::F32)
    return attention_forward_flash_f32(dtype, out, lse, qkv, B, T, C, NH, why);
  return attention_forward_flash(dtype, static_cast<uint16_t*>(out), lse, static_cast<const uint16_t*>(qkv), B, T, C,
                                 NH, why);
}

bool attention_backward_flash(FlashKernels kernels, DType dtype, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (kernels == FlashKernels::kF32Arithmetic || dtype == DType::F32)
    return attention_backward_flash_f32(dtype, dqkv, dout, qkv, out, lse, B, T, C, NH);
  return attention_backward_flash(dtype, static_cast<uint16_t*>(dqkv), static_cast<const uint16_t*>(dout),
                                  static_cast<const uint16_t*>(qkv), static_cast<const uint16_t*>(out), lse, B, T, C,
                                  NH);
}

}  // namespace paratrain::kernels::cuda
