// ZeRO stages 1 and 2 (parallel/zero.h) against plain data parallelism (DDP + the same
// optimizer): one thread per rank (shm groups over a HashStore) with 2 and 3 ranks, several
// buckets with padded last blocks, SGD to 1e-6 relative and AdamW with gradient
// accumulation and active clipping bit for bit in deterministic mode; optimizer state and
// gradient memory per rank; and `paratrain train --zero` end to end through the real binary
// (2 and 3 ranks under `paratrain launch`, metrics, bad values).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/comm/store.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"
#include "parallel/ddp_test_util.h"
#include "support/weights_compare.h"
#include "paratrain/parallel/zero.h"
#include "paratrain/tensor/random.h"
#include "support/run_binary.h"

namespace fs = std::filesystem;
using namespace paratrain;
using namespace paratrain::parallel;

namespace {

using paratrain::testing::make_rows;
using paratrain::testing::run_ranks;
using paratrain::testing::tiny_gpt;

using paratrain::test::bit_identical;
using paratrain::test::load_weights;
using paratrain::test::max_rel_diff;
using paratrain::test::Weights;




struct Spec {
  int zero = 0;
  int64_t accum = 1;
  int steps = 6;
  bool deterministic = false;
  bool adamw = false;  // SGD with momentum otherwise (see ddp_test.cpp on AdamW and rounding)
  double clip = 0.5;   // active: the tiny GPT's gradient norm starts above 1
};

struct Outcome {
  Weights weights;
  ZeroMemory memory;             // after the last step (zero > 0)
  int64_t plain_state_bytes = 0; // optimizer state bytes (zero == 0)
  int64_t grad_bytes = 0;        // ddp.gradient_bytes() after the last step
  std::vector<double> norms;
};

// Trains the tiny GPT; rank r takes slice j = k*world + r at micro-step k. Several buckets
// (16 KiB, the first 4 KiB), so some blocks are padded and parameters cross block borders.
Outcome train_tiny(const std::shared_ptr<comm::ProcessGroup>& pg, const Spec& s) {
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
  auto cfg = tiny_gpt();
  nn::GPT model(cfg, 100 + static_cast<uint64_t>(rank));
  DdpOptions o;
  o.deterministic = s.deterministic;
  o.bucket_bytes = 16 << 10;
  o.first_bucket_bytes = 4 << 10;
  o.zero_stage = s.zero;
  DistributedDataParallel ddp(model, pg, o);
  auto params = model.named_parameters();
  const optim::NamedParams opt_params = s.zero > 0 ? zero_pieces(ddp) : params;
  std::unique_ptr<optim::Optimizer> opt;
  if (s.adamw) {
    optim::AdamWOptions ao;
    ao.lr = 3e-3, ao.beta2 = 0.95, ao.weight_decay = 0.1;
    opt = std::make_unique<optim::AdamW>(opt_params, ao);
  } else {
    optim::SGDOptions so;
    so.lr = 0.1, so.momentum = 0.9, so.weight_decay = 0.01, so.decay_2d_only = true;
    opt = std::make_unique<optim::SGD>(opt_params, so);
  }
  std::optional<ZeroOptimizer> zero;
  if (s.zero > 0) zero.emplace(ddp, *opt);
  Outcome out;
  Tensor seed = Tensor::full({}, ddp.backward_seed(s.accum));
  for (int step = 0; step < s.steps; ++step) {
    ddp.zero_grad();
    for (int64_t k = 0; k < s.accum; ++k) {
      std::optional<NoSync> ns;
      if (k + 1 < s.accum) ns.emplace(ddp.no_sync());
      Tensor x, y;
      make_rows(step, (k * world + rank) * 2, 2, cfg.block_size, cfg.vocab_size, x, y);
      autograd::backward(model.loss(x, y), seed);
    }
    ddp.finish();
    if (zero) {
      const double norm = zero->grad_norm();
      zero->clip_grad_norm(s.clip, norm);
      zero->step();
      out.norms.push_back(norm);
    } else {
      const double norm = optim::grad_norm(params);
      optim::clip_grad_norm(params, s.clip, norm);
      opt->step();
      out.norms.push_back(norm);
    }
  }
  for (auto& [name, t] : params) out.weights[name] = t.to_vector();
  if (zero) out.memory = zero->memory();
  for (const auto& [k, t] : opt->state_dict()) out.plain_state_bytes += static_cast<int64_t>(t.nbytes());
  out.grad_bytes = ddp.gradient_bytes();
  return out;
}

std::vector<Outcome> train_ranks(int n, const Spec& s) {
  std::vector<Outcome> got(n);
  auto errs = run_ranks(n, s.deterministic, [&](auto pg) { got[pg->rank()] = train_tiny(pg, s); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errs[r], "") << "rank " << r;
  return got;
}



// (world, stage)
class ZeroEquivalence : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ZeroEquivalence, SgdMatchesPlainDataParallel) {
  const auto [n, stage] = GetParam();
  Spec plain;
  Spec zero = plain;
  zero.zero = stage;
  const auto ref = train_ranks(n, plain);
  const auto got = train_ranks(n, zero);
  ASSERT_FALSE(HasFailure());
  EXPECT_GT(ref[0].norms[0], plain.clip) << "clipping is not active";
  for (int r = 0; r < n; ++r) {
    std::string worst;
    const double rel = max_rel_diff(got[r].weights, ref[r].weights, &worst);
    EXPECT_LT(rel, 1e-6) << "zero " << stage << ", " << n << " ranks, rank " << r << ": worst tensor " << worst;
    std::string first;
    EXPECT_TRUE(bit_identical(got[r].weights, got[0].weights, &first)) << "rank " << r << " differs at " << first;
    for (size_t i = 0; i < ref[r].norms.size(); ++i)
      EXPECT_NEAR(got[r].norms[i], ref[r].norms[i], 1e-6 * ref[r].norms[i]) << "grad norm at step " << i;
  }
}

TEST_P(ZeroEquivalence, DeterministicAdamWWithAccumulationAndClippingIsBitIdentical) {
  const auto [n, stage] = GetParam();
  Spec plain;
  plain.deterministic = true, plain.adamw = true, plain.accum = 2;
  Spec zero = plain;
  zero.zero = stage;
  const auto ref = train_ranks(n, plain);
  const auto got = train_ranks(n, zero);
  ASSERT_FALSE(HasFailure());
  EXPECT_GT(ref[0].norms[0], plain.clip) << "clipping is not active";
  for (int r = 0; r < n; ++r) {
    std::string first;
    EXPECT_TRUE(bit_identical(got[r].weights, ref[r].weights, &first))
        << "zero " << stage << ", " << n << " ranks, rank " << r << " differs from plain DP at " << first
        << " (max rel " << max_rel_diff(got[r].weights, ref[r].weights) << ")";
  }
}

TEST_P(ZeroEquivalence, OptimizerStateAndGradientsAreCutInW) {
  const auto [n, stage] = GetParam();
  Spec plain;
  plain.adamw = true, plain.steps = 1;
  Spec zero = plain;
  zero.zero = stage;
  const auto ref = train_ranks(n, plain);
  const auto got = train_ranks(n, zero);
  ASSERT_FALSE(HasFailure());
  const int64_t unsharded = ref[0].plain_state_bytes;  // exp_avg + exp_avg_sq of every element
  int64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    const ZeroMemory& m = got[r].memory;
    sum += m.optimizer_bytes;
    // 1/W of the state, give or take the padding of each bucket's last block.
    EXPECT_NEAR(static_cast<double>(m.optimizer_bytes * n) / static_cast<double>(unsharded), 1.0, 0.01)
        << "rank " << r << ": " << m.optimizer_bytes << " of " << unsharded << " bytes";
    EXPECT_NEAR(static_cast<double>(m.optimizer_unsharded_bytes), static_cast<double>(unsharded), 1.0);
    EXPECT_EQ(m.gradient_bytes, got[r].grad_bytes);
    // Between steps stage 2 holds the shard only; stage 1 also keeps the full buckets.
    const int64_t plain_grads = ref[r].grad_bytes;  // the full buckets
    if (stage == 2)
      EXPECT_NEAR(static_cast<double>(got[r].grad_bytes * n) / static_cast<double>(plain_grads), 1.0, 0.01)
          << "rank " << r << ": " << got[r].grad_bytes << " bytes of gradients, unsharded " << plain_grads;
    else
      EXPECT_GE(got[r].grad_bytes, plain_grads) << "rank " << r;
  }
  EXPECT_EQ(sum, unsharded) << "the ranks' pieces must partition the state exactly";
}

INSTANTIATE_TEST_SUITE_P(WorldAndStage, ZeroEquivalence,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "w" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(Zero, OneProcessIsBitIdenticalToNoSharding) {
  for (int stage : {1, 2}) {
    Spec plain;
    plain.adamw = true, plain.accum = 2;
    Spec zero = plain;
    zero.zero = stage;
    std::string first;
    const Outcome z = train_tiny(nullptr, zero);
    EXPECT_TRUE(bit_identical(z.weights, train_tiny(nullptr, plain).weights, &first))
        << "zero " << stage << " differs at " << first;
    // One rank's shards are every parameter, unpadded: stage 2 then holds exactly their bytes
    // between steps (its released buckets count nothing).
    int64_t params = 0;
    for (const auto& [name, w] : z.weights) params += static_cast<int64_t>(w.size());
    if (stage == 2) EXPECT_EQ(z.grad_bytes, 4 * params);
  }
}

TEST(Zero, BadStageAndMisuseAreInputErrors) {
  nn::GPT model(tiny_gpt(), 1);
  DdpOptions o;
  o.zero_stage = 3;
  EXPECT_THROW(DistributedDataParallel(model, nullptr, o), InputError);
  DistributedDataParallel plain(model, nullptr);
  EXPECT_THROW(zero_pieces(plain), InputError);
  o.zero_stage = 1;
  DistributedDataParallel ddp(model, nullptr, o);
  optim::SGD whole(model.named_parameters(), {});  // not built over the pieces
  EXPECT_THROW(ZeroOptimizer(ddp, whole), InputError);
}

// ---- `paratrain train --zero` through the real binary ----

class ZeroTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_zero_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    paratrain::test::write_structured_token_file(path("t.bin"));
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // `paratrain train` on nproc ranks under `paratrain launch` (0: one process, no launcher).
  test::CommandResult train(int nproc, const std::string& args) {
    std::string cmd = nproc > 0 ? "launch --nproc-per-node " + std::to_string(nproc) + " -- " + PARATRAIN_BIN + " " : "";
    return test::run_paratrain(cmd + "train --model gpt-nano --data " + path("t.bin") + " --quiet " + args, 90);
  }
  std::vector<nlohmann::json> metrics(const std::string& name) const {
    std::vector<nlohmann::json> out;
    std::ifstream f(path(name));
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  std::string dir_;
};


TEST_F(ZeroTrain, ZeroOneAndTwoMatchPlainDataParallel) {
  // SGD on 3 ranks (the reduce-scatter sums in another order than the all-reduce: 1e-6), and
  // AdamW with --grad-accum 2 and active clipping in deterministic mode (bit for bit).
  const std::string sgd = "--steps 10 --micro-batch 2 --optimizer sgd --lr 0.1 ";
  const std::string adamw = "--steps 10 --micro-batch 2 --deterministic --grad-accum 2 --grad-clip 0.3 ";
  auto r = train(3, sgd + "--save-final " + path("sgd0.st"));
  ASSERT_EQ(r.rc, 0) << r.out;
  r = train(3, adamw + "--save-final " + path("adamw0.st") + " --metrics " + path("adamw0.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_FALSE(metrics("adamw0.jsonl").empty());
  EXPECT_GT(metrics("adamw0.jsonl")[0]["grad_norm"].get<double>(), 0.3) << "clipping is not active";
  for (int stage : {1, 2}) {
    const std::string z = "--zero " + std::to_string(stage) + " ";
    r = train(3, sgd + z + "--save-final " + path("sgd.st"));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("zero " + std::to_string(stage) + ": per rank, optimizer state"), std::string::npos) << r.out;
    const double rel = max_rel_diff(load_weights(path("sgd.st")), load_weights(path("sgd0.st")));
    EXPECT_LT(rel, 1e-6) << "--zero " << stage << " SGD on 3 ranks: relative difference " << rel;
    r = train(3, adamw + z + "--save-final " + path("adamw.st"));
    ASSERT_EQ(r.rc, 0) << r.out;
    std::string first;
    EXPECT_TRUE(bit_identical(load_weights(path("adamw.st")), load_weights(path("adamw0.st")), &first))
        << "--zero " << stage << " --deterministic differs from plain DP at " << first;
  }
}

TEST_F(ZeroTrain, MetricsShowPerRankMemoryFalling) {
  const std::string args = "--steps 2 --micro-batch 2 ";
  auto r = train(2, args + "--metrics " + path("z0.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  r = train(2, args + "--zero 1 --metrics " + path("z1.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  r = train(2, args + "--zero 2 --metrics " + path("z2.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto z0 = metrics("z0.jsonl").back(), z1 = metrics("z1.jsonl").back(), z2 = metrics("z2.jsonl").back();
  ASSERT_EQ(z0["mem_optimizer_bytes"].size(), 2u) << z0.dump();
  ASSERT_EQ(z1["mem_optimizer_bytes"].size(), 2u) << z1.dump();
  EXPECT_EQ(z1["zero"], 1);
  for (int rank = 0; rank < 2; ++rank) {
    const double opt0 = z0["mem_optimizer_bytes"][rank].get<double>();
    const double grad0 = z0["mem_grad_bytes"][rank].get<double>();
    EXPECT_GT(opt0, 0);
    for (const auto* z : {&z1, &z2}) {  // half the optimizer state (give or take padding)
      const double opt = (*z)["mem_optimizer_bytes"][rank].get<double>();
      EXPECT_NEAR(opt / opt0, 0.5, 0.01) << "rank " << rank << ": " << z->dump();
    }
    // Stage 1 keeps the full gradient buckets between steps, stage 2 only the half it owns.
    EXPECT_NEAR(z1["mem_grad_bytes"][rank].get<double>() / grad0, 1.5, 0.01) << z1.dump();
    EXPECT_NEAR(z2["mem_grad_bytes"][rank].get<double>() / grad0, 0.5, 0.01) << z2.dump();
  }
}

TEST_F(ZeroTrain, OneProcessAndBadValues) {
  auto r = train(0, "--steps 3 --micro-batch 2 --save-final " + path("a.st"));
  ASSERT_EQ(r.rc, 0) << r.out;
  r = train(0, "--steps 3 --micro-batch 2 --zero 2 --save-final " + path("b.st"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(bit_identical(load_weights(path("b.st")), load_weights(path("a.st")))) << "one process, --zero 2";
  for (const char* bad : {"4", "-1"}) {
    r = train(0, std::string("--steps 1 --zero ") + bad);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("--zero must be 0, 1, 2 or 3"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
  }
}

}  // namespace
