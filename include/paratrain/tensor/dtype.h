// Element types of tensors and communication buffers, with bf16/f16 conversion.
//
// bf16 and f16 are stored as uint16_t bit patterns (BF16 / Half below). Conversion from f32
// rounds to nearest even, as PyTorch does; NaN stays NaN.
//
// Thread-safety: everything here is a pure function or constant; safe from any thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace paratrain {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, U16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::U16: return 2;
  }
  return 0;
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// Lower-case name: "f32", "bf16", "f16", "i32", "i64", "u8", "u16".
const char* dtype_name(DType t);
// Parses the lower-case name (also "float32", "bfloat16", "float16", "fp32", "fp16"); InputError otherwise.
DType parse_dtype(const std::string& s);
// safetensors dtype string: "F32", "BF16", "F16", "I32", "I64", "U8", "U16".
const char* dtype_safetensors_name(DType t);
// Inverse of dtype_safetensors_name; InputError for unsupported types.
DType parse_safetensors_dtype(const std::string& s);

// ---- 16-bit floating point conversions ----
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
#endif
}

inline uint16_t f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);  // round to nearest even
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

}  // namespace paratrain
