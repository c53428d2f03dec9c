// Tensor cuts (checkpoint/tensor_cut.h): text form, cut/join round trips along dim 0 and 1,
// GPT-2's packed c_attn (blocks = 3: part i holds q, k and v of the same heads), vocabulary
// padding (zero rows, dropped again by join), bf16, and bad inputs named.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/checkpoint/tensor_cut.h"

using namespace paratrain;
using namespace paratrain::checkpoint;

namespace {

// A [shape] f32 tensor holding 0, 1, 2, ... in row-major order.
Tensor iota(const Shape& shape, float start = 0.0f) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), start);
  return Tensor::from_vector(v, shape);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

std::vector<Tensor> cut_all(const Tensor& whole, const TensorCut& c, int count) {
  std::vector<Tensor> parts;
  for (int i = 0; i < count; ++i) parts.push_back(cut_tensor(whole, c, i, count));
  return parts;
}

TEST(TensorCut, TextRoundTrips) {
  EXPECT_EQ(TensorCut{}.str(), "-");
  EXPECT_EQ((TensorCut{1}).str(), "1");
  EXPECT_EQ((TensorCut{1, 3}).str(), "1x3");
  EXPECT_EQ((TensorCut{0, 1, 50257}).str(), "0/50257");
  for (const TensorCut& c : {TensorCut{}, TensorCut{0}, TensorCut{1}, TensorCut{2, 3}, TensorCut{0, 1, 50257},
                             TensorCut{1, 2, 9}})
    EXPECT_EQ(TensorCut::parse(c.str()), c) << c.str();
  EXPECT_TRUE(TensorCut::parse("-").replicated());
  for (const char* bad : {"", "x", "-1", "1x", "1x0", "1/", "1/0", "a", "1 ", "1x3x3", "1/5x3", "0/-4"}) {
    const std::string msg = error_of([&] { TensorCut::parse(bad); });
    EXPECT_NE(msg.find("malformed tensor cut '" + std::string(bad) + "'"), std::string::npos) << msg;
  }
}

TEST(TensorCut, Dim0AndDim1RoundTrip) {
  const Tensor w = iota({4, 6});
  for (int dim : {0, 1})
    for (int count : {1, 2}) {
      const TensorCut c{dim};
      const auto parts = cut_all(w, c, count);
      for (const Tensor& p : parts) {
        EXPECT_EQ(p.size(dim), w.size(dim) / count);
        EXPECT_EQ(p.size(1 - dim), w.size(1 - dim));
      }
      EXPECT_TRUE(same_bytes(join_tensor(parts, c), w)) << dim << " " << count;
    }
  // The parts are exactly the narrowed views.
  EXPECT_TRUE(same_bytes(cut_tensor(w, {1}, 1, 3), w.narrow(1, 2, 2)));
  EXPECT_TRUE(same_bytes(cut_tensor(w, {0}, 1, 2), w.narrow(0, 2, 2)));
  // A 3-D tensor cut along its middle dimension; a non-contiguous input.
  const Tensor t = iota({2, 6, 3});
  const auto parts = cut_all(t, {1}, 3);
  EXPECT_TRUE(same_bytes(parts[2], t.narrow(1, 4, 2)));
  EXPECT_TRUE(same_bytes(join_tensor(parts, {1}), t));
  const Tensor wt = w.transpose(0, 1);  // [6, 4], not contiguous
  EXPECT_TRUE(same_bytes(join_tensor(cut_all(wt, {0}, 2), {0}), wt));
  // Replicated: every part is the whole tensor, a copy.
  const Tensor r = cut_tensor(w, {}, 1, 2);
  EXPECT_TRUE(same_bytes(r, w));
  EXPECT_FALSE(r.shares_storage(w));
  EXPECT_TRUE(same_bytes(join_tensor({w}, {}), w));
}

TEST(TensorCut, PackedQkvBlocksAreCutByHeads) {
  // GPT-2's c_attn weight [C, 3C] = q | k | v along dim 1; bias [3C].
  const int64_t C = 4;
  const Tensor w = iota({C, 3 * C});
  const TensorCut c{1, 3};
  const auto parts = cut_all(w, c, 2);
  ASSERT_EQ(parts[0].shape(), (Shape{C, 3 * C / 2}));
  // Part 0 = q[:, :C/2] | k[:, :C/2] | v[:, :C/2]; part 1 the other halves.
  for (int i = 0; i < 2; ++i)
    for (int b = 0; b < 3; ++b)
      EXPECT_TRUE(same_bytes(parts[i].narrow(1, b * C / 2, C / 2), w.narrow(1, b * C + i * C / 2, C / 2)))
          << "part " << i << " block " << b;
  EXPECT_TRUE(same_bytes(join_tensor(parts, c), w));
  const Tensor bias = iota({3 * C});
  const auto bparts = cut_all(bias, {0, 3}, 2);
  EXPECT_EQ(bparts[1].to_vector(), (std::vector<float>{2, 3, 6, 7, 10, 11}));
  EXPECT_TRUE(same_bytes(join_tensor(bparts, {0, 3}), bias));
  for (int count : {1, 4}) EXPECT_TRUE(same_bytes(join_tensor(cut_all(w, c, count), c), w)) << count;
}

TEST(TensorCut, PaddingAddsZeroRowsThatJoinDrops) {
  const Tensor wte = iota({7, 3}, 1.0f);  // vocabulary 7, no zero element
  for (int count : {2, 4}) {
    const TensorCut c{0, 1, 7};
    const auto parts = cut_all(wte, c, count);
    const int64_t rows = count == 2 ? 4 : 2;
    for (const Tensor& p : parts) ASSERT_EQ(p.shape(), (Shape{rows, 3})) << count;
    // Rows 0..6 of the whole are the parts' rows in order; the padded row is zero.
    const Tensor& last = parts.back();
    EXPECT_EQ(last.select(0, rows - 1).to_vector(), (std::vector<float>{0, 0, 0})) << count;
    EXPECT_TRUE(same_bytes(last.narrow(0, 0, rows - 1), wte.narrow(0, 7 - (rows - 1), rows - 1))) << count;
    const Tensor back = join_tensor(parts, c);
    EXPECT_EQ(back.shape(), (Shape{7, 3}));
    EXPECT_TRUE(same_bytes(back, wte)) << count;
  }
  // A column padding (dim 1) and a padding that leaves every row real (8 rows, 2 parts).
  const Tensor lm = iota({2, 5}, 1.0f);
  const auto parts = cut_all(lm, {1, 1, 5}, 2);
  EXPECT_EQ(parts[1].to_vector(), (std::vector<float>{4, 5, 0, 9, 10, 0}));
  EXPECT_TRUE(same_bytes(join_tensor(parts, {1, 1, 5}), lm));
  const Tensor even = iota({8, 2});
  EXPECT_TRUE(same_bytes(join_tensor(cut_all(even, {0, 1, 8}, 2), {0, 1, 8}), even));
}

TEST(TensorCut, Bf16AndF16AreCopiedBitForBit) {
  const Tensor w = iota({6, 4}).to(DType::BF16);
  for (const TensorCut& c : {TensorCut{0}, TensorCut{1}, TensorCut{0, 3}, TensorCut{1, 1, 4}}) {
    const auto parts = cut_all(w, c, 2);
    EXPECT_EQ(parts[0].dtype(), DType::BF16);
    EXPECT_TRUE(same_bytes(join_tensor(parts, c), w)) << c.str();
  }
  const Tensor h = iota({5, 2}).to(DType::F16);
  const auto parts = cut_all(h, {0, 1, 5}, 2);
  EXPECT_EQ(parts[1].dtype(), DType::F16);
  EXPECT_TRUE(same_bytes(parts[1].narrow(0, 0, 2), h.narrow(0, 3, 2)));
  EXPECT_TRUE(same_bytes(join_tensor(parts, {0, 1, 5}), h));
}

TEST(TensorCut, BadInputsAreNamed) {
  const Tensor w = iota({4, 6});
  std::string msg = error_of([&] { cut_tensor(w, {0}, 0, 3); });
  EXPECT_NE(msg.find("[4, 6]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not divisible by 3 parts"), std::string::npos) << msg;
  msg = error_of([&] { cut_tensor(w, {1, 3}, 0, 4); });  // 6 columns, 4 x 3 blocks
  EXPECT_NE(msg.find("not divisible by 4 parts x 3 blocks"), std::string::npos) << msg;
  msg = error_of([&] { cut_tensor(w, {2}, 0, 2); });
  EXPECT_NE(msg.find("no dimension 2"), std::string::npos) << msg;
  msg = error_of([&] { cut_tensor(w, {0, 3, 4}, 0, 2); });
  EXPECT_NE(msg.find("cannot be combined"), std::string::npos) << msg;
  msg = error_of([&] { cut_tensor(w, {0, 1, 5}, 0, 2); });
  EXPECT_NE(msg.find("the cut says 5"), std::string::npos) << msg;
  msg = error_of([&] { cut_tensor(w, {0}, 2, 2); });
  EXPECT_NE(msg.find("part 2 of 2 does not exist"), std::string::npos) << msg;
  msg = error_of([&] { cut_tensor(w, {0}, 0, 0); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  msg = error_of([&] { join_tensor({}, {0}); });
  EXPECT_NE(msg.find("no parts"), std::string::npos) << msg;
  msg = error_of([&] { join_tensor({iota({2, 6}), iota({3, 6})}, {0}); });
  EXPECT_NE(msg.find("part 1 is f32 [3, 6], part 0 f32 [2, 6]"), std::string::npos) << msg;
  msg = error_of([&] { join_tensor({iota({2, 6}), iota({2, 6}).to(DType::BF16)}, {0}); });
  EXPECT_NE(msg.find("part 1 is bf16 [2, 6]"), std::string::npos) << msg;
  msg = error_of([&] { join_tensor({iota({2, 4}), iota({2, 4})}, {1, 3}); });
  EXPECT_NE(msg.find("not divisible by 3 blocks"), std::string::npos) << msg;
  msg = error_of([&] { join_tensor({iota({2, 4}), iota({2, 4})}, {0, 1, 2}); });  // 4 rows cannot pad 2
  EXPECT_NE(msg.find("cannot hold a tensor of 2 rows"), std::string::npos) << msg;
  msg = error_of([&] { join_tensor({iota({2, 4}), Tensor()}, {0}); });
  EXPECT_NE(msg.find("part 1 is an undefined tensor"), std::string::npos) << msg;
}

}  // namespace
