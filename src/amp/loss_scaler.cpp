#include "paratrain/amp/loss_scaler.h"

#include <cmath>

#include "paratrain/base/error.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/kernels/tensor_reduce.h"

namespace paratrain::amp {

LossScalerOptions LossScalerOptions::fixed(double scale) {
  if (!(scale > 0) || !std::isfinite(scale)) PT_THROW(InputError, "loss scale must be a positive number, got ", scale);
  LossScalerOptions o;
  o.enabled = true;
  o.dynamic = false;
  o.init_scale = scale;
  return o;
}

LossScalerOptions LossScalerOptions::parse(const std::string& s) {
  if (s == "none") return none();
  if (s == "dynamic") return dynamic_scaling();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !(v > 0) || !std::isfinite(v))
    PT_THROW(InputError, "unknown --loss-scale '", s, "' (expected none, dynamic or a positive number)");
  return fixed(v);
}

LossScaler::LossScaler(const LossScalerOptions& o) : o_(o), scale_(o.init_scale) {
  if (o_.enabled && (!(o_.init_scale > 0) || o_.growth_factor <= 1.0 || o_.backoff_factor <= 0 ||
                     o_.backoff_factor >= 1.0 || o_.growth_interval < 1))
    PT_THROW(InputError, "loss scaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                         "growth_interval >= 1 are required");
}

bool LossScaler::unscale_and_check(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  found_inf_ = false;
  if (!enabled()) return true;
  const float inv = static_cast<float>(1.0 / scale_);
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    PT_CHECK(g.is_contiguous(), "loss scaler: gradients must be contiguous");
    kernels::kernel(&kernels::Registry::scale, g)(g.data_ptr(), g.data_ptr(), inv, g.numel());
  }
  // one flag per device, read back once (not a sync per gradient)
  float bad = kernels::all_finite(grads) ? 0.0f : 1.0f;
  if (group && group->size() > 1) group->allreduce(&bad, 1, DType::F32, comm::ReduceOp::kMax)->wait();
  found_inf_ = bad != 0.0f;
  return !found_inf_;
}

void LossScaler::update() {
  if (!enabled() || !o_.dynamic) return;
  if (found_inf_) {
    scale_ *= o_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= o_.growth_interval) {
    scale_ *= o_.growth_factor;
    growth_tracker_ = 0;
  }
}

void LossScaler::load_state(double scale, int64_t growth_tracker) {
  if (!(scale > 0) || !std::isfinite(scale) || growth_tracker < 0)
    PT_THROW(InputError, "loss scaler state: scale ", scale, " and growth tracker ", growth_tracker, " are not valid");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace paratrain::amp
