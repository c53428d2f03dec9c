// Reproducible random numbers: every random choice in paratrain comes from a Generator
// seeded from --seed. The generator is xoshiro256** seeded through splitmix64; its state is
// four 64-bit words, saved in checkpoints so a resumed run draws the same numbers.
//
// Thread-safety: a Generator is not thread-safe (each draw advances its state); give each
// thread its own, seeded distinctly. fill_normal/fill_uniform write the whole tensor, which
// no other thread may use meanwhile. A Generator is a small value: copying it copies its
// state (the copy then draws the same numbers).
#pragma once

#include <array>
#include <cstdint>

#include "paratrain/tensor/tensor.h"

namespace paratrain {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { seed_with(seed); }
  void seed_with(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits (float) or 53 (double).
  float uniform_f32() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  double uniform_f64() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n), unbiased.
  uint64_t below(uint64_t n);
  // Standard normal (Box-Muller).
  double normal();

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

// Fills an f32 tensor with N(mean, std^2) / U[lo, hi) samples.
void fill_normal(Tensor& t, Generator& g, float mean, float std);
void fill_uniform(Tensor& t, Generator& g, float lo, float hi);

}  // namespace paratrain
