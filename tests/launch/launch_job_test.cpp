// Jobs under the launcher: 1, 2 and 4 ranks with every variable checked, the store the
// ranks meet through, output prefixing, log files, bad usage, start-up overhead.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "launch/launch_test_util.h"
#include "paratrain/launch/host.h"
#include "paratrain/launch/launcher.h"

namespace paratrain::launch {
namespace {

using namespace paratrain::launch::testing;
namespace fs = std::filesystem;

const std::string kLauncher = std::string(PARATRAIN_TEST_BIN_DIR) + "/launch_main_helper";
const std::string kRank = std::string(PARATRAIN_TEST_BIN_DIR) + "/rank_helper";

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string temp_dir(const std::string& tag) {
  std::string t = (fs::temp_directory_path() / ("pt_launch_" + tag + "_XXXXXX")).string();
  return ::mkdtemp(t.data()) ? t : std::string();
}

class LaunchJob : public ::testing::TestWithParam<int> {};

TEST_P(LaunchJob, EveryRankGetsEveryVariableAndMeetsInTheStore) {
  const int n = GetParam();
  auto r = run(cat({kLauncher, "--nproc-per-node", std::to_string(n), "--", kRank, "--env", "--store"}, {}), 30,
               {"PARATRAIN_TOKEN=", "OMP_NUM_THREADS=", "PARATRAIN_THREADS=", "OMPI_COMM_WORLD_RANK=7"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto vars = rank_vars(r.out);
  ASSERT_EQ(static_cast<int>(vars.size()), n) << r.out;
  const int threads = threads_per_rank(usable_cpu_count(), n);
  std::set<std::string> tokens, ports;
  for (int rank = 0; rank < n; ++rank) {
    auto& v = vars[rank];
    expect_one_node_rank_vars(v, rank, n);
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(v["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(v["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(v["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(v["PARATRAIN_STORE_EXTERNAL"], "1");
    EXPECT_EQ(v["OMP_NUM_THREADS"], n > 1 ? "1" : "<unset>");  // as torchrun sets it
    EXPECT_EQ(v["PARATRAIN_THREADS"], std::to_string(threads));
    EXPECT_EQ(v["OMPI_COMM_WORLD_RANK"], "<unset>");
    EXPECT_TRUE(std::regex_match(v["PARATRAIN_TOKEN"], std::regex("[0-9a-f]{64}"))) << v["PARATRAIN_TOKEN"];
    // The launcher's pick lies below the kernel's ephemeral range, from 20000 up: no other
    // process's outgoing connection takes it before the program's rank 0 listens on it.
    int port = std::atoi(v["MASTER_PORT"].c_str());
    int ephemeral_low = 0;
    std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
    EXPECT_GE(port, 20000);
    EXPECT_LT(port, ephemeral_low);
    tokens.insert(v["PARATRAIN_TOKEN"]);
    ports.insert(v["MASTER_PORT"]);
  }
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_EQ(ports.size(), 1u);
  // The ranks met through the launcher's store (MASTER_ADDR:MASTER_PORT, PARATRAIN_TOKEN).
  auto ok = lines_with(r.out, "");
  int store_ok = 0;
  for (auto& l : ok) store_ok += l.find("] STORE_OK world=" + std::to_string(n)) != std::string::npos;
  EXPECT_EQ(store_ok, n) << r.out << r.err;
  // A successful job: the launcher says nothing but torchrun's OMP_NUM_THREADS note (n > 1).
  EXPECT_EQ(lines_with(r.err, "").size(), n > 1 ? 1u : 0u) << r.err;
  if (n > 1) EXPECT_EQ(r.err.rfind("paratrain launch: OMP_NUM_THREADS is not set", 0), 0u) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LaunchJob, ::testing::Values(1, 2, 4));

TEST_P(LaunchJob, CommProcessGroupJoinsTheLaunchersStore) {
  const int n = GetParam();
  auto r = run({kLauncher, "--nproc-per-node", std::to_string(n), "--", std::string(PARATRAIN_TEST_BIN_DIR) + "/pg_helper"},
               60);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const int sum = n * (n + 1) / 2;
  for (int rank = 0; rank < n; ++rank)
    EXPECT_EQ(lines_with(r.out, "[" + std::to_string(rank) + "] PG_OK rank=" + std::to_string(rank) + " size=" +
                                    std::to_string(n) + " sum=" + std::to_string(sum))
                  .size(),
              1u)
        << r.out << r.err;
}

TEST(LaunchJobs, CommProcessGroupAfterARestart) {
  auto r = run({kLauncher, "--nproc-per-node", "2", "--max-restarts", "1", "--",
                std::string(PARATRAIN_TEST_BIN_DIR) + "/pg_helper", "--fail-first-attempt", "1"},
               60);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, "[0] PG_OK rank=0 size=2 sum=3").size(), 2u) << r.out << r.err;
  EXPECT_NE(r.err.find("restarts used: 1 of 1"), std::string::npos) << r.err;
}

TEST(LaunchJobs, FreshTokenPerJobUnlessGiven) {
  auto a = run({kLauncher, "--", kRank, "--env"}, 20, {"PARATRAIN_TOKEN="});
  auto b = run({kLauncher, "--", kRank, "--env"}, 20, {"PARATRAIN_TOKEN="});
  ASSERT_EQ(a.status, 0);
  ASSERT_EQ(b.status, 0);
  EXPECT_NE(rank_vars(a.out)[0]["PARATRAIN_TOKEN"], rank_vars(b.out)[0]["PARATRAIN_TOKEN"]);
  auto c = run({kLauncher, "--nproc-per-node", "2", "--", kRank, "--env", "--store"}, 20,
               {"PARATRAIN_TOKEN=my-secret", "OMP_NUM_THREADS=3"});
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(rank_vars(c.out)[1]["PARATRAIN_TOKEN"], "my-secret");
  EXPECT_EQ(rank_vars(c.out)[1]["OMP_NUM_THREADS"], "3");
}

TEST(LaunchJobs, LinesNeverInterleaveAndLogDirGetsEachRank) {
  std::string dir = temp_dir("logs");
  const int lines = 3000;
  auto r = run({kLauncher, "--nproc-per-node", "4", "--log-dir", dir + "/sub", "--", kRank, "--lines",
                std::to_string(lines), "--stderr", "to stderr"},
               30);
  ASSERT_EQ(r.status, 0) << r.err;
  std::regex line_re(R"(\[(\d)\] line (\d+) of rank (\d): the quick brown fox jumps over the lazy dog)");
  std::map<int, int> next;
  size_t pos = 0, count = 0;
  while (pos < r.out.size()) {
    size_t nl = r.out.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    std::string line = r.out.substr(pos, nl - pos);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mangled line: " << line;
    int rank = std::stoi(m[1]);
    EXPECT_EQ(rank, std::stoi(m[3]));
    EXPECT_EQ(std::stoi(m[2]), next[rank]++);  // in order within a rank
    ++count;
    pos = nl + 1;
  }
  EXPECT_EQ(count, 4u * lines);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.err.find("[" + std::to_string(rank) + "] to stderr\n"), std::string::npos) << r.err;
    std::ifstream f(dir + "/sub/rank_" + std::to_string(rank) + ".log");
    std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content.rfind("line 0 of rank " + std::to_string(rank), 0), 0u);
    EXPECT_NE(content.find("\nto stderr\n"), std::string::npos);
    EXPECT_EQ(std::count(content.begin(), content.end(), '\n'), lines + 1);
  }
  fs::remove_all(dir);
}

int listening_socket(int* port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::listen(s, 4);
  socklen_t len = sizeof(a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return s;
}

TEST(LaunchJobs, BadUsageIsExitTwoWithOneLineAndStartsNothing) {
  std::string dir = temp_dir("bad");
  int port = 0;
  int held = listening_socket(&port);
  std::vector<std::vector<std::string>> cases = {
      {kLauncher, "--bogus", "--", kRank, "--pid-dir", dir},
      {kLauncher, "--nnodes", "2", "--node-rank", "5", "--", kRank, "--pid-dir", dir},
      {kLauncher, "--master-port", std::to_string(port), "--", kRank, "--pid-dir", dir},
      {kLauncher, "--", dir + "/no_such_program"},
      {kLauncher, "--", "no-such-program-anywhere"},
      {kLauncher, "--nproc-per-node", "many", "--", kRank},
      {kLauncher, "--nnodes", "2", "--", kRank, "--pid-dir", dir},  // no PARATRAIN_TOKEN for a multi-node job
  };
  const char* expect[] = {"unknown option '--bogus'", "--node-rank 5 is outside --nnodes 2", "--master-port",
                          "does not exist", "not found in PATH", "--nproc-per-node", "PARATRAIN_TOKEN"};
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = run(cases[i], 20, {"PARATRAIN_TOKEN="});
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(expect[i]), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "a child started despite bad usage";
  ::close(held);
  fs::remove_all(dir);
  auto h = run({kLauncher, "--help"}, 10);
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("usage: paratrain launch"), std::string::npos);
}

TEST(LaunchJobs, InProcessLauncherReportsStartup) {
  LaunchOptions o;
  o.nproc_per_node = 4;
  o.program = {kRank};
  Launcher l(o);
  EXPECT_EQ(l.run(), 0);
  ASSERT_EQ(l.report().ranks.size(), 4u);
  for (auto& r : l.report().ranks) {
    EXPECT_TRUE(r.exited);
    EXPECT_EQ(r.status_code(), 0);
  }
  // Reported (the 4th fork comes after the start of run()); how long it is is for bench/.
  EXPECT_GT(l.report().startup_s, 0.0);
  std::printf("launcher start-up for 4 ranks (start of run() to the 4th fork): %.2f ms\n", l.report().startup_s * 1e3);
  // Overhead seen from outside: 4 ranks under the launcher vs one direct run of the rank.
  auto direct = run({kRank}, 10, {"RANK=0"});  // (no RANK: rank -1 = the default --fail-rank)
  ASSERT_EQ(direct.status, 0) << direct.err;
  auto launched = run({kLauncher, "--nproc-per-node", "4", "--", kRank}, 10);
  ASSERT_FALSE(launched.timed_out) << "the 10 s deadline bounds a hang; speed is for bench/";
  ASSERT_EQ(launched.status, 0) << launched.err;
  std::printf("4 ranks under the launcher: %.1f ms wall; the program alone: %.1f ms; overhead %.1f ms\n",
              launched.seconds * 1e3, direct.seconds * 1e3, (launched.seconds - direct.seconds) * 1e3);
}

TEST(LaunchJobs, RealBinary) {
  // `paratrain launch` itself, through src/cli/main.cpp.
  auto probe = run({PARATRAIN_BIN, "launch", "--help"}, 10);
  ASSERT_EQ(probe.status, 0) << probe.err;
  ASSERT_NE(probe.out.find("usage: paratrain launch"), std::string::npos) << probe.out;
  auto r = run({PARATRAIN_BIN, "launch", "--nproc-per-node", "2", "--", kRank, "--env", "--store"}, 20);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(rank_vars(r.out).size(), 2u);
  auto bad = run({PARATRAIN_BIN, "launch", "--bogus", "--", kRank}, 10);
  EXPECT_EQ(bad.status, 2);
  auto fail = run({PARATRAIN_BIN, "launch", "--nproc-per-node", "2", "--", kRank, "--fail-rank", "1", "--code", "3"}, 20);
  EXPECT_EQ(fail.status, 3) << fail.err;
}

}  // namespace
}  // namespace paratrain::launch
