// Failures under the launcher: a rank that exits 3, a rank killed by SIGKILL, a rank that
// ignores SIGTERM, the launcher interrupted or killed, a node that never arrives, restarts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "launch/launch_test_util.h"

namespace paratrain::launch {
namespace {

using namespace paratrain::launch::testing;
namespace fs = std::filesystem;

const std::string kLauncher = std::string(PARATRAIN_TEST_BIN_DIR) + "/launch_main_helper";
const std::string kRank = std::string(PARATRAIN_TEST_BIN_DIR) + "/rank_helper";

std::string temp_dir(const std::string& tag) {
  std::string t = (fs::temp_directory_path() / ("pt_launch_" + tag + "_XXXXXX")).string();
  return ::mkdtemp(t.data()) ? t : std::string();
}

// Waits until dir holds n rank_*.pid files; returns the pids (empty on timeout).
std::vector<pid_t> wait_pids(const std::string& dir, int n, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      std::ifstream f(dir + "/rank_" + std::to_string(r) + ".pid");
      int pid = 0;
      if (f >> pid) pids.push_back(pid);
    }
    if (static_cast<int>(pids.size()) == n) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

// How many times `what` occurs in `text`.
int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

bool all_gone(const std::vector<pid_t>& pids, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (pid_t p : pids) any = any || alive(p);
    if (!any) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The ranks meet in the launcher's store (--store) before rank 1 starts its delay: every rank
// has written its pid file by then, so none is stopped before it could.
TEST(LaunchFailure, RankExitingThreeStopsTheOthersAndIsTheExitCode) {
  std::string dir = temp_dir("exit3");
  auto r = run({kLauncher, "--nproc-per-node", "4", "--grace-period", "3", "--", kRank, "--pid-dir", dir,
                "--store", "--fail-rank", "1", "--fail-delay", "0.3", "--code", "3", "--sleep", "60"},
               30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find("summary: rank 1 (node 0, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed with exit code 3; exit code 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("* 1 "), std::string::npos) << r.err;  // the first failure is marked
  // The other three (asleep for 60 s) ended by the SIGTERM, within the grace period: none
  // needed the SIGKILL that follows it. Judged by how each rank ended, not by the clock.
  EXPECT_EQ(count_of(r.err, "stopped by SIGTERM"), 3) << r.err;
  EXPECT_EQ(r.err.find("by SIGKILL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[1] rank 1 failing on purpose"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarts used: 0 of 0"), std::string::npos) << r.err;
  auto pids = wait_pids(dir, 4, 1);
  ASSERT_EQ(pids.size(), 4u);
  for (pid_t p : pids) EXPECT_NE(r.err.find(" " + std::to_string(p) + " "), std::string::npos) << "pid in table";
  EXPECT_TRUE(all_gone(pids, 2));
  fs::remove_all(dir);
}

// --store: every rank ignores SIGTERM before rank 0 starts its delay.
TEST(LaunchFailure, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  auto r = run({kLauncher, "--nproc-per-node", "3", "--grace-period", "1", "--", kRank, "--ignore-term", "--store",
                "--fail-rank", "0", "--fail-delay", "0.2", "--code", "5", "--sleep", "60"},
               30);
  ASSERT_FALSE(r.timed_out) << r.err;  // the ranks sleep 60 s: only the SIGKILL ends them in time
  EXPECT_EQ(r.status, 5) << r.err;
  // The two that ignore SIGTERM got the SIGKILL, and not before the grace period (a lower
  // bound: the launcher's run starts after ours and its grace period after rank 0 failed).
  EXPECT_EQ(count_of(r.err, "stopped by SIGKILL"), 2) << r.err;
  EXPECT_GE(r.seconds, 0.2 + 1.0);
}

TEST(LaunchFailure, RankKilledBySigkill) {
  auto r = run({kLauncher, "--nproc-per-node", "2", "--grace-period", "2", "--", kRank, "--fail-rank", "1",
                "--fail-delay", "0.2", "--kill", "--sleep", "60"},
               30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status, 128 + 9) << r.err;
  EXPECT_NE(r.err.find("failed with signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by SIGKILL"), std::string::npos) << r.err;
  EXPECT_EQ(count_of(r.err, "stopped by SIGTERM"), 1) << "the other rank, stopped at once: " << r.err;
}

TEST(LaunchFailure, LauncherKilledBySigkillLeavesNoChild) {
  std::string dir = temp_dir("orphans");
  Proc p = start({kLauncher, "--nproc-per-node", "3", "--", kRank, "--pid-dir", dir, "--sleep", "60"});
  auto pids = wait_pids(dir, 3, 10);
  ASSERT_EQ(pids.size(), 3u);
  for (pid_t c : pids) EXPECT_TRUE(alive(c));
  ::kill(p.pid, SIGKILL);
  auto r = finish(p, 10);
  EXPECT_EQ(r.status, 128 + 9);
  EXPECT_TRUE(all_gone(pids, 5)) << "a rank survived its launcher";
  fs::remove_all(dir);
}

TEST(LaunchFailure, SigintIsForwardedToEveryRank) {
  std::string dir = temp_dir("sigint");
  Proc p = start({kLauncher, "--nproc-per-node", "2", "--grace-period", "5", "--", kRank, "--pid-dir", dir, "--sleep",
                  "60"});
  auto pids = wait_pids(dir, 2, 10);
  ASSERT_EQ(pids.size(), 2u);
  ::kill(p.pid, SIGINT);
  auto r = finish(p, 20);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status, 130) << r.err;
  EXPECT_NE(r.err.find("received SIGINT"), std::string::npos) << r.err;
  // Both ranks died of the forwarded SIGINT, not of the SIGKILL after the grace period.
  EXPECT_EQ(count_of(r.err, "stopped by SIGINT"), 2) << r.err;
  EXPECT_EQ(r.err.find("by SIGKILL"), std::string::npos) << r.err;
  EXPECT_TRUE(all_gone(pids, 2));
  fs::remove_all(dir);
}

TEST(LaunchFailure, NodeThatNeverArrivesIsNamed) {
  int port = free_port();
  auto r = run({kLauncher, "--nnodes", "3", "--node-rank", "0", "--master-port", std::to_string(port), "--rdzv-timeout",
                "1", "--", kRank},
               20, {"PARATRAIN_TOKEN=t0k"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("rendezvous failed: nodes 1, 2 of 3 did not arrive within 1 s"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 1.0) << "gave up before its --rdzv-timeout";
  // A non-master node whose master never comes.
  auto s = run({kLauncher, "--nnodes", "2", "--node-rank", "1", "--master-port", std::to_string(free_port()),
                "--rdzv-timeout", "1", "--", kRank},
               20, {"PARATRAIN_TOKEN=t0k"});
  ASSERT_FALSE(s.timed_out) << s.err;
  EXPECT_EQ(s.status, 1) << s.err;
  EXPECT_NE(s.err.find("rendezvous failed: node 0"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("did not arrive within 1 s"), std::string::npos) << s.err;
  EXPECT_GE(s.seconds, 1.0) << "gave up before its --rdzv-timeout";
}

TEST(LaunchFailure, RestartSucceedsOnTheSecondAttempt) {
  std::string dir = temp_dir("restart");
  auto r = run({kLauncher, "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", dir, "--", kRank, "--env",
                "--store", "--fail-rank", "1", "--code", "4", "--only-first-attempt", "--fail-delay", "0.2",
                "--sleep", "0.5"},
               30, {"PARATRAIN_TOKEN="});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("restarting the group (restart 1 of 2)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("every rank succeeded; restarts used: 1 of 2"), std::string::npos) << r.err;
  // Both attempts printed their variables: restart count 0 then 1, the same token.
  std::set<std::string> tokens;
  int second = 0;
  for (auto& l : lines_with(r.out, "[")) {
    if (l.find("PARATRAIN_TOKEN=") != std::string::npos) tokens.insert(l.substr(l.find('=') + 1));
    second += l.find("TORCHELASTIC_RESTART_COUNT=1") != std::string::npos;
  }
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_EQ(second, 2);
  // Each attempt met in a fresh store: arrivals count 1..2 again, never 3 or 4.
  int store_ok = 0;
  for (auto& l : lines_with(r.out, "[")) {
    store_ok += l.find("STORE_OK world=2") != std::string::npos;
    EXPECT_EQ(l.find("arrived_at=3"), std::string::npos) << l;
    EXPECT_EQ(l.find("arrived_at=4"), std::string::npos) << l;
  }
  EXPECT_EQ(store_ok, 4) << r.out;
  std::ifstream f(dir + "/rank_1.log");
  std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("--- paratrain launch: restart 1 ---"), std::string::npos);
  fs::remove_all(dir);
}

TEST(LaunchFailure, RestartsRunOut) {
  auto r = run({kLauncher, "--nproc-per-node", "2", "--max-restarts", "1", "--", kRank, "--fail-rank", "0", "--code",
                "6"},
               30);
  EXPECT_EQ(r.status, 6) << r.err;
  EXPECT_NE(r.err.find("restarts used: 1 of 1"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace paratrain::launch
