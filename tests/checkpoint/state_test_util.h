// Shared by the training-state tests of tests/checkpoint: recognisable tensor contents, byte
// comparison of state maps, the message of an expected InputError, a JSON file's content.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/base/error.h"
#include "paratrain/tensor/tensor.h"
#include "support/error_of.h"

namespace paratrain::test {

// start, start + 1, ... scaled so that no value is an integer (a bit flip shows).
inline Tensor iota(const Shape& shape, float start) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), start);
  for (float& x : v) x = x * 0.37f - 1.5f;
  return Tensor::from_vector(v, shape);
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

inline void expect_same(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(same_bytes(got.at(name), t)) << name << ": " << shape_str(got.at(name).shape()) << " vs "
                                             << shape_str(t.shape());
  }
}

// The message of the InputError `fn` throws ("" and a test failure when it throws something
// else or nothing).
inline std::string error_of(const std::function<void()>& fn) { return testing::error_of<InputError>(fn); }

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace paratrain::test
