// Test support: comparing model weights (in memory or in safetensors files) and writing the
// small structured token file the multi-rank tests train on.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "paratrain/checkpoint/safetensors.h"

namespace paratrain::test {

using Weights = std::map<std::string, std::vector<float>>;

inline Weights load_weights(const std::string& path) {
  Weights w;
  for (auto& [name, t] : checkpoint::load_safetensors(path)) w[name] = t.to_vector();
  return w;
}

// The largest per-tensor relative difference ||a - b|| / ||b|| (a must hold b's names).
inline double max_rel_diff(const Weights& a, const Weights& b, std::string* worst_name = nullptr) {
  double worst = 0;
  for (const auto& [name, vb] : b) {
    const auto& va = a.at(name);
    double d = 0, n = 0;
    for (size_t i = 0; i < vb.size(); ++i) {
      d += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
      n += double(vb[i]) * vb[i];
    }
    const double rel = std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
    if (rel > worst && worst_name) *worst_name = name;
    worst = std::max(worst, rel);
  }
  return worst;
}

// max_rel_diff of two safetensors files; a tensor count mismatch counts as infinitely far.
inline double max_rel_diff(const std::string& a_path, const std::string& b_path) {
  const Weights a = load_weights(a_path), b = load_weights(b_path);
  if (a.size() != b.size()) return INFINITY;
  return max_rel_diff(a, b);
}

inline bool bit_identical(const Weights& a, const Weights& b, std::string* first = nullptr) {
  for (const auto& [name, vb] : b) {
    const auto& va = a.at(name);
    if (va.size() != vb.size() || std::memcmp(va.data(), vb.data(), vb.size() * sizeof(float)) != 0) {
      if (first) *first = name;
      return false;
    }
  }
  return true;
}

// n tokens (40,000 by default) of vocabulary 256 with some structure (every 7th token
// follows a pattern), as an llm.c token file.
inline void write_structured_token_file(const std::string& path, int32_t n = 40000) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = n;
  std::mt19937 gen(7);
  std::vector<uint16_t> toks(n);
  for (int32_t i = 0; i < n; ++i) toks[i] = static_cast<uint16_t>(i % 7 ? gen() % 256 : (i / 7) % 256);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  f.write(reinterpret_cast<const char*>(toks.data()), n * 2);
}

}  // namespace paratrain::test
