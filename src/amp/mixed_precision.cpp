#include "paratrain/amp/mixed_precision.h"

#include "paratrain/base/error.h"

namespace paratrain::amp {

DType parse_precision(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp16" || s == "f16" || s == "float16") return DType::F16;
  PT_THROW(InputError, "unknown --precision '", s, "' (expected fp32, bf16 or fp16)");
}

const char* precision_name(DType compute) {
  switch (compute) {
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    default: return "fp32";
  }
}

LossScalerOptions default_loss_scale(DType compute) {
  return compute == DType::F16 ? LossScalerOptions::dynamic_scaling() : LossScalerOptions::none();
}

MixedPrecision::MixedPrecision(DType compute, const LossScalerOptions& scaler) : compute_(compute), scaler_(scaler) {
  if (compute != DType::F32 && compute != DType::BF16 && compute != DType::F16)
    PT_THROW(InputError, "mixed precision: compute dtype must be f32, bf16 or f16, got ", dtype_name(compute));
}

}  // namespace paratrain::amp
