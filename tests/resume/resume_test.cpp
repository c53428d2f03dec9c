// Resume from training-state checkpoints through the real `paratrain` binary: a run stopped
// by SIGKILL after a checkpoint and resumed ends with the same weights, byte for byte, as a
// run never stopped (one process, and 2 ranks under `paratrain launch`); 2 ranks resume onto
// 3 at the same global batch; damaged checkpoints, and an incomplete one `latest` names, are
// named, exit 2, and nothing is trained. Incomplete checkpoints a killed save left
// (PARATRAIN_TEST_KILL_IN_SAVE) are passed over with a warning naming them: a group restarted
// after a rank died in its first save starts from step 0 and ends with the uninterrupted
// run's weights. With ZeRO (--zero 1|2) each rank saves its shard of the optimizer state: a
// killed run resumes bit for bit, the shards are re-cut for 3 ranks or assembled for one
// process, and a damaged or missing shard is named. Every spawned process has a deadline and
// is killed past it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/weights_compare.h"
#include "paratrain/checkpoint/safetensors.h"

namespace fs = std::filesystem;
using namespace paratrain;

namespace {

using paratrain::test::max_rel_diff;

const std::string kBin = PARATRAIN_BIN;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> split(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> out;
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

struct Proc {
  pid_t pid = -1;
  std::string log;
};

// Starts argv in `dir` as its own process group, output to `log`.
Proc start(const std::vector<std::string>& argv, const std::string& dir, const std::string& log) {
  Proc p;
  p.log = log;
  p.pid = ::fork();
  if (p.pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setpgid(0, 0);
    if (::chdir(dir.c_str()) != 0) ::_exit(126);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  return p;
}

// Waits for p up to timeout_s; past it kills its process group. Exit code, -signal, or
// -1000 on timeout.
int wait_for(const Proc& p, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int st = 0;
    if (::waitpid(p.pid, &st, WNOHANG) == p.pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-p.pid, SIGKILL);
      ::waitpid(p.pid, &st, 0);
      return -1000;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The direct children of `pid` (the ranks of a launcher).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t c; f >> c;) out.push_back(c);
  return out;
}


class Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_resume_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    paratrain::test::write_structured_token_file(dir_ + "/t.bin");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // `paratrain ARGS`, or under `paratrain launch --nproc-per-node NPROC LAUNCH_ARGS --`.
  std::vector<std::string> argv(int nproc, const std::string& args, const std::string& launch_args = "") const {
    std::vector<std::string> a = {kBin};
    if (nproc > 0) {
      a = {kBin, "launch", "--nproc-per-node", std::to_string(nproc)};
      for (auto& w : split(launch_args)) a.push_back(w);
      a.push_back("--");
      a.push_back(kBin);
    }
    for (auto& w : split(args)) a.push_back(w);
    return a;
  }
  // Runs to completion (nproc 0: one process without the launcher). Exit code; output in *out.
  int run(int nproc, const std::string& args, std::string* out, double timeout_s = 60) {
    Proc p = start(argv(nproc, args), dir_, dir_ + "/run" + std::to_string(runs_++) + ".log");
    const int rc = wait_for(p, timeout_s);
    *out = read_text(p.log);
    return rc;
  }
  // Starts a run and SIGKILLs it (nproc 0: the process; else its last rank) right after it
  // saved `ckpt` (ck/step_K): PARATRAIN_TEST_STOP_AT_STEP makes that rank stop itself
  // (SIGSTOP) at the start of step K, so the kill lands there however slowly this test is
  // scheduled; the other ranks wait in step K's first collective. `launch_args` go to the
  // launcher (with --max-restarts the restarted group is not stopped: the hook is for the
  // first attempt). Returns the launcher's / process's exit status.
  int run_and_kill(int nproc, const std::string& args, const std::string& ckpt, std::string* out,
                   const std::string& launch_args = "") {
    const std::string step = ckpt.substr(ckpt.rfind('_') + 1);
    const int victim_rank = nproc > 0 ? nproc - 1 : 0;
    std::vector<std::string> a = {"env", "PARATRAIN_TEST_STOP_AT_STEP=" + std::to_string(victim_rank) + ":" + step};
    for (auto& w : argv(nproc, args, launch_args)) a.push_back(w);
    Proc p = start(a, dir_, dir_ + "/killed" + std::to_string(runs_++) + ".log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool killed = false;
    while (!killed && std::chrono::steady_clock::now() < deadline) {
      if (fs::exists(path(ckpt + "/manifest.json"))) {
        const std::vector<pid_t> ranks = nproc == 0 ? std::vector<pid_t>{p.pid} : children_of(p.pid);
        for (pid_t r : ranks)
          if (stopped(r)) killed = ::kill(r, SIGKILL) == 0;
      }
      int st;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {  // ended without stopping at the checkpoint
        *out = read_text(p.log);
        ADD_FAILURE() << "the run ended before it stopped after " << ckpt << ":\n" << *out;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(killed) << "could not kill the run at " << ckpt;
    const int rc = wait_for(p, 60);
    *out = read_text(p.log);
    return rc;
  }
  // Whether process `pid` is stopped (state T in /proc/PID/stat).
  static bool stopped(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(f, line);
    const auto paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
  }
  // `paratrain launch --nproc-per-node 2 --max-restarts 1 -- paratrain train ARGS` with
  // PARATRAIN_TEST_KILL_IN_SAVE=kill (a rank SIGKILLs itself during that save, in the first
  // attempt only). The launcher's exit code; its output in *out.
  int launch_with_kill_in_save(const std::string& kill, const std::string& args, std::string* out) {
    std::vector<std::string> a = {"env", "PARATRAIN_TEST_KILL_IN_SAVE=" + kill, kBin, "launch", "--nproc-per-node", "2",
                                  "--max-restarts", "1", "--", kBin};
    for (auto& w : split(args)) a.push_back(w);
    Proc p = start(a, dir_, dir_ + "/launch" + std::to_string(runs_++) + ".log");
    const int rc = wait_for(p, 120);
    *out = read_text(p.log);
    return rc;
  }
  // The step a resumed run said it continues from ("resuming from ck/step_N"); -1 if none.
  static int64_t resumed_step(const std::string& out) {
    const std::string key = "resuming from ck/step_";
    auto at = out.find(key);
    return at == std::string::npos ? -1 : std::stoll(out.substr(at + key.size()));
  }
  std::string latest() const {
    std::string s = read_text(path("ck/latest"));
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
  int runs_ = 0;
};

const std::string kTrain = "train --model gpt-nano --data t.bin --quiet ";

TEST_F(Resume, OneProcessKilledAndResumedIsBitIdentical) {
  // With dropout, so the resumed run must also continue the dropout generator's stream.
  const std::string args = kTrain + "--steps 30 --micro-batch 4 --dropout 0.1 ";
  std::string out;
  ASSERT_EQ(run(0, args + "--save-final full.st", &out), 0) << out;
  // Checkpointing does not change the run.
  ASSERT_EQ(run(0, args + "--checkpoint-dir ck0 --checkpoint-every 5 --save-final ck0.st", &out), 0) << out;
  EXPECT_TRUE(read_text(path("ck0.st")) == read_text(path("full.st"))) << "checkpointing changed the weights";

  const int rc = run_and_kill(0, args + "--checkpoint-dir ck --checkpoint-every 5 --save-final resumed.st",
                              "ck/step_5", &out);
  ASSERT_EQ(rc, -SIGKILL) << out;
  ASSERT_FALSE(fs::exists(path("resumed.st")));
  ASSERT_EQ(run(0, args + "--checkpoint-dir ck --checkpoint-every 5 --resume --save-final resumed.st", &out), 0)
      << out;
  const int64_t at = resumed_step(out);
  ASSERT_GE(at, 5) << out;
  ASSERT_LT(at, 30) << "the kill came too late to test anything: " << out;
  EXPECT_TRUE(read_text(path("resumed.st")) == read_text(path("full.st")))
      << "resumed from " << at << ": weights differ from the uninterrupted run";
  // Only the last two checkpoints are kept.
  EXPECT_TRUE(fs::exists(path("ck/step_30/manifest.json")));
  EXPECT_TRUE(fs::exists(path("ck/step_25/manifest.json")));
  EXPECT_FALSE(fs::exists(path("ck/step_20")));
}

TEST_F(Resume, TwoRanksKilledAndResumedEqualUninterrupted) {
  const std::string args = kTrain + "--steps 24 --micro-batch 3 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--save-final full.st", &out), 0) << out;
  const int rc =
      run_and_kill(2, args + "--checkpoint-dir ck --checkpoint-every 4 --save-final resumed.st", "ck/step_4", &out);
  ASSERT_NE(rc, 0) << "a rank was SIGKILLed, the launcher must fail: " << out;
  ASSERT_FALSE(fs::exists(path("resumed.st")));
  ASSERT_EQ(run(2, args + "--checkpoint-dir ck --checkpoint-every 4 --resume --save-final resumed.st", &out), 0)
      << out;
  const int64_t at = resumed_step(out);
  ASSERT_GE(at, 4) << out;
  ASSERT_LT(at, 24) << "the kill came too late to test anything: " << out;
  EXPECT_TRUE(read_text(path("resumed.st")) == read_text(path("full.st")))
      << "2 ranks resumed from " << at << ": weights differ from the uninterrupted run";
}

TEST_F(Resume, LauncherRestartResumesFromTheCheckpoint) {
  // paratrain launch --max-restarts 1: a rank SIGKILLed right after the checkpoint of step 4,
  // the group restarts and continues from it without --resume on the command line.
  const std::string args = kTrain + "--steps 24 --micro-batch 3 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--save-final full.st", &out), 0) << out;
  const int rc = run_and_kill(2, args + "--checkpoint-dir ck --checkpoint-every 4 --save-final restarted.st",
                              "ck/step_4", &out, "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("PARATRAIN_TEST_STOP_AT_STEP: rank 1 stops itself (SIGSTOP) at step 4"), std::string::npos)
      << out;
  EXPECT_NE(out.find("restarts used: 1"), std::string::npos) << out;
  EXPECT_EQ(resumed_step(out), 4) << out;
  EXPECT_TRUE(read_text(path("restarted.st")) == read_text(path("full.st")))
      << "restarted from step 4: weights differ from the uninterrupted run";
}

TEST_F(Resume, RankKilledDuringTheFirstSaveRestartsFreshAndEqualsUninterrupted) {
  // Rank 0 writes every file without ZeRO: it dies with step_2's tensors written, before the
  // manifest. The restarted group finds only that incomplete checkpoint: warns, starts over.
  const std::string args = kTrain + "--steps 6 --micro-batch 2 --deterministic ";
  std::string out;
  ASSERT_EQ(run(2, args + "--save-final full.st", &out), 0) << out;
  const int rc = launch_with_kill_in_save(
      "0:2", args + "--checkpoint-dir ck --checkpoint-every 2 --save-final restarted.st", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[rank 0 train] warn: PARATRAIN_TEST_KILL_IN_SAVE: killing this rank while it saves step_2"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("restarts used: 1 of 1"), std::string::npos) << out;
  EXPECT_NE(out.find("warning: ignoring incomplete checkpoint ck/step_2 (no manifest.json: a save was interrupted); "
                     "no complete checkpoint, starting from step 0"),
            std::string::npos)
      << out;
  EXPECT_EQ(resumed_step(out), -1) << "nothing complete to resume from: " << out;
  EXPECT_TRUE(read_text(path("restarted.st")) == read_text(path("full.st")))
      << "the restarted run's weights differ from the uninterrupted run's";
  // The fresh run saved step_2 again over the leftover, then 4 and 6; the newest two remain.
  EXPECT_EQ(latest(), "step_6");
  EXPECT_TRUE(fs::exists(path("ck/step_4/manifest.json")));
  EXPECT_FALSE(fs::exists(path("ck/step_2")));
}

TEST_F(Resume, ZeroRankKilledDuringTheFirstSaveRestartsFreshAndEqualsUninterrupted) {
  // With --zero 1 rank 1 writes its own shard: it dies once the shard is on disk, so rank 0
  // never gets its checksum and writes no manifest.
  const std::string args = kTrain + "--steps 6 --micro-batch 2 --deterministic --zero 1 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--save-final full.st", &out), 0) << out;
  const int rc = launch_with_kill_in_save(
      "1:2", args + "--checkpoint-dir ck --checkpoint-every 2 --save-final restarted.st", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[rank 1 train] warn: PARATRAIN_TEST_KILL_IN_SAVE: killing this rank while it saves step_2"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("warning: ignoring incomplete checkpoint ck/step_2 "), std::string::npos) << out;
  EXPECT_NE(out.find("starting from step 0"), std::string::npos) << out;
  EXPECT_EQ(resumed_step(out), -1) << out;
  EXPECT_TRUE(read_text(path("restarted.st")) == read_text(path("full.st")))
      << "--zero 1: the restarted run's weights differ from the uninterrupted run's";
  EXPECT_EQ(latest(), "step_6");
}

TEST_F(Resume, KilledInALaterSaveResumesFromTheCompleteOneBeforeAndNamesTheIncomplete) {
  // One process, no launcher (the hook acts: no restart count). Killed in the save of
  // step_4: step_2 is complete, step_4 is not.
  const std::string args = kTrain + "--steps 6 --micro-batch 2 --checkpoint-dir ck --checkpoint-every 2 ";
  std::string out;
  ASSERT_EQ(run(0, kTrain + "--steps 6 --micro-batch 2 --save-final full.st", &out), 0) << out;
  Proc p = start({"env", "PARATRAIN_TEST_KILL_IN_SAVE=0:4", kBin, "train", "--model", "gpt-nano", "--data", "t.bin",
                  "--quiet", "--steps", "6", "--micro-batch", "2", "--checkpoint-dir", "ck", "--checkpoint-every", "2"},
                 dir_, path("killed.log"));
  ASSERT_EQ(wait_for(p, 60), -SIGKILL) << read_text(p.log);
  ASSERT_TRUE(fs::exists(path("ck/step_4/model.safetensors"))) << "the kill came before the files";
  ASSERT_FALSE(fs::exists(path("ck/step_4/manifest.json")));
  ASSERT_EQ(latest(), "step_2");
  ASSERT_EQ(run(0, args + "--resume --save-final resumed.st", &out), 0) << out;
  EXPECT_NE(out.find("warning: ignoring incomplete checkpoint ck/step_4 (no manifest.json: a save was interrupted)\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(resumed_step(out), 2) << out;
  EXPECT_TRUE(read_text(path("resumed.st")) == read_text(path("full.st")))
      << "resumed from step_2: weights differ from the uninterrupted run";
  EXPECT_TRUE(fs::exists(path("ck/step_4/manifest.json"))) << "the resumed run saves step_4 again";
  // A malformed hook is bad input: exit 2, nothing trained.
  Proc bad = start({"env", "PARATRAIN_TEST_KILL_IN_SAVE=zero", kBin, "train", "--model", "gpt-nano", "--data", "t.bin",
                    "--quiet", "--steps", "2", "--save-final", "x.st"},
                   dir_, path("bad.log"));
  EXPECT_EQ(wait_for(bad, 60), 2) << read_text(bad.log);
  EXPECT_NE(read_text(bad.log).find("PARATRAIN_TEST_KILL_IN_SAVE='zero' is not RANK:STEP"), std::string::npos)
      << read_text(bad.log);
  EXPECT_FALSE(fs::exists(path("x.st")));
}

TEST_F(Resume, TwoRanksResumeOntoThreeAtTheSameGlobalBatch) {
  // SGD: AdamW turns rounding noise of zero-gradient elements into full-size steps.
  const std::string args = kTrain + "--steps 12 --optimizer sgd --lr 0.1 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--micro-batch 3 --save-final full.st", &out), 0) << out;
  // 2 ranks x 3 stop after step 6 (SIGKILL once step_6 is saved) ...
  const int rc = run_and_kill(2, args + "--micro-batch 3 --checkpoint-dir ck --checkpoint-every 6", "ck/step_6", &out);
  ASSERT_NE(rc, 0) << "a rank was SIGKILLed, the launcher must fail: " << out;
  ASSERT_EQ(latest(), "step_6") << out;
  ASSERT_FALSE(fs::exists(path("ck/step_12"))) << out;
  // ... and 3 ranks x 2 continue: global batch 6 both times.
  ASSERT_EQ(run(3, args + "--micro-batch 2 --checkpoint-dir ck --resume --save-final three.st", &out), 0) << out;
  EXPECT_EQ(resumed_step(out), 6) << out;
  EXPECT_NE(out.find("saved by 2 ranks, now 3"), std::string::npos) << out;
  const double d = max_rel_diff(path("three.st"), path("full.st"));
  EXPECT_LT(d, 1e-6) << "3 ranks resumed from 2: relative difference " << d;
  // A different global batch is refused, naming both.
  ASSERT_EQ(run(3, args + "--micro-batch 3 --checkpoint-dir ck --resume", &out), 2) << out;
  EXPECT_NE(out.find("global batch"), std::string::npos) << out;
}

TEST_F(Resume, DamagedAndIncompleteCheckpointsAreNamedAndNothingIsLoaded) {
  const std::string args = kTrain + "--steps 6 --micro-batch 2 --checkpoint-dir ck --checkpoint-every 3 ";
  std::string out;
  // No checkpoint yet: a fresh start, said so.
  ASSERT_EQ(run(0, args + "--resume", &out), 0) << out;
  EXPECT_NE(out.find("no checkpoint in ck"), std::string::npos) << out;
  ASSERT_EQ(latest(), "step_6");
  // A different learning rate is refused, naming the setting.
  ASSERT_EQ(run(0, args + "--resume --lr 0.01", &out), 2) << out;
  EXPECT_NE(out.find("lr = "), std::string::npos) << out;

  // Flip one byte of the model's weights.
  const std::string model = path("ck/step_6/model.safetensors");
  const std::string good = read_text(model);
  {
    std::string bad = good;
    bad[bad.size() - 5] ^= 0x10;
    std::ofstream(model, std::ios::binary) << bad;
  }
  ASSERT_EQ(run(0, args + "--resume --save-final x.st", &out), 2) << out;
  EXPECT_NE(out.find("ck/step_6 is damaged"), std::string::npos) << out;
  EXPECT_NE(out.find("model.safetensors"), std::string::npos) << out;
  EXPECT_EQ(out.find("paratrain train:"), std::string::npos) << "training started: " << out;
  EXPECT_FALSE(fs::exists(path("x.st")));
  std::ofstream(model, std::ios::binary) << good;

  // Manifest missing: incomplete.
  fs::remove(path("ck/step_6/manifest.json"));
  ASSERT_EQ(run(0, args + "--resume --save-final x.st", &out), 2) << out;
  EXPECT_NE(out.find("ck/step_6 is incomplete"), std::string::npos) << out;
  EXPECT_NE(out.find("manifest.json"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(path("x.st")));
}

TEST_F(Resume, ZeroTwoRanksKilledAndResumedIsBitIdentical) {
  const std::string args = kTrain + "--steps 24 --micro-batch 3 --zero 1 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--save-final full.st", &out), 0) << out;
  const int rc =
      run_and_kill(2, args + "--checkpoint-dir ck --checkpoint-every 4 --save-final resumed.st", "ck/step_4", &out);
  ASSERT_NE(rc, 0) << "a rank was SIGKILLed, the launcher must fail: " << out;
  // Each rank saved its own shard, and the manifest lists both with their checksums.
  const std::string manifest = read_text(path("ck/step_4/manifest.json"));
  for (const char* shard : {"optim.rank0-of-2.safetensors", "optim.rank1-of-2.safetensors"}) {
    EXPECT_TRUE(fs::exists(path(std::string("ck/step_4/") + shard))) << shard;
    EXPECT_NE(manifest.find(shard), std::string::npos) << manifest;
  }
  EXPECT_FALSE(fs::exists(path("ck/step_4/optim.safetensors")));
  ASSERT_EQ(run(2, args + "--checkpoint-dir ck --checkpoint-every 4 --resume --save-final resumed.st", &out), 0)
      << out;
  const int64_t at = resumed_step(out);
  ASSERT_GE(at, 4) << out;
  ASSERT_LT(at, 24) << "the kill came too late to test anything: " << out;
  EXPECT_TRUE(read_text(path("resumed.st")) == read_text(path("full.st")))
      << "--zero 1 on 2 ranks resumed from " << at << ": weights differ from the uninterrupted run";
}

TEST_F(Resume, ZeroShardsAreReCutForThreeRanksAndAssembledForOne) {
  // SGD: the ranks' sums round differently (see TwoRanksResumeOntoThreeAtTheSameGlobalBatch).
  const std::string args = kTrain + "--steps 12 --optimizer sgd --lr 0.1 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--micro-batch 3 --save-final full.st", &out), 0) << out;
  ASSERT_EQ(run(2, args + "--micro-batch 3 --zero 1 --checkpoint-dir ck --checkpoint-every 6", &out), 0) << out;
  // Back to step 6, twice (each resume continues from there).
  fs::remove_all(path("ck/step_12"));
  std::ofstream(path("ck/latest")) << "step_6\n";
  fs::copy(path("ck"), path("ck1"), fs::copy_options::recursive);
  // 3 ranks x 2 with --zero 2: the 2 shards are assembled and cut in 3.
  ASSERT_EQ(run(3, args + "--micro-batch 2 --zero 2 --checkpoint-dir ck --resume --save-final three.st", &out), 0)
      << out;
  EXPECT_EQ(resumed_step(out), 6) << out;
  EXPECT_NE(out.find("saved by 2 ranks, now 3, optimizer state from 2 shard(s), re-cut"), std::string::npos) << out;
  double d = max_rel_diff(path("three.st"), path("full.st"));
  EXPECT_LT(d, 1e-6) << "3 ranks (--zero 2) resumed from 2 shards: relative difference " << d;
  EXPECT_TRUE(fs::exists(path("ck/step_12/optim.rank2-of-3.safetensors")));
  // One process without ZeRO: the whole state.
  ASSERT_EQ(run(0, args + "--micro-batch 6 --checkpoint-dir ck1 --resume --save-final one.st", &out), 0) << out;
  EXPECT_NE(out.find("resuming from ck1/step_6"), std::string::npos) << out;
  d = max_rel_diff(path("one.st"), path("full.st"));
  EXPECT_LT(d, 1e-6) << "one process resumed from 2 shards: relative difference " << d;
}

TEST_F(Resume, ZeroDamagedOrMissingShardIsNamedAndNothingIsTrained) {
  const std::string args = kTrain + "--steps 4 --micro-batch 2 --zero 1 --checkpoint-dir ck --checkpoint-every 2 ";
  std::string out;
  ASSERT_EQ(run(2, args, &out), 0) << out;
  const std::string shard = path("ck/step_4/optim.rank1-of-2.safetensors");
  std::string bytes = read_text(shard);
  bytes[bytes.size() - 3] ^= 0x10;
  std::ofstream(shard, std::ios::binary) << bytes;
  // One process at the same global batch (2 x 2): the run stops before training, naming the shard.
  ASSERT_EQ(run(0, kTrain + "--steps 4 --micro-batch 4 --zero 1 --checkpoint-dir ck --resume --save-final x.st", &out),
            2)
      << out;
  EXPECT_NE(out.find("checkpoint ck/step_4 is damaged: optim.rank1-of-2.safetensors fails its checksum"),
            std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line: " << out;
  EXPECT_EQ(out.find("paratrain train:"), std::string::npos) << "training started: " << out;
  EXPECT_FALSE(fs::exists(path("x.st")));
  // The same on 2 ranks (each rank verifies every shard).
  ASSERT_EQ(run(2, args + "--resume", &out), 2) << out;
  EXPECT_NE(out.find("optim.rank1-of-2.safetensors fails its checksum"), std::string::npos) << out;
  // A missing shard: incomplete.
  fs::remove(shard);
  ASSERT_EQ(run(0, kTrain + "--steps 4 --micro-batch 4 --checkpoint-dir ck --resume", &out), 2) << out;
  EXPECT_NE(out.find("checkpoint ck/step_4 is incomplete: optim.rank1-of-2.safetensors is missing"), std::string::npos)
      << out;
}

// Tensor parallelism: each tp rank saves its part of the model (model.tp<I>-of-2) with its
// optimizer state; a load assembles the whole state and cuts it for the new layout. Killed
// after step 4, a tp 2 run resumed as tp 2 ends bit-identical to the uninterrupted run; as
// dp 2 (and as dp 2 x tp 2 with ZeRO 1, tp 4, and one process) its losses and weights agree to
// rounding: the layouts sum in another order. AdamW with eps 1e-6: see
// tests/parallel/tensor_parallel_train_test.cpp on AdamW and rounding noise.
TEST_F(Resume, TensorParallelKilledAndResumedAsTp2Dp2Tp4ZeroAndOneProcess) {
  const std::string args = kTrain + "--steps 12 --n-head 4 --eps 1e-6 --checkpoint-every 4 ";
  const std::string tp2 = args + "--micro-batch 4 --tp 2 ";
  std::string out;
  ASSERT_EQ(run(2, tp2 + "--checkpoint-dir full_ck --save-final full.st --metrics full.jsonl", &out), 0) << out;
  EXPECT_TRUE(fs::exists(path("full_ck/step_12/model.tp0-of-2.safetensors")));
  EXPECT_TRUE(fs::exists(path("full_ck/step_12/model.tp1-of-2.safetensors")));
  EXPECT_FALSE(fs::exists(path("full_ck/step_12/model.safetensors")));
  ASSERT_NE(run_and_kill(2, tp2 + "--checkpoint-dir ck", "ck/step_4", &out), 0) << out;
  ASSERT_EQ(latest(), "step_4") << out;
  for (const char* later : {"ck/step_8", "ck/step_12"}) ASSERT_FALSE(fs::exists(path(later))) << later << "\n" << out;
  for (const char* copy : {"ck_dp2", "ck_zero", "ck_one", "ck_tp4"})
    fs::copy(path("ck"), path(copy), fs::copy_options::recursive);

  auto losses = [&](const std::string& metrics) {
    std::vector<double> l;
    std::ifstream f(path(metrics));
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("eval")) l.push_back(j["loss"].get<double>());
    }
    return l;
  };
  const std::vector<double> full = losses("full.jsonl");
  ASSERT_EQ(full.size(), 12u);
  auto expect_resumed = [&](const std::string& name, double tol) {
    const std::vector<double> l = losses(name + ".jsonl");
    ASSERT_EQ(l.size(), 8u) << name << ": steps 5..12";
    for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l[i], full[4 + i], tol * full[4 + i]) << name << " step " << i + 5;
    const double d = max_rel_diff(path(name + ".st"), path("full.st"));
    std::printf("  resumed as %s: weights within %.2e of the uninterrupted tp 2 run\n", name.c_str(), d);
    EXPECT_LE(d, tol) << name;
  };
  ASSERT_EQ(run(2, tp2 + "--checkpoint-dir ck --resume --save-final tp2.st --metrics tp2.jsonl", &out), 0) << out;
  EXPECT_EQ(resumed_step(out), 4) << out;
  EXPECT_TRUE(read_text(path("tp2.st")) == read_text(path("full.st"))) << "tp 2 resumed as tp 2 is not bit-identical";
  expect_resumed("tp2", 0.0);
  ASSERT_EQ(run(2, args + "--micro-batch 2 --checkpoint-dir ck_dp2 --resume --save-final dp2.st --metrics dp2.jsonl", &out), 0)
      << out;
  expect_resumed("dp2", 1e-5);
  ASSERT_EQ(run(4, args + "--micro-batch 2 --tp 2 --zero 1 --checkpoint-dir ck_zero --resume --save-final zero.st "
                          "--metrics zero.jsonl", &out, 120), 0)
      << out;
  expect_resumed("zero", 1e-5);
  // dp 2 x tp 2 with ZeRO wrote ZeRO pieces of tensor-parallel parts; they resume onto tp 2.
  EXPECT_TRUE(fs::exists(path("ck_zero/step_12/optim.rank3-of-4.safetensors")));
  ASSERT_EQ(run(0, args + "--micro-batch 4 --checkpoint-dir ck_one --resume --save-final one.st --metrics one.jsonl", &out), 0)
      << out;
  expect_resumed("one", 1e-5);
  ASSERT_EQ(run(4, args + "--micro-batch 4 --tp 4 --checkpoint-dir ck_tp4 --resume --save-final tp4.st --metrics tp4.jsonl",
                &out, 120), 0)
      << out;
  expect_resumed("tp4", 1e-5);
  fs::remove_all(path("ck_zero/step_12"));
  std::ofstream(path("ck_zero/latest")) << "step_8\n";
  ASSERT_EQ(run(2, tp2 + "--checkpoint-dir ck_zero --resume --save-final back.st", &out), 0) << out;
  EXPECT_NE(out.find("optimizer state from 4 shard(s)"), std::string::npos) << out;
  EXPECT_LT(max_rel_diff(path("back.st"), path("full.st")), 1e-5);
}

TEST_F(Resume, ZeroThreeKilledAndResumedIsBitIdenticalAndNoRankWritesTheWholeModel) {
  const std::string args = kTrain + "--steps 16 --micro-batch 3 --grad-accum 2 --grad-clip 0.5 --zero 3 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--save-final full.st", &out), 0) << out;
  const int rc =
      run_and_kill(2, args + "--checkpoint-dir ck --checkpoint-every 4 --save-final resumed.st", "ck/step_4", &out);
  ASSERT_NE(rc, 0) << "a rank was SIGKILLed, the launcher must fail: " << out;
  // Each rank's shard holds its pieces of the parameters and of the optimizer state; there is
  // no whole model file.
  EXPECT_FALSE(fs::exists(path("ck/step_4/model.safetensors")));
  const std::string manifest = read_text(path("ck/step_4/manifest.json"));
  EXPECT_NE(manifest.find("\"model_in_shards\": true"), std::string::npos) << manifest;
  for (const char* shard : {"optim.rank0-of-2.safetensors", "optim.rank1-of-2.safetensors"}) {
    const std::string file = path(std::string("ck/step_4/") + shard);
    ASSERT_TRUE(fs::exists(file)) << shard;
    size_t model_pieces = 0;
    for (const auto& [name, t] : checkpoint::load_safetensors(file)) model_pieces += name.rfind("model/", 0) == 0;
    EXPECT_GE(model_pieces, 4u) << shard << " holds too few pieces of the parameters";
  }
  ASSERT_EQ(run(2, args + "--checkpoint-dir ck --checkpoint-every 4 --resume --save-final resumed.st", &out), 0)
      << out;
  const int64_t at = resumed_step(out);
  ASSERT_GE(at, 4) << out;
  ASSERT_LT(at, 16) << "the kill came too late to test anything: " << out;
  EXPECT_TRUE(read_text(path("resumed.st")) == read_text(path("full.st")))
      << "--zero 3 on 2 ranks resumed from " << at << ": weights differ from the uninterrupted run";
}

TEST_F(Resume, ZeroThreeResumesAsZeroOneOnThreeAndAsOneProcessAndZeroZeroResumesAsZeroThree) {
  // SGD: the ranks' sums round differently (see TwoRanksResumeOntoThreeAtTheSameGlobalBatch).
  const std::string args = kTrain + "--steps 12 --optimizer sgd --lr 0.1 --momentum 0.9 ";
  std::string out;
  ASSERT_EQ(run(2, args + "--micro-batch 3 --save-final full.st", &out), 0) << out;
  ASSERT_EQ(run(2, args + "--micro-batch 3 --zero 3 --checkpoint-dir ck --checkpoint-every 6", &out), 0) << out;
  fs::remove_all(path("ck/step_12"));
  std::ofstream(path("ck/latest")) << "step_6\n";
  fs::copy(path("ck"), path("ck1"), fs::copy_options::recursive);
  ASSERT_EQ(run(3, args + "--micro-batch 2 --zero 1 --checkpoint-dir ck --resume --save-final three.st", &out), 0)
      << out;
  EXPECT_EQ(resumed_step(out), 6) << out;
  EXPECT_NE(out.find("saved by 2 ranks, now 3"), std::string::npos) << out;
  double d = max_rel_diff(path("three.st"), path("full.st"));
  EXPECT_LT(d, 1e-6) << "ZeRO 3 on 2 ranks resumed as ZeRO 1 on 3: relative difference " << d;
  ASSERT_EQ(run(0, args + "--micro-batch 6 --checkpoint-dir ck1 --resume --save-final one.st", &out), 0) << out;
  d = max_rel_diff(path("one.st"), path("full.st"));
  EXPECT_LT(d, 1e-6) << "ZeRO 3 on 2 ranks resumed as one process: relative difference " << d;
  // And the other way: a plain data-parallel checkpoint resumes onto ZeRO 3 on 3 ranks.
  ASSERT_EQ(run(2, args + "--micro-batch 3 --checkpoint-dir ck0 --checkpoint-every 6", &out), 0) << out;
  fs::remove_all(path("ck0/step_12"));
  std::ofstream(path("ck0/latest")) << "step_6\n";
  ASSERT_EQ(run(3, args + "--micro-batch 2 --zero 3 --checkpoint-dir ck0 --resume --save-final z3.st", &out), 0) << out;
  EXPECT_NE(out.find("resuming from ck0/step_6"), std::string::npos) << out;
  d = max_rel_diff(path("z3.st"), path("full.st"));
  EXPECT_LT(d, 1e-6) << "plain DP on 2 ranks resumed as ZeRO 3 on 3: relative difference " << d;
}

TEST_F(Resume, ZeroThreeWithTensorParallelismSavesLocalPiecesAndResumesAsTp2AndOneProcess) {
  // dp 2 x tp 2 with ZeRO 3: each rank's shard holds pieces of its tensor-parallel slice.
  const std::string args = kTrain + "--steps 8 --n-head 4 --optimizer sgd --lr 0.1 --momentum 0.9 ";
  std::string out;
  ASSERT_EQ(run(4, args + "--micro-batch 2 --tp 2 --save-final full.st", &out, 120), 0) << out;
  ASSERT_EQ(run(4, args + "--micro-batch 2 --tp 2 --zero 3 --checkpoint-dir ck --checkpoint-every 4", &out, 120), 0)
      << out;
  EXPECT_FALSE(fs::exists(path("ck/step_4/model.safetensors")));
  EXPECT_FALSE(fs::exists(path("ck/step_4/model.tp0-of-2.safetensors")));
  EXPECT_TRUE(fs::exists(path("ck/step_4/optim.rank3-of-4.safetensors")));
  fs::remove_all(path("ck/step_8"));
  std::ofstream(path("ck/latest")) << "step_4\n";
  fs::copy(path("ck"), path("ck1"), fs::copy_options::recursive);
  ASSERT_EQ(run(2, args + "--micro-batch 4 --tp 2 --checkpoint-dir ck --resume --save-final tp2.st", &out, 120), 0)
      << out;
  EXPECT_EQ(resumed_step(out), 4) << out;
  double d = max_rel_diff(path("tp2.st"), path("full.st"));
  EXPECT_LT(d, 1e-5) << "dp 2 x tp 2 ZeRO 3 resumed as tp 2: relative difference " << d;
  ASSERT_EQ(run(0, args + "--micro-batch 4 --checkpoint-dir ck1 --resume --save-final one.st", &out), 0) << out;
  d = max_rel_diff(path("one.st"), path("full.st"));
  EXPECT_LT(d, 1e-5) << "dp 2 x tp 2 ZeRO 3 resumed as one process: relative difference " << d;
}

}  // namespace
