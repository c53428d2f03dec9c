// The reductions into a buffer (kernels/cpu/reduce_into.h): each equals its host-returning
// reduce.h / half.h counterpart bit for bit, and the cross-entropy mean and its gradient
// scale are the expressions cross_entropy used on the host.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::randn;

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = ::paratrain::f32_to_bf16(x[i]);
  return h;
}

TEST(ReduceInto, SumSquaresAndSumScaledAreTheHostKernelsValues) {
  for (int64_t n : {0, 1, 17, 16384, 16385, 100003}) {
    const auto x = randn(n, 7);
    double slot = -1.0;
    sum_squares_into(&slot, x.data(), n);
    EXPECT_TRUE(same_bits(slot, sum_squares(x.data(), n))) << n;
    for (double factor : {1.0, n ? 1.0 / static_cast<double>(n) : 0.0}) {
      float out = -1.0f;
      sum_scaled(&out, x.data(), factor, n);
      EXPECT_TRUE(same_bits(out, static_cast<float>(sum(x.data(), n) * factor))) << n;
    }
    const auto h = to_bf16(x);
    slot = -1.0;
    half::sum_squares_into<DType::BF16>(&slot, h.data(), n);
    EXPECT_TRUE(same_bits(slot, half::sum_squares<DType::BF16>(h.data(), n))) << n;
    float out = -1.0f;
    half::sum_scaled<DType::BF16>(&out, h.data(), 0.5, n);
    EXPECT_TRUE(same_bits(out, static_cast<float>(half::sum<DType::BF16>(h.data(), n) * 0.5))) << n;
  }
  double slot = 0.0;
  EXPECT_THROW(sum_squares_into(&slot, nullptr, -1), InputError);
}

TEST(ReduceInto, NonfiniteFlagCollectsManyTensorsAndIsNeverCleared) {
  auto x = randn(1000, 8);
  int32_t flag = 0;
  nonfinite_into(&flag, x.data(), 1000);
  EXPECT_EQ(flag, 0);
  x[517] = std::numeric_limits<float>::quiet_NaN();
  nonfinite_into(&flag, x.data(), 1000);
  EXPECT_EQ(flag, 1);
  x[517] = 0.0f;
  nonfinite_into(&flag, x.data(), 1000);  // a later clean tensor leaves the flag set
  EXPECT_EQ(flag, 1);
  flag = 0;
  auto h = to_bf16(x);
  half::nonfinite_into<DType::BF16>(&flag, h.data(), 1000);
  EXPECT_EQ(flag, 0);
  h[3] = ::paratrain::f32_to_bf16(INFINITY);
  half::nonfinite_into<DType::BF16>(&flag, h.data(), 1000);
  EXPECT_EQ(flag, 1);
  flag = 0;
  std::vector<uint16_t> f(10, ::paratrain::f32_to_f16(1.0f));
  f[9] = ::paratrain::f32_to_f16(-INFINITY);
  half::nonfinite_into<DType::F16>(&flag, f.data(), 10);
  EXPECT_EQ(flag, 1);
}

TEST(ReduceInto, FillScaledRoundsLikeTensorFill) {
  const float g = 0.1f;
  const double factor = 1.0 / 3.0;
  std::vector<float> out(37, -1.0f);
  fill_scaled(out.data(), &g, factor, 37);
  const float want = static_cast<float>(static_cast<double>(g) * factor);
  for (float v : out) EXPECT_TRUE(same_bits(v, want));
  std::vector<uint16_t> hb(37), hf(37);
  half::fill_scaled<DType::BF16>(hb.data(), &g, factor, 37);
  half::fill_scaled<DType::F16>(hf.data(), &g, factor, 37);
  for (uint16_t v : hb) EXPECT_EQ(v, ::paratrain::f32_to_bf16(want));
  for (uint16_t v : hf) EXPECT_EQ(v, ::paratrain::f32_to_f16(want));
}

TEST(ReduceInto, CrossEntropyMeanAndGradScale) {
  for (int64_t N : {0, 1, 7, 16385}) {
    const auto losses = randn(N, 9);
    std::vector<int32_t> targets(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = i % 3 == 1 ? kIgnoreIndex : static_cast<int32_t>(i % 5);
    int64_t want_count = 0;
    for (int32_t t : targets) want_count += t != kIgnoreIndex;
    float out = -1.0f;
    int64_t count = -1;
    crossentropy_mean(&out, &count, losses.data(), targets.data(), N);
    EXPECT_EQ(count, want_count) << N;
    const double total = sum(losses.data(), N);
    EXPECT_TRUE(same_bits(out, static_cast<float>(count ? total / static_cast<double>(count) : 0.0))) << N;

    const float g = 1.7f;
    std::vector<float> dl(N, -1.0f);
    crossentropy_grad_scale(dl.data(), &g, &count, N);
    const float scale = count ? static_cast<float>(static_cast<double>(g) / static_cast<double>(count)) : 0.0f;
    for (float v : dl) EXPECT_TRUE(same_bits(v, scale));
  }
  // every target ignored: mean 0, gradient 0
  const std::vector<float> losses{0.0f, 0.0f, 0.0f};
  const std::vector<int32_t> targets(3, kIgnoreIndex);
  float out = -1.0f;
  int64_t count = -1;
  crossentropy_mean(&out, &count, losses.data(), targets.data(), 3);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(out, 0.0f);
  const float g = 1.0f;
  std::vector<float> dl(3, -1.0f);
  crossentropy_grad_scale(dl.data(), &g, &count, 3);
  for (float v : dl) EXPECT_EQ(v, 0.0f);
}

TEST(ReduceInto, RegisteredForTheDtypesOfTheirInputs) {
  const Registry& r = registry();
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    EXPECT_TRUE(r.sum_squares_into.has(Device::CPU, t));
    EXPECT_TRUE(r.nonfinite_into.has(Device::CPU, t));
    EXPECT_TRUE(r.sum_scaled.has(Device::CPU, t));
    EXPECT_TRUE(r.fill_scaled.has(Device::CPU, t));
  }
  EXPECT_TRUE(r.crossentropy_mean.has(Device::CPU, DType::F32));
  EXPECT_TRUE(r.crossentropy_grad_scale.has(Device::CPU, DType::F32));
  EXPECT_FALSE(r.crossentropy_mean.has(Device::CPU, DType::BF16));
}

}  // namespace
}  // namespace paratrain::kernels::cpu
