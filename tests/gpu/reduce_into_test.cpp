// The CUDA reductions into device memory (src/kernels/cuda/reduce_into.h) through the dispatch
// tables against the CPU kernels of the same (table, dtype), and the ops and helpers built on
// them (sum/mean, cross_entropy, kernels::sum_of_squares / all_finite / values_of) on CUDA
// tensors against the same calls on CPU tensors, and how often those helpers wait for the GPU.
//
// Tolerances: the double sums (sum_squares_into, sum_scaled, crossentropy_mean) add in
// another order: rel 1e-12 on the double, and for the f32 results one f32 rounding of values
// that close (rel 2^-23, so 2e-7); counts, flags and the elementwise results (fill_scaled,
// crossentropy_grad_scale) are bit-exact. Odd sizes and all-ignored targets (count 0)
// included. Every test starts with PT_REQUIRE_GPU() and skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/kernels/tensor_reduce.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;
const Registry& R() { return registry(); }
const DeviceSpec kCuda0{Device::CUDA, 0};


using Bytes = std::vector<uint8_t>;
using test::DevBuf;
constexpr DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr int64_t kSizes[] = {0, 1, 7, 255, 257, 100003, 1 << 20};

// n values uniform in [-2, 2] as dtype t's bytes.
Bytes random_array(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Bytes b(static_cast<size_t>(n) * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) {
    const float v = u(rng);
    if (t == DType::F32) {
      std::memcpy(b.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

std::string tag(DType t, int64_t n) { return std::string(dtype_name(t)) + " n=" + std::to_string(n); }

TEST(CudaReduceInto, RegisteredWithTheCpuDtypes) {
  PT_REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    EXPECT_TRUE(R().sum_squares_into.has(kGpu, t));
    EXPECT_TRUE(R().nonfinite_into.has(kGpu, t));
    EXPECT_TRUE(R().sum_scaled.has(kGpu, t));
    EXPECT_TRUE(R().fill_scaled.has(kGpu, t));
  }
  EXPECT_TRUE(R().crossentropy_mean.has(kGpu, DType::F32));
  EXPECT_TRUE(R().crossentropy_grad_scale.has(kGpu, DType::F32));
}

TEST(CudaReduceInto, SumSquaresAndSumScaledMatchCpu) {
  PT_REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    for (int64_t n : kSizes) {
      const Bytes x = random_array(t, n, 21 + static_cast<uint32_t>(n));
      DevBuf dx(x);
      double want_sq = -1.0;
      R().sum_squares_into.at(kCpu, t)(&want_sq, x.data(), n);
      DevBuf dslot(sizeof(double));
      R().sum_squares_into.at(kGpu, t)(static_cast<double*>(dslot.p), dx.p, n);
      const double got_sq = dslot.get<double>()[0];
      EXPECT_NEAR(got_sq, want_sq, 1e-12 * want_sq) << "sum_squares_into " << tag(t, n);

      const double factor = n ? 1.0 / static_cast<double>(n) : 0.0;
      float want = -1.0f;
      R().sum_scaled.at(kCpu, t)(&want, x.data(), factor, n);
      DevBuf dout(sizeof(float));
      R().sum_scaled.at(kGpu, t)(dout.p, dx.p, factor, n);
      const float got = dout.get<float>()[0];
      EXPECT_NEAR(got, want, 2e-7 * std::fabs(want) + 1e-12) << "sum_scaled " << tag(t, n);
    }
  }
}

TEST(CudaReduceInto, NonfiniteFlagMatchesCpu) {
  PT_REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
      Bytes x = random_array(t, n, 31);
      DevBuf flag(std::vector<int32_t>{0});
      {
        DevBuf dx(x);
        R().nonfinite_into.at(kGpu, t)(static_cast<int32_t*>(flag.p), dx.p, n);
        EXPECT_EQ(flag.get<int32_t>()[0], 0) << tag(t, n);
      }
      // a NaN in the last element sets it; a later clean tensor leaves it set
      const size_t es = dtype_size(t);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      if (t == DType::F32) {
        std::memcpy(x.data() + (n - 1) * es, &nan, 4);
      } else {
        const uint16_t h = t == DType::BF16 ? f32_to_bf16(nan) : f32_to_f16(nan);
        std::memcpy(x.data() + (n - 1) * es, &h, 2);
      }
      int32_t want = 0;
      R().nonfinite_into.at(kCpu, t)(&want, x.data(), n);
      DevBuf dbad(x);
      R().nonfinite_into.at(kGpu, t)(static_cast<int32_t*>(flag.p), dbad.p, n);
      EXPECT_EQ(flag.get<int32_t>()[0], want) << tag(t, n);
      DevBuf dclean(random_array(t, n, 32));
      R().nonfinite_into.at(kGpu, t)(static_cast<int32_t*>(flag.p), dclean.p, n);
      EXPECT_EQ(flag.get<int32_t>()[0], 1) << tag(t, n);
    }
    // n == 0 leaves the flag alone
    DevBuf flag(std::vector<int32_t>{0});
    R().nonfinite_into.at(kGpu, t)(static_cast<int32_t*>(flag.p), nullptr, 0);
    EXPECT_EQ(flag.get<int32_t>()[0], 0);
  }
}

TEST(CudaReduceInto, FillScaledBitExact) {
  PT_REQUIRE_GPU();
  const float g = 0.37f;
  DevBuf dg(std::vector<float>{g});
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
      const double factor = n ? 1.0 / static_cast<double>(n) : 0.0;
      Bytes want(static_cast<size_t>(n) * dtype_size(t));
      R().fill_scaled.at(kCpu, t)(want.data(), &g, factor, n);
      DevBuf out(want.size());
      R().fill_scaled.at(kGpu, t)(out.p, dg.p, factor, n);
      EXPECT_EQ(out.get<uint8_t>(), want) << tag(t, n);
    }
  }
}

TEST(CudaReduceInto, CrossEntropyMeanAndGradScaleMatchCpu) {
  PT_REQUIRE_GPU();
  for (int64_t N : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{257}, int64_t{100003}}) {
    for (bool all_ignored : {false, true}) {
      std::mt19937 rng(41);
      std::uniform_real_distribution<float> u(0.0f, 10.0f);
      std::vector<float> losses(N);
      std::vector<int32_t> targets(N);
      for (int64_t i = 0; i < N; ++i) {
        targets[i] = all_ignored || i % 4 == 3 ? cpu::kIgnoreIndex : static_cast<int32_t>(i % 11);
        losses[i] = targets[i] == cpu::kIgnoreIndex ? 0.0f : u(rng);
      }
      const std::string what = "N=" + std::to_string(N) + (all_ignored ? " all ignored" : "");
      float want = -1.0f;
      int64_t want_count = -1;
      R().crossentropy_mean.at(kCpu, DType::F32)(&want, &want_count, losses.data(), targets.data(), N);
      DevBuf dl(losses), dt(targets), dout(sizeof(float)), dcount(sizeof(int64_t));
      R().crossentropy_mean.at(kGpu, DType::F32)(dout.p, static_cast<int64_t*>(dcount.p), dl.p,
                                                 static_cast<const int32_t*>(dt.p), N);
      const int64_t got_count = dcount.get<int64_t>()[0];
      EXPECT_EQ(got_count, want_count) << what;
      EXPECT_NEAR(dout.get<float>()[0], want, 2e-7 * std::fabs(want)) << what;
      if (want_count == 0) EXPECT_EQ(dout.get<float>()[0], 0.0f) << what;

      const float g = 1.3f;
      std::vector<float> want_dl(N, -1.0f);
      R().crossentropy_grad_scale.at(kCpu, DType::F32)(want_dl.data(), &g, &want_count, N);
      DevBuf dg(std::vector<float>{g}), ddl(N * sizeof(float));
      R().crossentropy_grad_scale.at(kGpu, DType::F32)(ddl.p, dg.p, static_cast<const int64_t*>(dcount.p), N);
      EXPECT_EQ(ddl.get<float>(), want_dl) << what;
    }
  }
}

// ---- the ops and helpers on CUDA tensors against the same calls on the CPU ----

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = d(rng);
  return Tensor::from_vector(v, shape);
}

TEST(CudaReduceInto, SumOfSquaresAndAllFiniteHelpersMatchCpu) {
  PT_REQUIRE_GPU();
  std::vector<Tensor> cpu, gpu;
  for (int64_t n : {int64_t{3}, int64_t{0}, int64_t{1000}, int64_t{257}, int64_t{65537}}) {
    cpu.push_back(random_tensor({n}, 50 + static_cast<uint32_t>(n)));
    gpu.push_back(cpu.back().to(kCuda0));
  }
  cpu.push_back(Tensor());
  gpu.push_back(Tensor());
  const double want = sum_of_squares(cpu), got = sum_of_squares(gpu);
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_TRUE(all_finite(gpu));
  Tensor bad = Tensor::from_vector({1.0f, INFINITY, 2.0f}, {3});
  gpu.push_back(bad.to(kCuda0));
  EXPECT_FALSE(all_finite(gpu));
}

// values_of: the items of scalars on the GPU (f32, bf16, f16) and on the host, with one wait
// for the GPU in all; the reductions wait once each, whatever the list's length.
TEST(CudaReduceInto, ValuesOfAndTheListReductionsWaitOnceForTheGpu) {
  PT_REQUIRE_GPU();
  std::vector<Tensor> cpu_scalars, scalars;
  for (int i = 0; i < 9; ++i) {
    const DType t = kFloatTypes[i % 3];
    cpu_scalars.push_back(Tensor::full({}, 0.1 * (i + 1), t));
    scalars.push_back(i == 4 ? cpu_scalars.back() : cpu_scalars.back().to(kCuda0));
  }
  const uint64_t before = ::paratrain::cuda::host_waits();
  const std::vector<double> got = values_of(scalars);
  EXPECT_EQ(::paratrain::cuda::host_waits() - before, 1u);
  ASSERT_EQ(got.size(), scalars.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], cpu_scalars[i].item()) << i;
  std::vector<Tensor> many;
  for (int i = 0; i < 40; ++i) many.push_back(random_tensor({257}, 70 + static_cast<uint32_t>(i)).to(kCuda0));
  const uint64_t before_reductions = ::paratrain::cuda::host_waits();
  (void)sum_of_squares(many);
  EXPECT_TRUE(all_finite(many));
  EXPECT_EQ(::paratrain::cuda::host_waits() - before_reductions, 2u);
}

TEST(CudaReduceInto, SumMeanAndCrossEntropyOpsStayOnTheGpu) {
  PT_REQUIRE_GPU();
  const Tensor x = random_tensor({37, 129}, 61);
  const Tensor xg = x.to(kCuda0);
  for (bool mean : {false, true}) {
    const Tensor want = mean ? ops::mean(x) : ops::sum(x);
    const Tensor got = mean ? ops::mean(xg) : ops::sum(xg);
    EXPECT_TRUE(got.is_cuda());
    EXPECT_NEAR(got.item(), want.item(), 2e-7 * std::fabs(want.item()));
  }
  for (bool all_ignored : {false, true}) {
    const int64_t N = 37, V = 129;
    std::vector<int32_t> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = all_ignored || i % 5 == 0 ? cpu::kIgnoreIndex : static_cast<int32_t>(i % V);
    const Tensor targets = Tensor::from_vector_i32(t, {N});
    Tensor logits = x.clone(), logits_g = x.to(kCuda0);
    logits.set_requires_grad(true);
    logits_g.set_requires_grad(true);
    const Tensor want = ops::cross_entropy(logits, targets);
    const Tensor got = ops::cross_entropy(logits_g, targets.to(kCuda0));
    ASSERT_TRUE(got.is_cuda());
    EXPECT_NEAR(got.item(), want.item(), 2e-6 * std::fabs(want.item()) + 1e-7);
    // the backward from a seed on the GPU: the gradient scale comes from the device count
    autograd::backward(want, Tensor::full({}, 2.0));
    autograd::backward(got, Tensor::full({}, 2.0).to(kCuda0));
    ASSERT_TRUE(logits_g.grad().defined());
    const std::vector<float> gw = logits.grad().to_vector(), gg = logits_g.grad().to_vector();
    ASSERT_EQ(gw.size(), gg.size());
    for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gg[i], gw[i], 1e-6 * std::fabs(gw[i]) + 1e-7) << i;
  }
}

}  // namespace
}  // namespace paratrain::kernels
