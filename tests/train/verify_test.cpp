// `paratrain verify` as real processes (2 ranks under `paratrain launch`, gpt-nano, 3 steps):
// it passes on a correct run (plain DDP, ZeRO 1, --deterministic), fails with exit 1 naming
// the step and tensor when PARATRAIN_TEST_BREAK_REDUCTION breaks one rank's reduced
// gradient, and refuses what it cannot check with exit 2. Every process has a deadline.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "parallel/train_multirank_util.h"
#include "paratrain/tensor/cuda.h"

using namespace paratrain;

namespace {

using paratrain::test::kBin;
using paratrain::test::read_text;
using paratrain::test::Result;
using paratrain::test::spawn;
using paratrain::test::split;
using paratrain::test::TrainMultiRank;

class Verify : public TrainMultiRank {
 protected:
  static std::string args(const std::string& extra) {
    return "verify --model gpt-nano --data t.bin --steps 3 --micro-batch 4 --threads 1 " + extra;
  }
  // Under `paratrain launch --nproc-per-node 2` with `env` added ("NAME=VALUE" or empty).
  Result launch2(const std::string& extra, const std::string& env = "") {
    std::vector<std::string> argv = {kBin, "launch", "--nproc-per-node", "2", "--", kBin};
    for (auto& a : split(args(extra))) argv.push_back(a);
    return spawn({argv}, {env.empty() ? std::vector<std::string>{} : std::vector<std::string>{env}}, dir_, 90);
  }
  nlohmann::json report(const std::string& file) { return nlohmann::json::parse(read_text(path(file))); }
};

TEST_F(Verify, PassesOnACorrectTwoRankRun) {
  Result r = launch2("--json v.json");
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("verdict: PASS"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 3/3"), std::string::npos) << r.output;
  const auto j = report("v.json");
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_EQ(j["dp"], 2);
  ASSERT_EQ(j["per_step"].size(), 3u);
  for (const auto& s : j["per_step"]) {
    EXPECT_TRUE(s["replicas_identical"].get<bool>());
    EXPECT_LE(s["grad_rel"].get<double>(), 1e-5) << s;
    EXPECT_LE(s["global_rel"].get<double>(), 1e-5) << s;
  }
  EXPECT_GT(j["tensors"].size(), 10u);
}

TEST_F(Verify, PassesWithZero1AndGradientAccumulation) {
  Result r = launch2("--zero 1 --grad-accum 2 --json v.json");
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("verdict: PASS"), std::string::npos) << r.output;
  EXPECT_TRUE(report("v.json")["passed"].get<bool>());
}

TEST_F(Verify, DeterministicIsBitIdenticalToOneProcess) {
  Result r = launch2("--deterministic --json v.json");
  ASSERT_TRUE(r.ok()) << r.output;
  const auto j = report("v.json");
  EXPECT_TRUE(j["params_judged"].get<bool>());
  EXPECT_EQ(j["param_tolerance"].get<double>(), 0.0);
  for (const auto& t : j["tensors"]) EXPECT_EQ(t["param_abs"].get<double>(), 0.0) << t["name"];
}

TEST_F(Verify, BrokenReductionFailsNamingTheStepAndTensor) {
  Result r = launch2("--json v.json", "PARATRAIN_TEST_BREAK_REDUCTION=h.0.mlp.c_fc.weight:2");
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.codes[0], 1) << r.output;
  EXPECT_NE(r.output.find("verdict: FAIL: first divergence at step 2 in tensor h.0.mlp.c_fc.weight"), std::string::npos)
      << r.output;
  const auto j = report("v.json");
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["failure"]["step"], 2);
  EXPECT_EQ(j["failure"]["tensor"], "h.0.mlp.c_fc.weight");
  // Step 1 was clean; from step 2 rank 1's replica differs.
  EXPECT_TRUE(j["per_step"][0]["replicas_identical"].get<bool>());
  EXPECT_FALSE(j["per_step"][1]["replicas_identical"].get<bool>());
}

// With ZeRO the all-gather spreads rank 1's wrong piece to every rank: the replicas stay
// identical and only the gradient check can see it.
TEST_F(Verify, BrokenReductionUnderZero1IsCaughtByTheGradientCheck) {
  Result r = launch2("--zero 1 --json v.json", "PARATRAIN_TEST_BREAK_REDUCTION=h.0.mlp.c_fc.weight:2");
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.codes[0], 1) << r.output;
  const auto j = report("v.json");
  EXPECT_EQ(j["failure"]["step"], 2) << r.output;
  EXPECT_EQ(j["failure"]["tensor"], "h.0.mlp.c_fc.weight") << r.output;
  for (const auto& s : j["per_step"]) EXPECT_TRUE(s["replicas_identical"].get<bool>()) << s;
  EXPECT_GT(j["per_step"][1]["grad_rel"].get<double>(), 1e-3);
}

TEST_F(Verify, OneProcessRunsAndSaysItIsTriviallyConsistent) {
  Result r = single(args(""));
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("one data-parallel rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("verdict: PASS"), std::string::npos) << r.output;
}

TEST_F(Verify, BadInputExitsTwo) {
  for (const std::string extra : {"--steps 0", "--zero 3", "--dropout 0.1", "--save-final x.st", "--zero 7"}) {
    Result r = single(args(extra));
    ASSERT_FALSE(r.timed_out) << extra;
    EXPECT_EQ(r.codes[0], 2) << extra << "\n" << r.output;
  }
  std::vector<std::string> argv = {kBin};
  for (auto& a : split(args(""))) argv.push_back(a);
  Result hook = spawn({argv}, {{"PARATRAIN_TEST_BREAK_REDUCTION=no.such.tensor:1"}}, dir_, 60);
  EXPECT_EQ(hook.codes[0], 2) << hook.output;
  EXPECT_NE(hook.output.find("no parameter 'no.such.tensor'"), std::string::npos) << hook.output;
  Result tp = launch2("--tp 2");
  ASSERT_FALSE(tp.timed_out) << tp.output;
  EXPECT_NE(tp.codes[0], 0) << tp.output;
  EXPECT_NE(tp.output.find("--tp 2 is not built yet"), std::string::npos) << tp.output;
  // --device cuda is verify's too: without a GPU it is the device's error, not "not built".
  if (cuda::device_count() == 0) {
    Result gpu = single(args("--device cuda"));
    EXPECT_EQ(gpu.codes[0], 2) << gpu.output;
    EXPECT_NE(gpu.output.find("--device cuda is not available"), std::string::npos) << gpu.output;
  }
}

}  // namespace
