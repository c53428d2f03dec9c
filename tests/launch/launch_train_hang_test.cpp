// The launcher's hang reports on real training runs (`paratrain launch -- paratrain train`,
// gpt-nano, 2 ranks): a rank stopped with SIGSTOP mid-run (PARATRAIN_TEST_STOP_AT_STEP) and a
// rank whose DDP skips one bucket's all-reduce (PARATRAIN_TEST_SKIP_ALLREDUCE). The table
// names the rank and the collective the other waits in, the run exits non-zero, the dumps
// are on disk. Every process has a deadline: the launcher runs under finish()'s timeout, the
// ranks under --hang-timeout and PARATRAIN_COMM_TIMEOUT_S, and a guard SIGKILLs (and
// SIGCONTs) every process of the run that is left, on every path out of a test.
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch/launch_test_util.h"

using namespace paratrain::launch::testing;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The processes whose environment holds `needle` (each rank gets PARATRAIN_FR_DUMP_DIR=<dir>).
std::vector<pid_t> processes_with_env(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == ::getpid()) continue;
    std::string env = slurp("/proc/" + std::string(e->d_name) + "/environ");
    for (size_t at = 0; at < env.size();) {
      size_t z = env.find('\0', at);
      if (z == std::string::npos) z = env.size();
      if (env.compare(at, z - at, needle) == 0) {
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
      at = z + 1;
    }
  }
  ::closedir(d);
  return out;
}

// A run's directory (--log-dir, the ranks' PARATRAIN_FR_DUMP_DIR) and, when it goes out of
// scope, no process of the run left: SIGKILL then SIGCONT (a stopped rank dies either way).
class RunDir {
 public:
  explicit RunDir(const std::string& tag) {
    std::string t = (fs::temp_directory_path() / ("pt_train_hang_" + tag + "_XXXXXX")).string();
    if (::mkdtemp(t.data())) dir_ = t;
  }
  ~RunDir() {
    kill_leftovers();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  const std::string& path() const { return dir_; }
  // Kills what is left of the run; returns how many processes were left.
  size_t kill_leftovers() const {
    if (dir_.empty()) return 0;
    auto pids = processes_with_env("PARATRAIN_FR_DUMP_DIR=" + dir_);
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      ::kill(p, SIGCONT);
    }
    return pids.size();
  }

 private:
  std::string dir_;
};

// A token file of n tokens (llm.c .bin: 256 int32 header, then uint16 tokens).
void write_tokens(const std::string& path, int64_t n) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = static_cast<int32_t>(n);
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>((i * 7 + i / 13) % 256);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(n * 2));
}

// `paratrain launch --nproc-per-node 2 --hang-timeout 3 -- paratrain train --model gpt-nano
// --backend B` with extra environment; the launcher's deadline is 90 s (the run takes a few seconds).
RunResult train_under_launch(const RunDir& dir, const std::string& backend, const std::vector<std::string>& env) {
  const std::string data = dir.path() + "/tokens.bin";
  write_tokens(data, 20000);
  std::vector<std::string> e = {"PARATRAIN_COMM_TIMEOUT_S=30", "PARATRAIN_PEER_TIMEOUT_S=30", "PARATRAIN_THREADS=1"};
  e.insert(e.end(), env.begin(), env.end());
  return run({PARATRAIN_BIN, "launch", "--nproc-per-node", "2", "--hang-timeout", "3", "--grace-period", "1",
              "--log-dir", dir.path(), "--", PARATRAIN_BIN, "train", "--model", "gpt-nano", "--steps", "50",
              "--micro-batch", "2", "--data", data, "--backend", backend, "--quiet"},
             90, e);
}

nlohmann::json dump_of(const RunDir& dir, int rank) {
  return nlohmann::json::parse(slurp(dir.path() + "/rank_" + std::to_string(rank) + ".fr.json"));
}

// The dump of `rank` shows it waiting in an all-reduce of the group named `group`.
void expect_waits_in_allreduce(const nlohmann::json& dump, int rank, const std::string& group) {
  EXPECT_EQ(dump["rank"], rank);
  bool found = false;
  for (const auto& g : dump["groups"]) {
    if (g["name"] != group) continue;
    found = true;
    ASSERT_FALSE(g["pending"].empty()) << dump.dump();
    EXPECT_EQ(g["pending"][0]["op"], "allreduce") << dump.dump();
  }
  EXPECT_TRUE(found) << "no group " << group << " in " << dump.dump();
}

void run_stopped_rank(const std::string& backend) {
  RunDir dir("stop_" + backend);
  ASSERT_FALSE(dir.path().empty());
  auto r = train_under_launch(dir, backend, {"PARATRAIN_TEST_STOP_AT_STEP=1:3"});
  EXPECT_EQ(dir.kill_leftovers(), 0u) << "processes of the run were left behind";
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("PARATRAIN_TEST_STOP_AT_STEP: rank 1 stops itself (SIGSTOP) at step 3"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("2 ranks (" + backend + ")"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the job is hung: no collective advanced on any rank for"), std::string::npos) << r.err;
  // The table's row of rank 1, and the verdict: rank 1 never called the all-reduce rank 0 waits in.
  EXPECT_NE(r.err.find("stopped (SIGSTOP)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("verdict: rank 1 never called allreduce #"), std::string::npos) << r.err;
  // DDP's all-reduces run in the data-parallel group (world/0).
  EXPECT_NE(r.err.find("(group world/0); rank 0 waits for it since"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(it is stopped (SIGSTOP))"), std::string::npos) << r.err;
  expect_waits_in_allreduce(dump_of(dir, 0), 0, "world/0");
  EXPECT_TRUE(fs::exists(dir.path() + "/flight_report.txt"));
}

TEST(LaunchTrainHang, AStoppedRankIsNamedWithTheAllreduceTheOtherWaitsIn) { run_stopped_rank("shm"); }

TEST(LaunchTrainHang, AStoppedRankIsNamedOverTcp) { run_stopped_rank("tcp"); }

TEST(LaunchTrainHang, ARankThatSkipsAnAllreduceIsNamed) {
  RunDir dir("skip");
  ASSERT_FALSE(dir.path().empty());
  auto r = train_under_launch(dir, "shm", {"PARATRAIN_TEST_SKIP_ALLREDUCE=1:2"});
  EXPECT_EQ(dir.kill_leftovers(), 0u) << "processes of the run were left behind";
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("PARATRAIN_TEST_SKIP_ALLREDUCE: rank 1 skips the all-reduce of its first bucket"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the job is hung: no collective advanced on any rank for"), std::string::npos) << r.err;
  // Rank 1 went on to the step report's allgather (group world) that rank 0 never reaches.
  EXPECT_NE(r.err.find("verdict: rank 1 never called allreduce #"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(group world/0); rank 0 waits for it since"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("verdict: rank 0 never called allgather #"), std::string::npos) << r.err;
  expect_waits_in_allreduce(dump_of(dir, 0), 0, "world/0");
  const auto d1 = dump_of(dir, 1);  // rank 1 answered too: it waits in the world's allgather (and queued more)
  EXPECT_EQ(d1["rank"], 1);
  bool waits_in_allgather = false;
  for (const auto& g : d1["groups"])
    if (g["name"] == "world" && !g["pending"].empty() && g["pending"][0]["op"] == "allgather") waits_in_allgather = true;
  EXPECT_TRUE(waits_in_allgather) << d1.dump();
  EXPECT_TRUE(fs::exists(dir.path() + "/flight_report.txt"));
}

}  // namespace
