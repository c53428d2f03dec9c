// PARATRAIN_LOG end to end with the real binary: `paratrain launch --nproc-per-node 2 --
// paratrain train --model gpt-nano --steps 2` at debug shows tagged lines of comm, launch and
// train from both ranks; at warn none of the info/debug lines; a bogus value exits 2 with one line.
// PARATRAIN_PROFILE=1's op table after a run.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>

#include "paratrain/data/token_file.h"
#include "support/run_binary.h"

namespace fs = std::filesystem;

namespace {

class LogCli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_logcli_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::vector<uint16_t> t(20000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 13) % 256);
    paratrain::data::write_token_file(dir_ + "/t.bin", t);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The launch of a 2-step training run under PARATRAIN_LOG=value (stdout and stderr together).
  paratrain::test::CommandResult launch_train(const std::string& value) {
    const std::string bin = PARATRAIN_BIN;
    return paratrain::test::run_shell_line("PARATRAIN_LOG='" + value + "' timeout 120 " + bin +
                                           " launch --nproc-per-node 2 -- " + bin +
                                           " train --model gpt-nano --steps 2 --micro-batch 2 --backend shm --quiet --data " + dir_ +
                                           "/t.bin 2>&1");
  }
  std::string dir_;
};

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_F(LogCli, DebugShowsTaggedLinesOfCommLaunchAndTrain) {
  auto r = launch_train("debug");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string me = "[rank " + std::to_string(rank) + " ";
    EXPECT_NE(r.out.find(me + "comm] debug: connecting to the store at "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(me + "comm] debug: process group world ready: backend shm, rank " + std::to_string(rank) +
                         " of 2"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(me + "train] debug: rank " + std::to_string(rank) + " of 2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(me + "data] debug: token file "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[launch] debug: spawned rank " + std::to_string(rank) + " (local rank "), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("[launch] debug: rank " + std::to_string(rank) + " (pid "), std::string::npos) << r.out;
  }
  // Every tagged line is whole: "[rank R TAG] LEVEL: text" or "[launch] LEVEL: text" (after
  // the launcher's "[R] " prefix of a rank's output).
  const std::regex tagged(R"(^(\[[0-9]+\] )?\[(rank [0-9]+ )?[a-z]+\] (debug|info|warn|error): .+$)");
  std::istringstream in(r.out);
  std::string line;
  int tagged_lines = 0;
  while (std::getline(in, line)) {
    if (line.find("] debug: ") == std::string::npos) continue;
    EXPECT_TRUE(std::regex_match(line, tagged)) << line;
    ++tagged_lines;
  }
  EXPECT_GE(tagged_lines, 12);
}

TEST_F(LogCli, WarnShowsNoInfoOrDebugLines) {
  auto r = launch_train("warn");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, "] debug: "), 0) << r.out;
  EXPECT_EQ(count(r.out, "] info: "), 0) << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;  // the run's own output stays
}

TEST_F(LogCli, PerTagLevelShowsOnlyThatTag) {
  auto r = launch_train("warn,launch=debug");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_GE(count(r.out, "[launch] debug: "), 4) << r.out;
  EXPECT_EQ(count(r.out, " comm] debug: "), 0) << r.out;
}

TEST_F(LogCli, BogusValueExitsTwoWithOneLine) {
  for (const std::string& args : {std::string(" launch --nproc-per-node 2 -- ") + PARATRAIN_BIN + " train --model gpt-nano",
                                  std::string(" train --model gpt-nano --data ") + dir_ + "/t.bin"}) {
    auto r = paratrain::test::run_shell_line("PARATRAIN_LOG=bogus timeout 60 " + std::string(PARATRAIN_BIN) + args +
                                             " 2>&1");
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_EQ(count(r.out, "\n"), 1) << r.out;
    EXPECT_NE(r.out.find("PARATRAIN_LOG='bogus'"), std::string::npos) << r.out;
  }
  // doctor reports it as a failed check instead of refusing to start.
  auto d = paratrain::test::run_shell_line("PARATRAIN_LOG=bogus timeout 60 " + std::string(PARATRAIN_BIN) +
                                           " doctor 2>&1");
  EXPECT_NE(d.out.find("PARATRAIN_LOG='bogus'"), std::string::npos) << d.out;
}

// PARATRAIN_PROFILE=1: after training, the op table holds the GPT's ops forward and backward,
// its loss (the tied head with the loss in one op) and the optimizer's step, one per step.
TEST_F(LogCli, ProfileTablesTheOpsTheLossAndTheOptimizerStep) {
  const std::string bin = PARATRAIN_BIN;
  auto r = paratrain::test::run_shell_line("PARATRAIN_PROFILE=1 timeout 120 " + bin +
                                           " train --model gpt-nano --steps 3 --micro-batch 2 --quiet --data " + dir_ +
                                           "/t.bin 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto table = r.out.find("op profile (PARATRAIN_PROFILE):");
  ASSERT_NE(table, std::string::npos) << r.out;
  const std::string t = r.out.substr(table);
  for (const char* row : {"linear_cross_entropy (backward)", "linear_gelu (backward)", "causal_self_attention "})
    EXPECT_NE(t.find(row), std::string::npos) << row << "\n" << t;
  const std::regex adamw(R"(adamw\.step +[0-9.]+ ms +[0-9.]+% +3 calls)");
  EXPECT_TRUE(std::regex_search(t, adamw)) << t;
}
