// Mixed precision for a training loop: the compute dtype of the forward (autocast), the
// parameters' half copies (f32 master weights stay the parameters and the optimizer's
// state), and the loss scaler.
//
//   amp::MixedPrecision mp(amp::parse_precision("bf16"), amp::default_loss_scale(DType::BF16));
//   { autograd::AutocastGuard g(mp.compute_dtype(), mp.half_copies()); loss = model.loss(x, y); }
//   backward(loss, seed * mp.scaler().scale());
//   if (mp.scaler().unscale_and_check(grads, group)) { clip; optimizer.step(); mp.parameters_changed(); }
//   mp.scaler().update();
//
// The half copies are made on the first forward after parameters_changed() and reused by
// every micro-batch of the step. Thread-safety: one thread. Lifetime: outlives the guards
// that use half_copies().
#pragma once

#include <string>

#include "paratrain/amp/loss_scaler.h"
#include "paratrain/autograd/autocast.h"

namespace paratrain::amp {

// "fp32" | "bf16" | "fp16" (also f32, f16, bfloat16, float16...) -> the compute dtype;
// InputError naming the value otherwise.
DType parse_precision(const std::string& s);
const char* precision_name(DType compute);  // "fp32", "bf16", "fp16"
// What --loss-scale defaults to: dynamic for fp16, none for bf16 and fp32.
LossScalerOptions default_loss_scale(DType compute);

class MixedPrecision {
 public:
  MixedPrecision(DType compute, const LossScalerOptions& scaler);

  DType compute_dtype() const { return compute_; }
  bool half() const { return compute_ != DType::F32; }
  // The cache an AutocastGuard of the forward uses (null in fp32).
  autograd::WeightCastCache* half_copies() { return half() ? &cache_ : nullptr; }
  // The parameters were updated: the half copies are refreshed on their next use.
  void parameters_changed() { cache_.invalidate(); }
  // Bytes of the half copies (0 in fp32).
  size_t half_copy_bytes() const { return cache_.bytes(); }
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }

 private:
  DType compute_;
  autograd::WeightCastCache cache_;
  LossScaler scaler_;
};

}  // namespace paratrain::amp
