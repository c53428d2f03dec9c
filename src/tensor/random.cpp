#include "paratrain/tensor/random.h"

#include <cmath>

namespace paratrain {

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void Generator::seed_with(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
}

uint64_t Generator::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Generator::below(uint64_t n) {
  PT_CHECK(n > 0, "Generator::below(0)");
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t r;
  do r = next_u64();
  while (r >= limit);
  return r % n;
}

double Generator::normal() {
  double u1 = uniform_f64(), u2 = uniform_f64();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void fill_normal(Tensor& t, Generator& g, float mean, float std) {
  PT_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "fill_normal needs a contiguous f32 tensor");
  float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = mean + std * static_cast<float>(g.normal());
}

void fill_uniform(Tensor& t, Generator& g, float lo, float hi) {
  PT_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "fill_uniform needs a contiguous f32 tensor");
  float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = lo + (hi - lo) * g.uniform_f32();
}

}  // namespace paratrain
