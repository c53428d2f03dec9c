// Mixed precision end to end through the `paratrain` binary: the loss scaler skips a step
// whose gradients hold an inf on any rank (a test hook injects one), on every rank and
// under ZeRO, halves the scale and grows it back; a skipped step leaves the weights as
// they were. Runs with fp32 compute and --loss-scale dynamic, and with fp16.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/weights_compare.h"

namespace fs = std::filesystem;
using namespace paratrain;

namespace {

struct RunResult {
  int rc = -1;
  std::string out;
};

// `env... paratrain ARGS` in `dir` (or under `paratrain launch` with `ranks` > 1), with a timeout.
RunResult run(const std::string& dir, const std::string& env, int ranks, const std::string& args) {
  const std::string bin = PARATRAIN_BIN;
  std::string cmd = "cd " + dir + " && " + env + " timeout 120 " + bin +
                    (ranks > 1 ? " launch --nproc-per-node " + std::to_string(ranks) + " -- " + bin : "") + " " +
                    args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::vector<nlohmann::json> steps_of(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("eval")) v.push_back(j);
  }
  return v;
}

struct Case {
  const char* name;
  const char* precision_args;
  int ranks;
  const char* layout_args;
};

class LossScaling : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_amp_XXXXXX";
    dir_ = mkdtemp(tmpl);
    test::write_structured_token_file(dir_ + "/t.bin");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string train(int steps, const std::string& extra) const {
    const Case& c = GetParam();
    return std::string("train --model gpt-nano --data t.bin --micro-batch 4 --threads 1 --quiet --deterministic ") +
           "--lr-schedule constant --steps " + std::to_string(steps) + " " + c.precision_args + " " + c.layout_args +
           " " + extra;
  }
  std::string dir_;
};

TEST_P(LossScaling, AnInfOnOneRankSkipsTheStepEverywhereAndTheScaleBacksOffAndGrows) {
  const Case& c = GetParam();
  const int victim = c.ranks - 1;  // the last rank: rank 0, which writes the metrics, sees no inf itself
  RunResult r = run(dir_, "PARATRAIN_TEST_INJECT_INF=" + std::to_string(victim) + ":1", c.ranks,
              train(6, "--loss-scale-growth-interval 2 --metrics m.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("step 2: gradients hold inf/NaN at loss scale 65536: step skipped"), std::string::npos) << r.out;
  auto m = steps_of(dir_ + "/m.jsonl");
  ASSERT_EQ(m.size(), 6u);
  const double expect_scale[6] = {65536, 65536, 32768, 32768, 65536, 65536};
  for (int s = 0; s < 6; ++s) {
    EXPECT_EQ(m[s]["loss_scale"].get<double>(), expect_scale[s]) << "step " << s;
    EXPECT_EQ(m[s]["skipped"].get<bool>(), s == 1) << "step " << s;
  }
  EXPECT_TRUE(m[1]["grad_norm"].is_null()) << "a skipped step has no gradient norm";
}

TEST_P(LossScaling, ASkippedStepLeavesTheWeightsAsTheyWere) {
  const Case& c = GetParam();
  RunResult a = run(dir_, "PARATRAIN_TEST_INJECT_INF=0:2", c.ranks, train(3, "--save-final skipped.st"));
  ASSERT_EQ(a.rc, 0) << a.out;
  RunResult b = run(dir_, "", c.ranks, train(2, "--save-final two.st"));
  ASSERT_EQ(b.rc, 0) << b.out;
  std::string first;
  EXPECT_TRUE(test::bit_identical(test::load_weights(dir_ + "/skipped.st"), test::load_weights(dir_ + "/two.st"), &first))
      << "3 steps with the last skipped differ from 2 steps at " << first;
}

INSTANTIATE_TEST_SUITE_P(
    MixedPrecision, LossScaling,
    ::testing::Values(Case{"fp32_dynamic", "--loss-scale dynamic", 1, ""},
                      Case{"fp32_dynamic_2ranks", "--loss-scale dynamic", 2, ""},
                      Case{"fp32_dynamic_2ranks_zero1", "--loss-scale dynamic", 2, "--zero 1"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
