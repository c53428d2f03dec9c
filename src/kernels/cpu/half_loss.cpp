// Cross-entropy on bf16/f16 logits with f32 math, for (cpu, bf16) and (cpu, f16): the loss
// stays f32 (the mixed-precision policy) while the [tokens x vocab] logits saved for the
// backward stay in the half type, half the bytes of an f32 copy.
//
// forward:  losses, lse (N) f32; logits (N,V; rows ld apart) in T; targets int32. The logits are
//           widened to f32 (exact) in reused scratch (rows V apart) and the f32 kernel runs: the
//           same numbers as casting the logits to f32 and calling the f32 kernel.
// backward: dlogits (N,V; rows ld apart) in T (OVERWRITTEN, as the f32 kernel) = round_T of the
//           f32 result: the same as the f32 kernel followed by a cast of its gradient back to T.
// Elements [V, ld) of a row are neither read nor written.
#include "kernels/cpu/half_util.h"
#include "kernels/cpu/rows.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cpu {
namespace {

template <DType T>
void crossentropy_forward_half(void* losses, void* lse, const void* logits, const int32_t* targets, int64_t N,
                               int64_t V, int64_t ld) {
  detail::check_row_stride(V, ld, "crossentropy_forward");
  float* f = detail::half_scratch(0, static_cast<size_t>(N * V));
  detail::widen_rows<T>(f, V, static_cast<const uint16_t*>(logits), ld, N, V);
  crossentropy_forward(static_cast<float*>(losses), static_cast<float*>(lse), f, targets, N, V, V);
}

template <DType T>
void crossentropy_backward_half(void* dlogits, const void* dlosses, const void* logits, const void* lse,
                                const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  detail::check_row_stride(V, ld, "crossentropy_backward");
  float* f = detail::half_scratch(0, static_cast<size_t>(N * V));
  float* d = detail::half_scratch(1, static_cast<size_t>(N * V));
  detail::widen_rows<T>(f, V, static_cast<const uint16_t*>(logits), ld, N, V);
  crossentropy_backward(d, static_cast<const float*>(dlosses), f, static_cast<const float*>(lse), targets, N, V, V);
  detail::narrow_rows<T>(static_cast<uint16_t*>(dlogits), ld, d, V, N, V);
}

}  // namespace

void register_half_loss_kernels(Registry& r) {
  r.crossentropy_forward.set(Device::CPU, DType::BF16, crossentropy_forward_half<DType::BF16>);
  r.crossentropy_forward.set(Device::CPU, DType::F16, crossentropy_forward_half<DType::F16>);
  r.crossentropy_backward.set(Device::CPU, DType::BF16, crossentropy_backward_half<DType::BF16>);
  r.crossentropy_backward.set(Device::CPU, DType::F16, crossentropy_backward_half<DType::F16>);
}

}  // namespace paratrain::kernels::cpu
