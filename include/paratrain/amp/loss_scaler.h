// Loss scaling for half-precision training, with torch.cuda.amp.GradScaler's semantics
// (../shared/REFERENCE.md): the loss (in practice the backward seed) is multiplied by the
// scale so that small f16 gradients do not flush to zero; before clipping and the optimizer
// step the gradients are multiplied by 1/scale and checked. A step whose gradients hold an
// inf or NaN on any rank is skipped by every rank, and the scale backs off; after
// growth_interval clean steps in a row it grows.
//
//   LossScaler s(LossScalerOptions::dynamic());
//   backward(loss, seed * s.scale());
//   if (s.unscale_and_check(grads, group)) { clip; step; }   // false: skip this step
//   s.update();
//
// Thread-safety: one thread. unscale_and_check is collective over `group` when one is given
// (every rank of it must call it for the same step).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::amp {

struct LossScalerOptions {
  bool enabled = false;           // false: scale 1, never skips (no check is made)
  bool dynamic = true;            // false: the scale stays init_scale (a static scale)
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;

  static LossScalerOptions none() { return {}; }
  static LossScalerOptions dynamic_scaling() {
    LossScalerOptions o;
    o.enabled = true;
    return o;
  }
  static LossScalerOptions fixed(double scale);
  // "none", "dynamic" or a positive number (a static scale); InputError otherwise.
  static LossScalerOptions parse(const std::string& s);
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& o = {});

  bool enabled() const { return o_.enabled; }
  double scale() const { return enabled() ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // The last unscale_and_check found an inf/NaN (the step must be skipped).
  bool found_inf() const { return found_inf_; }

  // Multiplies every defined gradient by 1/scale and reports whether all are finite on every
  // rank of `group` (MAX over the group of a local flag; null: this rank only). Returns true
  // when the optimizer may step. Disabled: true, the gradients untouched. The local check
  // collects every gradient into one flag per device and reads it back once (no sync per
  // gradient on a GPU).
  bool unscale_and_check(const std::vector<Tensor>& grads, comm::ProcessGroup* group);
  // After the step (taken or skipped): backoff on inf/NaN, growth after growth_interval clean
  // steps (dynamic only).
  void update();

  // For checkpoints: the scale and the clean steps counted towards the next growth.
  void load_state(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions o_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool found_inf_ = false;
};

}  // namespace paratrain::amp
