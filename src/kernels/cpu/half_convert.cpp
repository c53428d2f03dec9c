// The f32 <-> bf16/f16 conversions of every half kernel and of cast_from_f32/cast_to_f32,
// and the half kernels' scratch.
//
// Promise: round to nearest even, NaN stays NaN (quiet), overflow rounds to inf, subnormals
// kept (no flush to zero); the vector and scalar implementations give the same bits except
// for NaN payloads. The implementation is chosen once at run time from CPUID
// (__builtin_cpu_supports), so a build without -march=native still converts with AVX2 and
// F16C where the CPU has them; the AVX2 functions are compiled with target attributes.
#include <immintrin.h>

#include <vector>

#include "kernels/cpu/half_util.h"
#include "paratrain/kernels/cpu/half.h"

namespace paratrain::kernels::cpu {
namespace detail {
namespace {

// ---- scalar ----
void bf16_to_f32_scalar(float* out, const uint16_t* in, int64_t n) {
  auto* bits = reinterpret_cast<uint32_t*>(out);  // bf16 is the top half of an f32
  for (int64_t i = 0; i < n; ++i) bits[i] = static_cast<uint32_t>(in[i]) << 16;
}
void f32_to_bf16_scalar(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = paratrain::f32_to_bf16(in[i]);
}
void f16_to_f32_scalar(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(in[i]);
}
void f32_to_f16_scalar(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16_bits(in[i]);
}

// ---- AVX2 + F16C, 8 lanes (memory-bound: 8 at a time saturates the loads) ----
#define PT_AVX2_F16C __attribute__((target("avx2,f16c")))

PT_AVX2_F16C void bf16_to_f32_avx2(float* out, const uint16_t* in, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(a, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 8), _mm256_slli_epi32(b, 16));
  }
  for (; i + 8 <= n; i += 8) {
    __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(a, 16));
  }
  bf16_to_f32_scalar(out + i, in + i, n - i);
}

// u + 0x7fff + ((u >> 16) & 1), top half; NaN: (u >> 16) | 0x40 as the scalar rule.
PT_AVX2_F16C inline __m128i bf16_round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
  __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, qnan, nan);
  // 32 -> 16 bits (values <= 0xffff, so unsigned saturation is exact), lanes back in order
  __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
  return _mm256_castsi256_si128(p);
}
PT_AVX2_F16C void f32_to_bf16_avx2(uint16_t* out, const float* in, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bf16_round8(_mm256_loadu_ps(in + i)));
  f32_to_bf16_scalar(out + i, in + i, n - i);
}
PT_AVX2_F16C void f16_to_f32_avx2(float* out, const uint16_t* in, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  f16_to_f32_scalar(out + i, in + i, n - i);
}
PT_AVX2_F16C void f32_to_f16_avx2(uint16_t* out, const float* in, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  f32_to_f16_scalar(out + i, in + i, n - i);
}
#undef PT_AVX2_F16C

const ConvertImpl kScalar{"scalar", bf16_to_f32_scalar, f32_to_bf16_scalar, f16_to_f32_scalar,
                          f32_to_f16_scalar};
const ConvertImpl kAvx2{"avx2-f16c", bf16_to_f32_avx2, f32_to_bf16_avx2, f16_to_f32_avx2,
                        f32_to_f16_avx2};

bool cpu_has_avx2_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

}  // namespace

const ConvertImpl& convert_impl() {
  static const ConvertImpl& impl = cpu_has_avx2_f16c() ? kAvx2 : kScalar;
  return impl;
}

int convert_impls(const ConvertImpl** out, int max) {
  int n = 0;
  if (cpu_has_avx2_f16c() && n < max) out[n++] = &kAvx2;
  if (n < max) out[n++] = &kScalar;
  return n;
}

}  // namespace detail

const char* half_convert_path() { return detail::convert_impl().name; }

}  // namespace paratrain::kernels::cpu
