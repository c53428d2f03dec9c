#include "paratrain/tensor/dtype.h"

#include "paratrain/base/error.h"

namespace paratrain {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::U16: return "u16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32" || s == "fp32" || s == "float") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "float16" || s == "fp16" || s == "half") return DType::F16;
  if (s == "i32" || s == "int32") return DType::I32;
  if (s == "i64" || s == "int64") return DType::I64;
  if (s == "u8" || s == "uint8") return DType::U8;
  if (s == "u16" || s == "uint16") return DType::U16;
  PT_THROW(InputError, "unknown dtype '", s, "' (expected f32, bf16, f16, i32, i64, u8 or u16)");
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::U16: return "U16";
  }
  return "?";
}

DType parse_safetensors_dtype(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  if (s == "U16") return DType::U16;
  PT_THROW(InputError, "unsupported safetensors dtype '", s, "'");
}

}  // namespace paratrain
