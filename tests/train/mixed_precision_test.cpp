// Mixed precision end to end through the `paratrain` binary: the loss scaler skips a step
// whose gradients hold an inf on any rank (a test hook injects one), on every rank and
// under ZeRO, halves the scale and grows it back; a skipped step leaves the weights as
// they were. Runs with fp32 compute and --loss-scale dynamic, and with fp16.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdlib>
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

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

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
                      Case{"fp32_dynamic_2ranks_zero1", "--loss-scale dynamic", 2, "--zero 1"},
                      Case{"fp16", "--precision fp16", 1, ""},
                      Case{"fp16_2ranks_zero1", "--precision fp16", 2, "--zero 1"},
                      Case{"bf16_dynamic_2ranks", "--precision bf16 --loss-scale dynamic", 2, ""}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace

namespace {

class HalfPrecision : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_half_XXXXXX";
    dir_ = mkdtemp(tmpl);
    test::write_structured_token_file(dir_ + "/t.bin");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string train(const std::string& extra) const {
    return std::string("train --model gpt-nano --data t.bin --threads 1 --quiet --deterministic --lr-schedule "
                       "constant --precision ") +
           GetParam() + " " + extra;
  }
  std::string dir_;
};

// DESIGN.md's determinism principle, in the half types: 2 ranks of one micro-batch each give
// the bits of one process accumulating the 2 micro-batches.
TEST_P(HalfPrecision, TwoRanksEqualOneProcessWithTwoMicroBatches) {
  RunResult one = run(dir_, "", 1, train("--micro-batch 4 --grad-accum 2 --steps 6 --save-final one.st"));
  ASSERT_EQ(one.rc, 0) << one.out;
  RunResult two = run(dir_, "", 2, train("--micro-batch 4 --steps 6 --save-final two.st"));
  ASSERT_EQ(two.rc, 0) << two.out;
  std::string first;
  EXPECT_TRUE(test::bit_identical(test::load_weights(dir_ + "/one.st"), test::load_weights(dir_ + "/two.st"), &first))
      << GetParam() << ": differs at " << first;
}

// A run killed after its checkpoint at step 3 and resumed ends with the bits of one that
// never stopped: the master weights, the optimizer, and (fp16) the loss scaler's state,
// whose scale grows every 2 clean steps here, so a resume that lost its growth counter would
// grow at other steps.
TEST_P(HalfPrecision, KilledAndResumedEqualsUninterrupted) {
  const std::string args = "--micro-batch 4 --steps 6 --loss-scale dynamic --loss-scale-growth-interval 2 ";
  RunResult whole = run(dir_, "", 1, train(args + "--save-final whole.st --metrics whole.jsonl"));
  ASSERT_EQ(whole.rc, 0) << whole.out;
  RunResult first = run(dir_, "PARATRAIN_TEST_KILL_IN_SAVE=0:6", 1,
                        train(args + "--checkpoint-dir ck --checkpoint-every 3"));
  ASSERT_EQ(first.rc, 128 + 9) << "the hook kills the run while it saves step 6: " << first.out;
  RunResult resumed = run(dir_, "", 1,
                          train(args + "--checkpoint-dir ck --checkpoint-every 3 --resume "
                                "--save-final resumed.st --metrics resumed.jsonl"));
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from ck/step_3"), std::string::npos) << resumed.out;
  auto w = steps_of(dir_ + "/whole.jsonl"), r = steps_of(dir_ + "/resumed.jsonl");
  ASSERT_EQ(w.size(), 6u);
  ASSERT_EQ(r.size(), 3u);
  for (int s = 0; s < 3; ++s)
    EXPECT_EQ(r[s]["loss_scale"].get<double>(), w[3 + s]["loss_scale"].get<double>()) << "step " << 3 + s;
  EXPECT_EQ(w[5]["loss_scale"].get<double>(), 65536.0 * 4) << "grown after steps 2 and 4";
  std::string at;
  EXPECT_TRUE(test::bit_identical(test::load_weights(dir_ + "/whole.st"), test::load_weights(dir_ + "/resumed.st"), &at))
      << GetParam() << ": differs at " << at;
}

// --compress bf16 puts the (f32 master) gradients on the wire in bf16 while the update stays
// f32: it runs with --precision bf16 and ends near the uncompressed run.
TEST_P(HalfPrecision, CompressedGradientsOnTheWire) {
  // (compression is not bit-reproducible, so without --deterministic)
  const std::string base = std::string("train --model gpt-nano --data t.bin --threads 1 --quiet --lr-schedule constant "
                                       "--micro-batch 4 --steps 20 --precision ") + GetParam();
  RunResult plain = run(dir_, "", 2, base + " --metrics plain.jsonl");
  ASSERT_EQ(plain.rc, 0) << plain.out;
  RunResult packed = run(dir_, "", 2, base + " --compress bf16 --metrics packed.jsonl");
  ASSERT_EQ(packed.rc, 0) << packed.out;
  auto a = steps_of(dir_ + "/plain.jsonl"), b = steps_of(dir_ + "/packed.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(b.back()["comm_bytes"].get<double>() * 2, b.back()["comm_bytes_uncompressed"].get<double>());
  EXPECT_NEAR(b.back()["loss"].get<double>(), a.back()["loss"].get<double>(), 0.01 * a.back()["loss"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(MixedPrecision, HalfPrecision, ::testing::Values("bf16", "fp16"));

TEST(MixedPrecisionCli, BadValuesExitTwoAndWriteNothing) {
  char tmpl[] = "/tmp/paratrain_half_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  test::write_structured_token_file(dir + "/t.bin");
  for (const char* bad : {"--precision fp8", "--loss-scale sometimes", "--loss-scale -2", "--save-dtype f64",
                          "--loss-scale-growth-interval 0"}) {
    RunResult r = run(dir, "", 1,
                      std::string("train --model gpt-nano --data t.bin --steps 2 --quiet --metrics m.jsonl "
                                  "--save-final out.st ") + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << bad << ": " << r.out;
    EXPECT_FALSE(fs::exists(dir + "/m.jsonl")) << bad;
    EXPECT_FALSE(fs::exists(dir + "/out.st")) << bad;
  }
  fs::remove_all(dir);
}

// --save-dtype bf16 halves the model file; it loads back (into f32 master weights) with
// --init-from, and PyTorch reads it as bf16.
TEST(MixedPrecisionCli, SaveDtypeBf16HalvesTheFileAndLoadsBack) {
  char tmpl[] = "/tmp/paratrain_half_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  test::write_structured_token_file(dir + "/t.bin");
  const std::string base = "train --model gpt-nano --data t.bin --steps 3 --threads 1 --quiet --precision bf16 ";
  RunResult a = run(dir, "", 1, base + "--save-final f32.st");
  ASSERT_EQ(a.rc, 0) << a.out;
  RunResult b = run(dir, "", 1, base + "--save-final bf16.st --save-dtype bf16");
  ASSERT_EQ(b.rc, 0) << b.out;
  const auto f32_bytes = fs::file_size(dir + "/f32.st"), bf16_bytes = fs::file_size(dir + "/bf16.st");
  EXPECT_LT(bf16_bytes, f32_bytes * 0.51) << f32_bytes << " vs " << bf16_bytes;
  auto w32 = test::load_weights(dir + "/f32.st"), w16 = test::load_weights(dir + "/bf16.st");
  for (const auto& [name, t] : w32) {
    ASSERT_TRUE(w16.count(name)) << name;
    for (size_t i = 0; i < t.size(); ++i)
      ASSERT_EQ(w16.at(name)[i], bf16_to_f32(f32_to_bf16(t[i]))) << name << "[" << i << "] is not the bf16 rounding";
  }
  RunResult c = run(dir, "", 1, "train --model gpt-nano --data t.bin --steps 1 --threads 1 --quiet --init-from bf16.st");
  EXPECT_EQ(c.rc, 0) << c.out;
  const std::string py = "cd " + dir +
                         " && timeout 60 /usr/bin/python3 -c \"import sys; sys.path.insert(0, '" PARATRAIN_SOURCE_DIR
                         "/tests/python'); import safetensors_np as st, torch; t = st.load('bf16.st'); "
                         "assert t['wte.weight'].dtype == torch.bfloat16, t['wte.weight'].dtype\"";
  EXPECT_EQ(std::system(py.c_str()), 0) << py;
  fs::remove_all(dir);
}

}  // namespace
