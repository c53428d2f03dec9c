// Values for the tensor-parallel collectives' tests (tests/parallel/tp_comm_ops_test.cpp on
// the CPU, tests/gpu/tensor_parallel_gpu_test.cpp on GPUs): small integers per (rank, b, t, c),
// exact in f32 and bf16 and so is any sum of three, so the expected results are exact.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::testing::tp_values {

// A small integer for (rank, i, j, k): exact in bf16, and so is any sum of three of them.
inline float val(int r, int64_t i, int64_t j, int64_t k, int salt) {
  return static_cast<float>((r * 5 + i * 7 + j * 3 + k + salt) % 16 - 8);
}

// A tensor of `shape` (B, T, rest...) whose element [b, t, c] (c the flat index of the trailing
// dims) is f(b, t, c), in dtype dt.
inline Tensor make(const Shape& shape, DType dt, const std::function<float(int64_t, int64_t, int64_t)>& f) {
  const int64_t B = shape[0], T = shape[1];
  int64_t row = 1;
  for (size_t i = 2; i < shape.size(); ++i) row *= shape[i];
  std::vector<float> v(static_cast<size_t>(B * T * row));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < row; ++c) v[(b * T + t) * row + c] = f(b, t, c);
  Tensor x = Tensor::from_vector(v, shape);
  return dt == DType::F32 ? x : x.to(dt);
}

// Every element of `got` (shape as make's) against f, with the first mismatch in the message.
inline void expect_values(const Tensor& got, DType dt, const std::function<float(int64_t, int64_t, int64_t)>& f,
                          const std::string& what) {
  EXPECT_EQ(got.dtype(), dt) << what;
  const Tensor want = make(got.shape(), DType::F32, f);
  const std::vector<float> g = got.to_vector(), w = want.to_vector();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != w[i]) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", expected " << w[i];
      return;
    }
}

}  // namespace paratrain::testing::tp_values
