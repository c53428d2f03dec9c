// Cross-entropy on bf16/f16 logits with f32 math, for (cpu, bf16) and (cpu, f16): the loss
// stays f32 (the mixed-precision policy) while the [tokens x vocab] logits saved for the
// backward stay in the half type, half the bytes of an f32 copy.
//
// forward:  losses, lse (N) f32; logits (N,V) in T; targets int32. The logits are widened to
//           f32 (exact) in reused scratch and the f32 kernel runs: the same numbers as casting
//           the logits to f32 and calling the f32 kernel.
// backward: dlogits (N,V) in T (OVERWRITTEN, as the f32 kernel) = round_T of the f32 result:
//           the same as the f32 kernel followed by a cast of its gradient back to T.
#include <vector>

#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cpu {
namespace {

// Grow-only per-thread f32 scratch (no allocation per call in steady state).
float* scratch(std::vector<float>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

template <DType T>
void widen(float* out, const void* in, int64_t n) {
  registry().cast_to_f32.at(Device::CPU, T)(out, in, n);
}

template <DType T>
void crossentropy_forward_half(void* losses, void* lse, const void* logits, const int32_t* targets, int64_t N,
                               int64_t V) {
  thread_local std::vector<float> buf;
  float* f = scratch(buf, N * V);
  widen<T>(f, logits, N * V);
  crossentropy_forward(static_cast<float*>(losses), static_cast<float*>(lse), f, targets, N, V);
}

template <DType T>
void crossentropy_backward_half(void* dlogits, const void* dlosses, const void* logits, const void* lse,
                                const int32_t* targets, int64_t N, int64_t V) {
  thread_local std::vector<float> in_buf, out_buf;
  float* f = scratch(in_buf, N * V);
  float* d = scratch(out_buf, N * V);
  widen<T>(f, logits, N * V);
  crossentropy_backward(d, static_cast<const float*>(dlosses), f, static_cast<const float*>(lse), targets, N, V);
  registry().cast_from_f32.at(Device::CPU, T)(dlogits, d, N * V);
}

}  // namespace

void register_half_loss_kernels(Registry& r) {
  r.crossentropy_forward.set(Device::CPU, DType::BF16, crossentropy_forward_half<DType::BF16>);
  r.crossentropy_forward.set(Device::CPU, DType::F16, crossentropy_forward_half<DType::F16>);
  r.crossentropy_backward.set(Device::CPU, DType::BF16, crossentropy_backward_half<DType::BF16>);
  r.crossentropy_backward.set(Device::CPU, DType::F16, crossentropy_backward_half<DType::F16>);
}

}  // namespace paratrain::kernels::cpu
