// paratrain::spawn (launch/spawn.h): a program that starts its own ranks by re-executing
// itself (tests/launch/spawn_helper.cpp), against the same program under `paratrain launch`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "launch/launch_test_util.h"

using namespace paratrain::launch::testing;
using ::testing::HasSubstr;

namespace {

const std::string kHelper = std::string(PARATRAIN_TEST_BIN_DIR) + "/spawn_helper";

// Lines of `text` starting with `prefix`, sorted (ranks print concurrently).
std::vector<std::string> sorted_lines(const std::string& text, const std::string& prefix) {
  std::vector<std::string> v = lines_with(text, prefix);
  std::sort(v.begin(), v.end());
  return v;
}

// The lines every rank prints, "[r] ARGS ..." and "[r] SUM ...", sorted.
std::vector<std::string> rank_results(const std::string& out) {
  std::vector<std::string> v;
  for (const std::string& line : lines_with(out, "[")) {
    auto close = line.find("] ");
    if (close == std::string::npos) continue;
    std::string rest = line.substr(close + 2);
    if (rest.rfind("ARGS ", 0) == 0 || rest.rfind("SUM ", 0) == 0) v.push_back(line);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Every run: no RANK & co. from the environment of whoever runs the tests.
const std::vector<std::string> kClean = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_PORT=",
                                         "OMPI_COMM_WORLD_RANK=", "OMPI_COMM_WORLD_SIZE=", "PMI_RANK=", "PMI_SIZE=",
                                         "SLURM_PROCID=", "SLURM_NTASKS=", "PARATRAIN_SPAWNED_BY="};

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> env = kClean;
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

}  // namespace

TEST(Spawn, TwoRanksAllReduceAndTheParentReturnsZero) {
  auto r = run({kHelper, "allreduce", "--flag", "x y"}, 60, with({}));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  std::vector<std::string> want = {"[0] ARGS allreduce --flag x y", "[0] SUM rank=0 size=2 sum=3",
                                   "[1] ARGS allreduce --flag x y", "[1] SUM rank=1 size=2 sum=3"};
  EXPECT_EQ(rank_results(r.out), want) << r.out;
  // Re-execution: main() ran in the parent and in both ranks; the code after spawn() ran
  // in the parent only.
  EXPECT_EQ(sorted_lines(r.out, "BEFORE").size(), 1u) << r.out;
  EXPECT_EQ(sorted_lines(r.out, "[0] BEFORE").size(), 1u) << r.out;
  EXPECT_EQ(sorted_lines(r.out, "[1] BEFORE").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "SPAWN_RETURNED 0").size(), 1u) << r.out;
  EXPECT_TRUE(lines_with(r.out, "[0] SPAWN_RETURNED").empty()) << r.out;
  // SpawnOptions::env reaches the ranks only; they know they were spawned.
  EXPECT_EQ(sorted_lines(r.out, "[0] VAR=hello").size(), 1u) << r.out;
  EXPECT_EQ(sorted_lines(r.out, "[1] VAR=hello").size(), 1u) << r.out;
  EXPECT_EQ(sorted_lines(r.out, "[1] SPAWNED=1").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "PARENT_VAR=unset").size(), 1u) << r.out;
}

TEST(Spawn, AFailingRankStopsTheOthersAndItsCodeIsReturned) {
  const std::string flag = "/tmp/pt_spawn_fail_" + std::to_string(::getpid());
  ::unlink(flag.c_str());
  // Rank 0 sleeps 300 s; the run's deadline is 60 s, so only a stop by spawn ends it in time.
  auto r = run({kHelper, "fail", flag}, 60, with({}));
  ::unlink(flag.c_str());
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 3) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, "SPAWN_RETURNED 3").size(), 1u) << r.out;
  EXPECT_THAT(r.err, HasSubstr("rank 1 (node 0")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("exit code 3")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stopped by SIGTERM")) << r.err;
  // Rank 0 is gone (reaped) by the time spawn returned.
  auto pid_lines = lines_with(r.out, "[0] PID ");
  ASSERT_EQ(pid_lines.size(), 1u) << r.out;
  EXPECT_FALSE(alive(std::atoi(pid_lines[0].substr(8).c_str()))) << pid_lines[0];
}

TEST(Spawn, ARankKilledByASignalGives128PlusTheSignal) {
  auto r = run({kHelper, "signal"}, 60, with({}));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 128 + SIGABRT) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, "SPAWN_RETURNED " + std::to_string(128 + SIGABRT)).size(), 1u) << r.out;
  EXPECT_THAT(r.err, HasSubstr("SIGABRT")) << r.err;
}

TEST(Spawn, AnExceptionInARankIsItsErrorAndExitCode) {
  auto r = run({kHelper, "throw"}, 60, with({}));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("[0] error: bad rank input")) << r.err;
}

// The same program under the real launcher: each process is already a rank, spawn runs the
// function in place, and the ranks' results are the same as under spawn.
TEST(Spawn, UnderParatrainLaunchTheSameProgramGivesTheSameResults) {
  auto s = run({kHelper, "allreduce", "a", "b"}, 60, with({}));
  ASSERT_FALSE(s.timed_out) << s.out << s.err;
  ASSERT_EQ(s.status, 0) << s.out << s.err;
  auto l = run({PARATRAIN_BIN, "launch", "--nproc-per-node", "2", "--", kHelper, "allreduce", "a", "b"}, 60, with({}));
  ASSERT_FALSE(l.timed_out) << l.out << l.err;
  ASSERT_EQ(l.status, 0) << l.out << l.err;
  EXPECT_EQ(rank_results(l.out), rank_results(s.out)) << s.out << "\n---\n" << l.out;
  EXPECT_EQ(rank_results(l.out).size(), 4u) << l.out;
  // In place: the code after spawn() runs in each rank, which was not spawned.
  EXPECT_EQ(lines_with(l.out, "[0] SPAWN_RETURNED 0").size(), 1u) << l.out;
  EXPECT_EQ(lines_with(l.out, "[1] SPAWN_RETURNED 0").size(), 1u) << l.out;
  EXPECT_EQ(lines_with(l.out, "[1] SPAWNED=0").size(), 1u) << l.out;
}

TEST(Spawn, BadUseIsAnInputError) {
  auto zero = run({kHelper, "zero"}, 30, with({}));
  EXPECT_EQ(zero.status, 2) << zero.out << zero.err;
  EXPECT_THAT(zero.err, HasSubstr("error: spawn: nprocs must be at least 1 (got 0)")) << zero.err;
  EXPECT_TRUE(lines_with(zero.out, "[").empty()) << zero.out;  // no rank started

  // Already rank 0 of a 2-rank job (torchrun's variables), asked for 3.
  auto mm = run({kHelper, "mismatch"}, 30, with({"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=29999"}));
  EXPECT_EQ(mm.status, 2) << mm.out << mm.err;
  EXPECT_THAT(mm.err, HasSubstr("spawn(3, ...): this process is rank 0 of a job of 2 ranks")) << mm.err;
  EXPECT_THAT(mm.err, HasSubstr("call spawn(2, ...)")) << mm.err;

  // A second call in one process (here in place, as rank 0 of a job of one).
  auto tw = run({kHelper, "twice"}, 30, with({"RANK=0", "WORLD_SIZE=1"}));
  EXPECT_EQ(tw.status, 2) << tw.out << tw.err;
  EXPECT_EQ(lines_with(tw.out, "FIRST_RETURNED 0").size(), 1u) << tw.out;
  EXPECT_THAT(tw.err, HasSubstr("spawn: called a second time in this process")) << tw.err;
}
