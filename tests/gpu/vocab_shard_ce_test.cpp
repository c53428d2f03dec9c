// Tensor parallelism's cross-entropy on CUDA: the vocabulary-shard kernels
// (src/kernels/cuda/vocab_shard_ce.cu) through the dispatch tables against the CPU kernels of
// the same dtype, for a middle shard (the target held by another rank, padding columns past
// vocab_size) and rows with ignored targets; and vocab_parallel_cross_entropy on a one-rank
// group with CUDA tensors against the same call on CPU tensors (loss on the device, gradient
// through the device-side scale), f32, bf16 and f16 logits.
//
// Tolerances: the row sums add in another order on the GPU (block tree vs the CPU's vectorised
// loop) and expf differs from the CPU's exp in the last bits: rel 1e-5 on sums, lse and
// losses, 1e-6 absolute on f32 gradients (values below 1), and one rounding step of the
// half type (2^-8 bf16, 2^-11 f16, relative to the row's largest gradient) on half gradients.
// The max and the target logit are exact. Every test starts with PT_REQUIRE_GPU().
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"

namespace paratrain {
namespace {

const DeviceSpec kCuda0{Device::CUDA, 0};
constexpr int32_t kIgnore = kernels::cpu::kIgnoreIndex;

// (N, Vl) logits uniform in [-4, 4] in dtype dt; targets over [0, vocab_size) with every
// fifth row ignored.
struct Shard {
  int64_t N, Vl;
  Tensor logits, targets;
};

Shard make_shard(DType dt, int64_t N, int64_t Vl, int64_t vocab_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> x(static_cast<size_t>(N * Vl));
  for (auto& v : x) v = u(rng);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) t[r] = r % 5 == 4 ? kIgnore : static_cast<int32_t>(rng() % vocab_size);
  return {N, Vl, Tensor::from_vector(x, {N, Vl}).to(dt), Tensor::from_vector_i32(t, {N})};
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel, double abs,
                  const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::isinf(cpu[i])) {
      EXPECT_EQ(gpu[i], cpu[i]) << what << " [" << i << "]";
      continue;
    }
    EXPECT_NEAR(gpu[i], cpu[i], abs + rel * std::fabs(cpu[i])) << what << " [" << i << "]";
  }
}

double half_step(DType dt) { return dt == DType::BF16 ? 0x1p-8 : dt == DType::F16 ? 0x1p-11 : 1e-6; }

TEST(CudaVocabShardCe, KernelsMatchTheCpuOnAMiddleShardWithPaddingAndIgnoredRows) {
  PT_REQUIRE_GPU();
  const auto& R = kernels::registry();
  // rank 1 of 3 with Vl = 1003: columns [1003, 2006), vocab_size 2500 -> all valid; rank 2
  // (vocab_start 2006) has 494 valid columns and 509 padding columns
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t vocab_start : {int64_t{1003}, int64_t{2006}}) {
      const int64_t N = 37, Vl = 1003, vocab_size = 2500;
      const int64_t valid = std::min<int64_t>(vocab_size - vocab_start, Vl);
      const Shard s = make_shard(dt, N, Vl, vocab_size, 7u + static_cast<uint32_t>(vocab_start));
      const std::string what = std::string(dtype_name(dt)) + " shard at " + std::to_string(vocab_start);
      struct Out {
        Tensor mx, sums, losses, scale, d;
      };
      auto run = [&](const DeviceSpec& dev) {
        const Tensor x = s.logits.to(dev), t = s.targets.to(dev);
        const int32_t* tp = t.data<int32_t>();
        Out o{x.new_empty({N}, DType::F32), x.new_empty({2 * N}, DType::F32), x.new_empty({N}, DType::F32),
              Tensor::full({1}, 0.01, DType::F32, dev), x.new_empty({N, Vl})};
        R.vocab_shard_row_max.at(dev.kind, dt)(o.mx.data_ptr(), x.data_ptr(), tp, N, Vl, valid);
        R.vocab_shard_exp_sums.at(dev.kind, dt)(o.sums.data_ptr(), x.data_ptr(), o.mx.data_ptr(), tp, N, Vl, valid,
                                                 vocab_start);
        const std::vector<float> mx = o.mx.to_vector();  // the max before losses turns it into lse
        R.vocab_shard_losses.at(dev.kind, DType::F32)(o.losses.data_ptr(), o.mx.data_ptr(), o.sums.data_ptr(), tp,
                                                      N, vocab_size);
        R.vocab_shard_ce_backward.at(dev.kind, dt)(o.d.data_ptr(), x.data_ptr(), o.mx.data_ptr(),
                                                   o.scale.data_ptr(), tp, N, Vl, valid, vocab_start);
        return std::make_pair(o, mx);
      };
      const auto [cpu, cpu_max] = run({Device::CPU, -1});
      const auto [gpu, gpu_max] = run(kCuda0);
      EXPECT_EQ(gpu_max, cpu_max) << what << ": the row max is exact";
      expect_close(gpu.sums.to_vector(), cpu.sums.to_vector(), 1e-5, 0.0, (what + ": sums").c_str());
      expect_close(gpu.mx.to_vector(), cpu.mx.to_vector(), 1e-5, 0.0, (what + ": lse").c_str());
      expect_close(gpu.losses.to_vector(), cpu.losses.to_vector(), 1e-5, 1e-6, (what + ": losses").c_str());
      const std::vector<float> gd = gpu.d.to(DType::F32).to_vector(), cd = cpu.d.to(DType::F32).to_vector();
      // f16 gradients this small are subnormal: one step of 2^-24 apart is one rounding.
      const double subnormal_step = dt == DType::F16 ? std::ldexp(1.0, -24) : 0.0;
      expect_close(gd, cd, half_step(dt), 1e-8 + subnormal_step, (what + ": dlogits").c_str());
      for (int64_t r = 4; r < N; r += 5)
        for (int64_t c = 0; c < Vl; ++c) ASSERT_EQ(gd[r * Vl + c], 0.0f) << what << ": ignored row " << r;
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = valid; c < Vl; ++c) ASSERT_EQ(gd[r * Vl + c], 0.0f) << what << ": padding of row " << r;
    }
  }
}

TEST(CudaVocabShardCe, ABadTargetMakesItsLossNanInsteadOfThrowing) {
  PT_REQUIRE_GPU();
  const Shard s = make_shard(DType::F32, 3, 16, 16, 3u);
  std::vector<int32_t> t = {2, 16, kIgnore};  // 16 is outside [0, 16)
  const Tensor x = s.logits.to(kCuda0), tg = Tensor::from_vector_i32(t, {3}).to(kCuda0);
  auto tp = std::make_shared<parallel::TpGroup>(nullptr);
  const Tensor loss = parallel::vocab_parallel_cross_entropy(x, tg, 0, 16, tp);
  EXPECT_TRUE(std::isnan(loss.item())) << "a target outside the vocabulary must show as a NaN loss";
}

TEST(CudaVocabShardCe, TheOpOnOneRankFollowsTheCpuInEveryDtype) {
  PT_REQUIRE_GPU();
  auto tp = std::make_shared<parallel::TpGroup>(nullptr);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    // vocab 997 padded to 1003 columns (a one-rank group holds the whole padded vocabulary)
    const Shard s = make_shard(dt, 45, 1003, 997, 11u);
    const std::string what = dtype_name(dt);
    auto run = [&](const DeviceSpec& dev) {
      Tensor x = s.logits.to(dev).detach();
      x.set_requires_grad(true);
      Tensor loss = parallel::vocab_parallel_cross_entropy(x, s.targets.to(dev), 0, 997, tp);
      EXPECT_EQ(loss.device_spec(), dev) << what << ": the loss stays on the logits' device";
      autograd::backward(loss);
      return std::make_pair(loss.item(), x.grad().to(DType::F32).to_vector());
    };
    const auto [cl, cg] = run({Device::CPU, -1});
    const auto [gl, gg] = run(kCuda0);
    EXPECT_NEAR(gl, cl, 1e-5 * std::fabs(cl)) << what << ": loss";
    expect_close(gg, cg, half_step(dt), 1e-7, (what + ": dlogits").c_str());
  }
}

}  // namespace
}  // namespace paratrain
