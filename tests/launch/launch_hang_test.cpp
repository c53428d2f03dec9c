// The launcher's flight-recorder report (--hang-timeout, a failure, kill -USR1): 3 real ranks
// (hang_helper); the table and the verdict name the rank that never arrived and the rank
// that called another op; the dumps stay on disk. Every process has a deadline.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "launch/launch_test_util.h"

using namespace paratrain::launch::testing;
namespace fs = std::filesystem;

namespace {

const std::string kLauncher = std::string(PARATRAIN_TEST_BIN_DIR) + "/launch_main_helper";
const std::string kHang = std::string(PARATRAIN_TEST_BIN_DIR) + "/hang_helper";

std::string temp_dir(const std::string& tag) {
  std::string t = (fs::temp_directory_path() / ("pt_hang_" + tag + "_XXXXXX")).string();
  return ::mkdtemp(t.data()) ? t : std::string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool wait_for(const std::function<bool()>& ok, double timeout_s) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ok();
}

const std::vector<std::string> kEnv = {"PARATRAIN_BACKEND=shm", "PARATRAIN_COMM_TIMEOUT_S=60"};

TEST(LaunchHang, ARankThatSkipsAnAllreduceIsNamedAndTheJobStops) {
  std::string dir = temp_dir("skip");
  auto r = run({kLauncher, "--nproc-per-node", "3", "--hang-timeout", "3", "--grace-period", "1", "--log-dir", dir,
                "--", kHang, "skip"},
               60, kEnv);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("the job is hung: no collective advanced on any rank for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("flight recorder report"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("verdict: rank 2 never called allreduce #3 (group world); ranks 0,1 wait for it since"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("it is outside any collective of this group; its last completed is allreduce #2"),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    auto j = nlohmann::json::parse(slurp(dir + "/rank_" + std::to_string(rank) + ".fr.json"));
    EXPECT_EQ(j["rank"], rank);
    EXPECT_EQ(j["groups"][0]["last_completed"]["seq"], 2) << rank;
    EXPECT_EQ(j["groups"][0]["pending"].size(), rank == 2 ? 0u : 1u) << rank;
  }
  EXPECT_TRUE(fs::exists(dir + "/flight_report.txt"));
  fs::remove_all(dir);
}

TEST(LaunchHang, ARankCallingAnotherOpIsNamedAsAMismatch) {
  std::string dir = temp_dir("mismatch");
  auto r = run({kLauncher, "--nproc-per-node", "3", "--hang-timeout", "3", "--grace-period", "1", "--log-dir", dir,
                "--", kHang, "mismatch"},
               60, kEnv);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("verdict: mismatch in group world at its collective 3: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 called broadcast #3 (f32 x 16, root 0)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ranks 0,2 called allreduce #3 (f32 x 16)"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(LaunchHang, Usr1ToTheLauncherPrintsTheTableAndTheJobGoesOn) {
  std::string dir = temp_dir("usr1");
  Proc p = start({kLauncher, "--nproc-per-node", "3", "--log-dir", dir, "--", kHang, "loop"}, kEnv);
  ASSERT_GT(p.pid, 0);
  bool up = wait_for(
      [&] {
        for (int rank = 0; rank < 3; ++rank)
          if (!fs::exists(dir + "/rank_" + std::to_string(rank) + ".fr.progress")) return false;
        return true;
      },
      30);
  if (up) ::kill(p.pid, SIGUSR1);
  bool reported = up && wait_for([&] { return fs::exists(dir + "/flight_report.txt"); }, 20);
  { std::ofstream(dir + "/stop") << "stop\n"; }
  auto r = finish(p, 60);
  ASSERT_TRUE(up) << r.err;
  ASSERT_TRUE(reported) << r.err;
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status, 0) << r.err;  // the job went on and finished
  EXPECT_NE(r.err.find("flight recorder report (the launcher received SIGUSR1; the job goes on)"), std::string::npos)
      << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    auto j = nlohmann::json::parse(slurp(dir + "/rank_" + std::to_string(rank) + ".fr.json"));
    EXPECT_EQ(j["reason"], "sigusr1");
    EXPECT_NE(r.err.find("  " + std::to_string(rank) + "     "), std::string::npos) << r.err;  // its row
  }
  EXPECT_NE(r.err.find("dump (sigusr1)"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
