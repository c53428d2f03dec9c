// DistributedDataParallel with one thread per rank in this process (shm groups over a
// HashStore): equivalence with one process (DP = 2, 3, 4; 1e-6 relative, and bit-identical
// in deterministic mode), accumulation against one big batch, buckets and their rebuild,
// parameter mismatch and unused-parameter errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/store.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"
#include "parallel/ddp_test_util.h"
#include "support/weights_compare.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;
using namespace paratrain::parallel;

namespace {

using paratrain::testing::make_rows;
using paratrain::testing::run_ranks;
using paratrain::testing::tiny_gpt;

using paratrain::test::bit_identical;
using paratrain::test::max_rel_diff;
using paratrain::test::Weights;




struct Spec {
  int64_t micro = 2;   // rows per micro-batch
  int64_t accum = 1;   // micro-steps per optimizer step (per rank)
  int steps = 10;
  bool deterministic = false;
  size_t bucket_bytes = size_t(25) << 20;
  size_t first_bucket_bytes = size_t(1) << 20;
  // AdamW turns rounding noise into full-size updates where the true gradient is zero (the
  // key part of c_attn.bias: softmax ignores it), so the 1e-6 comparisons of runs that
  // round differently use SGD with momentum; bit-identical runs use AdamW.
  bool adamw = false;
};

// Trains the tiny GPT for spec.steps steps; rank r of `pg` (null = one process) takes slice
// j = k*world + r at micro-step k (DESIGN.md data order). Rank r starts from seed 100 + r, so
// only the broadcast from rank 0 makes the ranks agree.
Weights train_tiny(const std::shared_ptr<comm::ProcessGroup>& pg, const Spec& s,
                   std::vector<std::vector<std::string>>* buckets_after = nullptr) {
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
  auto cfg = tiny_gpt();
  nn::GPT model(cfg, 100 + static_cast<uint64_t>(rank));
  DdpOptions o;
  o.deterministic = s.deterministic;
  o.bucket_bytes = s.bucket_bytes;
  o.first_bucket_bytes = s.first_bucket_bytes;
  DistributedDataParallel ddp(model, pg, o);
  auto params = model.named_parameters();
  std::unique_ptr<optim::Optimizer> opt;
  if (s.adamw) {
    optim::AdamWOptions ao;
    ao.lr = 3e-3, ao.beta2 = 0.95, ao.weight_decay = 0.1;
    opt = std::make_unique<optim::AdamW>(params, ao);
  } else {
    optim::SGDOptions so;
    so.lr = 0.1, so.momentum = 0.9, so.weight_decay = 0.01;
    opt = std::make_unique<optim::SGD>(params, so);
  }
  Tensor seed = Tensor::full({}, ddp.backward_seed(s.accum));
  for (int step = 0; step < s.steps; ++step) {
    ddp.zero_grad();
    for (int64_t k = 0; k < s.accum; ++k) {
      std::optional<NoSync> ns;
      if (k + 1 < s.accum) ns.emplace(ddp.no_sync());
      Tensor x, y;
      make_rows(step, (k * world + rank) * s.micro, s.micro, cfg.block_size, cfg.vocab_size, x, y);
      autograd::backward(model.loss(x, y), seed);
    }
    ddp.finish();
    optim::clip_grad_norm(params, 1.0, optim::grad_norm(params));
    opt->step();
  }
  if (buckets_after) *buckets_after = ddp.bucket_names();
  Weights w;
  for (auto& [name, t] : params) w[name] = t.to_vector();
  return w;
}



class DdpEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(DdpEquivalence, MatchesOneProcessAndIsBitIdenticalWhenDeterministic) {
  const int n = GetParam();
  Spec one;
  one.accum = n;  // one process accumulates the n micro-batches
  Spec dp;        // n ranks, one micro-batch each
  dp.bucket_bytes = 16 << 10;  // several buckets
  dp.first_bucket_bytes = 4 << 10;
  const Weights ref = train_tiny(nullptr, one);
  std::vector<Weights> got(n);
  auto errs = run_ranks(n, false, [&](auto pg) { got[pg->rank()] = train_tiny(pg, dp); });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errs[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) {
    std::string worst;
    const double rel = max_rel_diff(got[r], ref, &worst);
    EXPECT_LT(rel, 1e-6) << "rank " << r << " vs one process, DP=" << n << ", worst tensor " << worst;
    std::string first;
    EXPECT_TRUE(bit_identical(got[r], got[0], &first)) << "rank " << r << " differs from rank 0 at " << first;
  }

  one.deterministic = dp.deterministic = true;
  one.adamw = dp.adamw = true;
  const Weights ref_det = train_tiny(nullptr, one);
  errs = run_ranks(n, true, [&](auto pg) { got[pg->rank()] = train_tiny(pg, dp); });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errs[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) {
    std::string first;
    EXPECT_TRUE(bit_identical(got[r], ref_det, &first))
        << "deterministic DP=" << n << " rank " << r << " differs from one process at " << first
        << " (max rel " << max_rel_diff(got[r], ref_det) << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(World, DdpEquivalence, ::testing::Values(2, 3, 4));

TEST(Ddp, AccumulationMatchesOneBigBatch) {
  Spec big;
  big.micro = 8;
  Spec acc;
  acc.micro = 2;
  acc.accum = 4;
  const Weights ref = train_tiny(nullptr, big);
  EXPECT_LT(max_rel_diff(train_tiny(nullptr, acc), ref), 1e-6) << "one process, K=4 x 2 vs 1 x 8";
  // Two ranks, K = 2 each, no_sync on the first micro-step: the same global batch of 8.
  Spec dp;
  dp.micro = 2;
  dp.accum = 2;
  std::vector<Weights> got(2);
  auto errs = run_ranks(2, false, [&](auto pg) { got[pg->rank()] = train_tiny(pg, dp); });
  ASSERT_EQ(errs[0], "");
  ASSERT_EQ(errs[1], "");
  EXPECT_LT(max_rel_diff(got[0], ref), 1e-6) << "2 ranks x K=2 x 2 vs 1 x 8";
}

TEST(Ddp, BucketsReverseOrderSmallFirstAndRebuiltOnce) {
  Spec s;
  s.steps = 2;
  s.bucket_bytes = 16 << 10;
  s.first_bucket_bytes = 4 << 10;
  std::vector<std::vector<std::vector<std::string>>> after(2);
  auto errs = run_ranks(2, false, [&](auto pg) {
    auto cfg = tiny_gpt();
    nn::GPT model(cfg, 1);
    DdpOptions o;
    o.bucket_bytes = s.bucket_bytes;
    o.first_bucket_bytes = s.first_bucket_bytes;
    DistributedDataParallel ddp(model, pg, o);
    auto names = model.named_parameters();
    auto b = ddp.bucket_names();
    // Reverse registration order, first bucket within its smaller cap (unless one tensor).
    EXPECT_EQ(b.front().front(), names.back().first);
    EXPECT_EQ(b.back().back(), names.front().first);
    EXPECT_GT(b.size(), 2u);
    size_t count = 0;
    for (auto& bk : b) count += bk.size();
    EXPECT_EQ(count, names.size());
    EXPECT_FALSE(ddp.buckets_rebuilt());
    train_tiny(pg, s, &after[pg->rank()]);
  });
  ASSERT_EQ(errs[0], "");
  ASSERT_EQ(errs[1], "");
  EXPECT_EQ(after[0], after[1]) << "bucket order must be identical on every rank";
}

// A model whose second parameter never takes part in the loss.
class Partial : public nn::Module {
 public:
  explicit Partial(bool extra = false, int64_t width = 8) {
    used = register_parameter("used.weight", Tensor::full({width}, 0.5));
    unused = register_parameter("unused.weight", Tensor::full({4}, 0.25));
    if (extra) register_parameter("extra.weight", Tensor::full({3}, 1.0));
  }
  Tensor loss(float v) const {
    Tensor x = Tensor::full({used.numel()}, v);
    return ops::sum(ops::mul(used, x));
  }
  Tensor used, unused;
};

TEST(Ddp, UnusedParameterIsNamedInsteadOfHanging) {
  auto errs = run_ranks(2, false, [&](auto pg) {
    Partial m;
    DistributedDataParallel ddp(m, pg);
    ddp.zero_grad();
    autograd::backward(m.loss(1.0f + pg->rank()));
    ddp.finish();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errs[r].find("unused.weight"), std::string::npos) << errs[r];
    EXPECT_NE(errs[r].find("find_unused_parameters"), std::string::npos) << errs[r];
    EXPECT_EQ(errs[r].find("used.weight,"), std::string::npos) << errs[r];
  }
}

TEST(Ddp, FindUnusedParametersTreatsThemAsZero) {
  std::vector<std::vector<float>> used(2), unused(2);
  auto errs = run_ranks(2, false, [&](auto pg) {
    Partial m;
    DdpOptions o;
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(m, pg, o);
    for (int step = 0; step < 2; ++step) {
      ddp.zero_grad();
      autograd::backward(m.loss(1.0f + pg->rank()));
      ddp.finish();
    }
    used[pg->rank()] = m.used.grad().to_vector();
    unused[pg->rank()] = m.unused.grad().to_vector();
  });
  ASSERT_EQ(errs[0], "");
  ASSERT_EQ(errs[1], "");
  for (int r = 0; r < 2; ++r) {
    for (float v : used[r]) EXPECT_FLOAT_EQ(v, 1.5f);  // mean of 1 and 2
    for (float v : unused[r]) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Ddp, ParameterMismatchAcrossRanksIsAClearError) {
  // Rank 1 has a wider first parameter.
  auto errs = run_ranks(2, false, [&](auto pg) {
    Partial m(false, pg->rank() == 0 ? 8 : 9);
    DistributedDataParallel ddp(m, pg);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errs[r].find("used.weight"), std::string::npos) << errs[r];
    EXPECT_NE(errs[r].find("[8]"), std::string::npos) << errs[r];
    EXPECT_NE(errs[r].find("[9]"), std::string::npos) << errs[r];
  }
  // Rank 1 has an extra parameter.
  errs = run_ranks(2, false, [&](auto pg) {
    Partial m(pg->rank() == 1);
    DistributedDataParallel ddp(m, pg);
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errs[r].find("extra.weight"), std::string::npos) << errs[r];
}

TEST(Ddp, BroadcastsRankZerosParameters) {
  std::vector<std::vector<float>> w(3);
  auto errs = run_ranks(3, false, [&](auto pg) {
    nn::GPT model(tiny_gpt(), 100 + pg->rank());
    DistributedDataParallel ddp(model, pg);
    w[pg->rank()] = model.named_parameters().front().second.to_vector();
  });
  for (auto& e : errs) ASSERT_EQ(e, "");
  nn::GPT ref(tiny_gpt(), 100);
  EXPECT_EQ(w[1], ref.named_parameters().front().second.to_vector());
  EXPECT_EQ(w[1], w[0]);
  EXPECT_EQ(w[2], w[0]);
}

TEST(Ddp, DeterministicNeedsADeterministicGroup) {
  auto errs = run_ranks(2, false, [&](auto pg) {
    nn::GPT model(tiny_gpt(), 1);
    DdpOptions o;
    o.deterministic = true;
    DistributedDataParallel ddp(model, pg, o);
  });
  for (auto& e : errs) EXPECT_NE(e.find("deterministic"), std::string::npos) << e;
}

}  // namespace
