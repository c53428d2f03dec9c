// The loss scaler against torch's GradScaler semantics (../shared/REFERENCE.md): unscale by
// 1/scale, skip on inf/NaN anywhere in the group, backoff 0.5, growth 2x after
// growth_interval clean steps; and MixedPrecision's defaults.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "comm/comm_check.h"
#include "paratrain/amp/mixed_precision.h"

using namespace paratrain;
using amp::LossScaler;
using amp::LossScalerOptions;

namespace {
Tensor grad_of(std::vector<float> v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }
}  // namespace

TEST(LossScaler, DynamicUnscalesBacksOffAndGrows) {
  LossScalerOptions o = LossScalerOptions::dynamic_scaling();
  o.growth_interval = 3;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 65536.0);
  Tensor g = grad_of({65536.0f, -131072.0f, 0.5f});
  ASSERT_TRUE(s.unscale_and_check({g}, nullptr));
  EXPECT_EQ(g.to_vector(), (std::vector<float>{1.0f, -2.0f, 0.5f / 65536.0f}));  // exact: powers of two
  s.update();
  EXPECT_EQ(s.growth_tracker(), 1);
  // inf, then NaN: skipped, backoff 0.5 each time, tracker reset
  Tensor bad = grad_of({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(s.unscale_and_check({g, bad}, nullptr));
  EXPECT_TRUE(s.found_inf());
  s.update();
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  Tensor nan = grad_of({std::nanf("")});
  EXPECT_FALSE(s.unscale_and_check({nan}, nullptr));
  s.update();
  EXPECT_EQ(s.scale(), 16384.0);
  // growth_interval (3) clean steps in a row double it, and the count starts again
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.scale(), 16384.0) << i;
    Tensor ok = grad_of({1.0f});
    ASSERT_TRUE(s.unscale_and_check({ok}, nullptr));
    s.update();
  }
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, StaticAndNone) {
  LossScaler fixed(LossScalerOptions::fixed(128.0));
  Tensor bad = grad_of({std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(fixed.unscale_and_check({bad}, nullptr));  // a static scale still skips the step
  fixed.update();
  EXPECT_EQ(fixed.scale(), 128.0);  // ... but never changes
  LossScaler none;
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.scale(), 1.0);
  Tensor g = grad_of({3.0f, std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(none.unscale_and_check({g}, nullptr));  // no scaler: no check, no change
  EXPECT_EQ(g.to_vector()[0], 3.0f);
}

TEST(LossScaler, ParsesTheFlagAndRejectsTheRest) {
  EXPECT_FALSE(LossScalerOptions::parse("none").enabled);
  EXPECT_TRUE(LossScalerOptions::parse("dynamic").dynamic);
  LossScalerOptions f = LossScalerOptions::parse("1024");
  EXPECT_TRUE(f.enabled);
  EXPECT_FALSE(f.dynamic);
  EXPECT_EQ(f.init_scale, 1024.0);
  for (const char* bad : {"", "x", "0", "-1", "inf", "nan", "12abc"}) EXPECT_THROW(LossScalerOptions::parse(bad), InputError) << bad;
  LossScaler s(LossScalerOptions::dynamic_scaling());
  EXPECT_THROW(s.load_state(-1.0, 0), InputError);
  s.load_state(256.0, 7);
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.growth_tracker(), 7);
}

TEST(LossScaler, OneRanksInfSkipsTheStepOnEveryRank) {
  comm::ProcessGroupOptions po;
  po.backend = "shm";
  std::vector<int> skipped(3, -1);
  auto errors = comm::testing::run_thread_ranks(3, po, [&](int rank, std::shared_ptr<comm::ProcessGroup>& pg) {
    LossScaler s(LossScalerOptions::dynamic_scaling());
    Tensor g = grad_of({1.0f, rank == 1 ? std::numeric_limits<float>::infinity() : 2.0f});
    skipped[rank] = s.unscale_and_check({g}, pg.get()) ? 0 : 1;
    s.update();
    EXPECT_EQ(s.scale(), 32768.0) << "rank " << rank;
    pg->barrier()->wait();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(skipped[r], 1) << "rank " << r << " must skip the step rank 1 found an inf in";
  }
}

TEST(MixedPrecision, PrecisionsAndTheirDefaultScaling) {
  EXPECT_EQ(amp::parse_precision("fp32"), DType::F32);
  EXPECT_EQ(amp::parse_precision("bf16"), DType::BF16);
  EXPECT_EQ(amp::parse_precision("fp16"), DType::F16);
  EXPECT_THROW(amp::parse_precision("fp8"), InputError);
  EXPECT_TRUE(amp::default_loss_scale(DType::F16).enabled);
  EXPECT_FALSE(amp::default_loss_scale(DType::BF16).enabled);
  EXPECT_FALSE(amp::default_loss_scale(DType::F32).enabled);
  amp::MixedPrecision fp32(DType::F32, {});
  EXPECT_EQ(fp32.half_copies(), nullptr);
  amp::MixedPrecision bf16(DType::BF16, {});
  ASSERT_NE(bf16.half_copies(), nullptr);
  EXPECT_EQ(bf16.half_copy_bytes(), 0u);
}
