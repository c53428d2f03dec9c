// kernels::sum_of_squares / all_finite / values_of over tensor lists (kernels/tensor_reduce.h):
// on the CPU the value is the host-returning sum_squares of each tensor added in list order, bit
// for bit, and values_of gives each tensor's item().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/tensor_reduce.h"

namespace paratrain::kernels {
namespace {

Tensor tensor_of(int64_t n, uint32_t seed) { return Tensor::from_vector(cpu::testing::randn(n, seed), {n}); }

TEST(TensorReduce, SumOfSquaresIsTheListOrderSumOfThePerTensorKernel) {
  std::vector<Tensor> ts{tensor_of(17, 1), Tensor(), tensor_of(0, 2), tensor_of(100003, 3), tensor_of(5, 4)};
  double want = 0.0;
  for (const Tensor& t : ts)
    if (t.defined()) want += cpu::sum_squares(t.data<float>(), t.numel());
  const double got = sum_of_squares(ts);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << got << " vs " << want;
  EXPECT_EQ(sum_of_squares({}), 0.0);
  // bf16 tensors through their own kernel
  const Tensor h = tensor_of(33, 5).to(DType::BF16);
  EXPECT_EQ(sum_of_squares({h}), cpu::half::sum_squares<DType::BF16>(h.data<uint16_t>(), 33));
}

TEST(TensorReduce, AllFinite) {
  std::vector<Tensor> ts{tensor_of(17, 1), Tensor(), tensor_of(1000, 3)};
  EXPECT_TRUE(all_finite(ts));
  EXPECT_TRUE(all_finite({}));
  ts[2].data<float>()[999] = INFINITY;
  EXPECT_FALSE(all_finite(ts));
  ts[2].data<float>()[999] = 0.0f;
  ts[0].data<float>()[0] = NAN;
  EXPECT_FALSE(all_finite(ts));
}

TEST(TensorReduce, NonContiguousTensorsAreRejected) {
  Tensor m = Tensor::from_vector(cpu::testing::randn(6, 7), {2, 3});
  EXPECT_THROW(sum_of_squares({m.transpose(0, 1)}), InputError);
  EXPECT_THROW(all_finite({m.transpose(0, 1)}), InputError);
}

TEST(TensorReduce, ValuesOfAreTheItemsInListOrder) {
  const Tensor a = Tensor::full({}, 2.5f), b = Tensor::full({1}, -0.1f), c = Tensor::full({1, 1}, 3.0f);
  const Tensor h = Tensor::full({}, 1.0f / 3.0f).to(DType::BF16);
  const std::vector<double> got = values_of({a, b, h, c});
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], 2.5);
  EXPECT_EQ(got[1], b.item());  // the f32 value, not -0.1 the double
  EXPECT_EQ(got[2], h.item());  // bf16's value, exactly
  EXPECT_NE(got[2], static_cast<double>(1.0f / 3.0f));
  EXPECT_EQ(got[3], 3.0);
  EXPECT_TRUE(values_of({}).empty());
}

TEST(TensorReduce, ValuesOfRefusesWhatIsNotAFloatScalar) {
  auto error_of = [](const std::vector<Tensor>& ts) {
    try {
      values_of(ts);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  const Tensor one = Tensor::full({}, 1.0f);
  EXPECT_EQ(error_of({one, Tensor()}), "values_of: tensor 1 is undefined");
  EXPECT_EQ(error_of({tensor_of(2, 9)}), "values_of: tensor 0 is not a one-element tensor");
  EXPECT_EQ(error_of({one, Tensor::full({}, 7.0, DType::I64)}), "values_of: tensor 1 is i64 (values_of takes f32, bf16, f16)");
}

}  // namespace
}  // namespace paratrain::kernels
