// Private building blocks of the half-type (bf16/f16) CPU kernels:
//  - the f32 <-> bf16/f16 conversions, vectorised (AVX2 / F16C) or scalar, the implementation
//    chosen once at run time from CPUID (half_convert.cpp), never from build flags;
//  - HalfT<T>: the conversions of one dtype (block-wise and per element);
//  - threaded conversions of flat arrays and of matrices with a row stride;
//  - half_scratch: thread-local grow-only f32 buffers of the half kernels (detail::scratch's
//    slots apart from those of the f32 kernels they call);
//  - half_blocks: "widen a block, run the f32 kernel, narrow it" loops over n elements with
//    stack blocks of kHalfBlock floats, threaded like the f32 elementwise kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu::detail {

using WidenFn = void (*)(float* out, const uint16_t* in, int64_t n);
using NarrowFn = void (*)(uint16_t* out, const float* in, int64_t n);

// One implementation of the four conversions: single-threaded, any n, any alignment,
// round to nearest even, NaN stays NaN, overflow to inf; bit-identical across
// implementations except for NaN payloads.
struct ConvertImpl {
  const char* name;  // "avx2-f16c", "scalar"
  WidenFn bf16_to_f32;
  NarrowFn f32_to_bf16;
  WidenFn f16_to_f32;
  NarrowFn f32_to_f16;
};
// The fastest implementation this CPU runs (chosen at first use, thread-safe).
const ConvertImpl& convert_impl();
// Every implementation this CPU can run, scalar last (the tests compare them); n returned.
int convert_impls(const ConvertImpl** out, int max);

// Portable scalar f16 conversions (no F16C), used by the scalar implementation.
inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    float m = static_cast<float>(mant) * 0x1p-24f;  // zero or subnormal: exact
    std::memcpy(&bits, &m, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);  // inf, quiet NaN
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Round to nearest even (the FP16 library's fp16_ieee_from_fp32_value: the f32 adder rounds).
inline uint16_t f32_to_f16_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, 4);
  const uint32_t shl1_w = w + w, sign = w & 0x80000000u;
  float base = (std::fabs(f) * 0x1p+112f) * 0x1p-110f;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  uint32_t bb = (bias >> 1) + 0x07800000u;
  float fb;
  std::memcpy(&fb, &bb, 4);
  base = fb + base;
  uint32_t bits;
  std::memcpy(&bits, &base, 4);
  const uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

template <DType T>
struct HalfT;
template <>
struct HalfT<DType::BF16> {
  static constexpr uint16_t kExpMask = 0x7f80;  // all ones: inf or NaN
  static void widen(float* o, const uint16_t* i, int64_t n) { convert_impl().bf16_to_f32(o, i, n); }
  static void narrow(uint16_t* o, const float* i, int64_t n) { convert_impl().f32_to_bf16(o, i, n); }
  static float to_f32(uint16_t h) { return paratrain::bf16_to_f32(h); }
  static uint16_t from_f32(float f) { return paratrain::f32_to_bf16(f); }
};
template <>
struct HalfT<DType::F16> {
  static constexpr uint16_t kExpMask = 0x7c00;
  static void widen(float* o, const uint16_t* i, int64_t n) { convert_impl().f16_to_f32(o, i, n); }
  static void narrow(uint16_t* o, const float* i, int64_t n) { convert_impl().f32_to_f16(o, i, n); }
  static float to_f32(uint16_t h) { return f16_bits_to_f32(h); }
  static uint16_t from_f32(float f) { return f32_to_f16_bits(f); }
};

constexpr int64_t kHalfGrain = 1 << 15;  // elements per thread below which threads do not pay
constexpr int64_t kHalfBlock = 1024;     // elements per stack block (4 KiB of f32 per operand)

// Threaded flat conversions (n elements).
template <DType T>
void widen_n(float* out, const uint16_t* in, int64_t n) {
  parallel_for(n, kHalfGrain, [&](int64_t b, int64_t e) { HalfT<T>::widen(out + b, in + b, e - b); });
}
template <DType T>
void narrow_n(uint16_t* out, const float* in, int64_t n) {
  parallel_for(n, kHalfGrain, [&](int64_t b, int64_t e) { HalfT<T>::narrow(out + b, in + b, e - b); });
}
// Threaded conversions of a (rows, cols) matrix with row strides ldo / ldi.
template <DType T>
void widen_rows(float* out, int64_t ldo, const uint16_t* in, int64_t ldi, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  if (ldo == cols && ldi == cols) return widen_n<T>(out, in, rows * cols);
  parallel_for(rows, std::max<int64_t>(1, kHalfGrain / cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) HalfT<T>::widen(out + r * ldo, in + r * ldi, cols);
  }, 1);
}
template <DType T>
void narrow_rows(uint16_t* out, int64_t ldo, const float* in, int64_t ldi, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  if (ldo == cols && ldi == cols) return narrow_n<T>(out, in, rows * cols);
  parallel_for(rows, std::max<int64_t>(1, kHalfGrain / cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) HalfT<T>::narrow(out + r * ldo, in + r * ldi, cols);
  }, 1);
}

// Thread-local grow-only f32 scratch of the half kernels, slot in [0, kHalfScratchSlots):
// detail::scratch's slots from kHalfScratchBase on, apart from those of the f32 kernels the
// half kernels call. Valid until the same thread asks the same slot for more. Half kernels
// do not nest, so a kernel may use any slot.
constexpr int kHalfScratchSlots = kScratchSlots - kHalfScratchBase;
inline float* half_scratch(int slot, size_t n) {
  PT_CHECK(slot >= 0 && slot < kHalfScratchSlots, "bad half scratch slot ", slot);
  return scratch(kHalfScratchBase + slot, n);
}

// Calls f(begin, len) over [0, n) in blocks of at most kHalfBlock elements, threaded for
// large n (chunks are whole blocks except the last). f must not throw.
template <typename F>
void half_blocks(int64_t n, const char* who, F&& f) {
  if (n < 0) PT_THROW(InputError, who, ": negative element count ", n);
  parallel_for(n, kHalfGrain, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; s += kHalfBlock) f(s, std::min(kHalfBlock, e - s));
  }, kHalfBlock);
}

// The native bf16 GEMM path's oneDNN matmul call (half_gemm.cpp) on f32 memory, which
// every CPU runs: the tests check its strides, transposes, alpha and beta with it.
// M, N, K >= 1.
void onednn_matmul_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                       float* C, int64_t ldc);

}  // namespace paratrain::kernels::cpu::detail
