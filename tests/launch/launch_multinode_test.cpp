// Multi-node jobs: two launchers meeting through node 0's store. On loopback (always), and
// in two network namespaces joined by a veth pair (root only; skipped with a message
// where namespaces cannot be made).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "launch/launch_test_util.h"

namespace paratrain::launch {
namespace {

using namespace paratrain::launch::testing;

const std::string kLauncher = std::string(PARATRAIN_TEST_BIN_DIR) + "/launch_main_helper";
const std::string kRank = std::string(PARATRAIN_TEST_BIN_DIR) + "/rank_helper";

// Starts node `node` of a 2-node job with `nproc` ranks; `prefix` runs it elsewhere (ip netns exec).
Proc start_node(const std::vector<std::string>& prefix, int node, int nproc, const std::string& addr, int port,
                const std::vector<std::string>& rank_args, const std::string& extra = "",
                const std::string& program = kRank, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = prefix;
  std::vector<std::string> l = {kLauncher, "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node",
                                std::to_string(nproc), "--master-addr", addr, "--master-port", std::to_string(port),
                                "--rdzv-timeout", "20", "--grace-period", "2"};
  if (!extra.empty()) {
    l.push_back("--max-restarts");
    l.push_back(extra);
  }
  argv.insert(argv.end(), l.begin(), l.end());
  argv.push_back("--");
  argv.push_back(program);
  argv.insert(argv.end(), rank_args.begin(), rank_args.end());
  std::vector<std::string> job_env = {"PARATRAIN_TOKEN=shared-secret-of-the-job"};
  job_env.insert(job_env.end(), env.begin(), env.end());
  return start(argv, job_env);
}

void check_job(const RunResult& n0, const RunResult& n1, const std::string& addr) {
  ASSERT_EQ(n0.status, 0) << n0.err << n1.err;
  ASSERT_EQ(n1.status, 0) << n1.err << n0.err;
  auto v0 = rank_vars(n0.out), v1 = rank_vars(n1.out);
  // node 0 ran ranks 0, 1; node 1 ran ranks 2, 3 (node 1 has 2 ranks as well).
  ASSERT_EQ(v0.size(), 2u) << n0.out;
  ASSERT_EQ(v1.size(), 2u) << n1.out;
  for (int rank = 0; rank < 4; ++rank) {
    auto& v = rank < 2 ? v0[rank] : v1[rank];
    EXPECT_EQ(v["RANK"], std::to_string(rank));
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(v["GROUP_RANK"], std::to_string(rank / 2));
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(v["MASTER_ADDR"], addr);
    EXPECT_EQ(v["PARATRAIN_TOKEN"], "shared-secret-of-the-job");
  }
  // All four ranks met in node 0's store, across the nodes.
  EXPECT_EQ(lines_with(n0.out, "[0] STORE_OK world=4").size(), 1u) << n0.out;
  EXPECT_EQ(lines_with(n1.out, "[3] STORE_OK world=4").size(), 1u) << n1.out;
}

TEST(LaunchMultiNode, TwoLaunchersOnLoopback) {
  int port = free_port();
  Proc a = start_node({}, 0, 2, "127.0.0.1", port, {"--env", "--store"});
  Proc b = start_node({}, 1, 2, "127.0.0.1", port, {"--env", "--store"});
  auto n1 = finish(b, 40);
  auto n0 = finish(a, 40);
  check_job(n0, n1, "127.0.0.1");
}

TEST(LaunchMultiNode, FailureOnOneNodeStopsBothWithItsCode) {
  int port = free_port();
  Proc a = start_node({}, 0, 2, "127.0.0.1", port, {"--fail-rank", "3", "--fail-delay", "0.3", "--code", "3", "--sleep", "60"});
  Proc b = start_node({}, 1, 2, "127.0.0.1", port, {"--fail-rank", "3", "--fail-delay", "0.3", "--code", "3", "--sleep", "60"});
  auto n1 = finish(b, 40);
  auto n0 = finish(a, 40);
  ASSERT_FALSE(n0.timed_out) << n0.err;
  ASSERT_FALSE(n1.timed_out) << n1.err;
  EXPECT_EQ(n1.status, 3) << n1.err;
  EXPECT_EQ(n0.status, 3) << n0.err;
  // Node 0's ranks (asleep for 60 s) were stopped because of node 1's failure, by the
  // SIGTERM, not the SIGKILL after the grace period: judged by how they ended, not the clock.
  int stopped = 0;
  for (size_t at = n0.err.find("stopped by SIGTERM"); at != std::string::npos; at = n0.err.find("stopped by SIGTERM", at + 1))
    ++stopped;
  EXPECT_EQ(stopped, 2) << n0.err;
  EXPECT_EQ(n0.err.find("by SIGKILL"), std::string::npos) << n0.err;
  EXPECT_NE(n0.err.find("first failure on another node: rank 3 (node 1"), std::string::npos) << n0.err;
  EXPECT_NE(n1.err.find("* 3 "), std::string::npos) << n1.err;
}

TEST(LaunchMultiNode, RestartAcrossNodes) {
  int port = free_port();
  std::vector<std::string> args = {"--env", "--store", "--fail-rank", "2", "--code", "4", "--only-first-attempt",
                                   "--fail-delay", "0.3", "--sleep", "0.6"};
  Proc a = start_node({}, 0, 2, "127.0.0.1", port, args, "1");
  Proc b = start_node({}, 1, 2, "127.0.0.1", port, args, "1");
  auto n1 = finish(b, 60);
  auto n0 = finish(a, 60);
  EXPECT_EQ(n0.status, 0) << n0.err;
  EXPECT_EQ(n1.status, 0) << n1.err;
  EXPECT_NE(n0.err.find("restarts used: 1 of 1"), std::string::npos) << n0.err;
  EXPECT_NE(n1.err.find("restarts used: 1 of 1"), std::string::npos) << n1.err;
  EXPECT_EQ(lines_with(n0.out, "[0] STORE_OK world=4").size(), 2u) << n0.out;
}

// Two network namespaces joined by a veth pair, 10.213.7.1 and 10.213.7.2.
class NetnsPair : public ::testing::Test {
 protected:
  void SetUp() override {
    tag_ = std::to_string(::getpid());
    ns0_ = "ptl0_" + tag_;
    ns1_ = "ptl1_" + tag_;
    if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root (euid " << ::geteuid() << "); two-node test skipped";
    std::vector<std::vector<std::string>> cmds = {
        {"ip", "netns", "add", ns0_},
        {"ip", "netns", "add", ns1_},
        {"ip", "link", "add", "pt0_" + tag_, "type", "veth", "peer", "name", "pt1_" + tag_},
        {"ip", "link", "set", "pt0_" + tag_, "netns", ns0_},
        {"ip", "link", "set", "pt1_" + tag_, "netns", ns1_},
        {"ip", "-n", ns0_, "addr", "add", "10.213.7.1/24", "dev", "pt0_" + tag_},
        {"ip", "-n", ns1_, "addr", "add", "10.213.7.2/24", "dev", "pt1_" + tag_},
        {"ip", "-n", ns0_, "link", "set", "pt0_" + tag_, "up"},
        {"ip", "-n", ns1_, "link", "set", "pt1_" + tag_, "up"},
        {"ip", "-n", ns0_, "link", "set", "lo", "up"},
        {"ip", "-n", ns1_, "link", "set", "lo", "up"},
    };
    for (auto& c : cmds) {
      auto r = run(c, 10);
      if (r.status != 0) {
        std::string cmd;
        for (auto& a : c) cmd += a + " ";
        GTEST_SKIP() << "cannot make network namespaces here (" << cmd << "failed: " << r.err
                     << "); two-node test skipped";
      }
      made_ = true;
    }
  }
  void TearDown() override {
    if (!made_) return;
    run({"ip", "netns", "del", ns0_}, 10);  // deleting a namespace deletes its veth end, and the pair
    run({"ip", "netns", "del", ns1_}, 10);
  }
  std::string tag_, ns0_, ns1_;
  bool made_ = false;
};

TEST_F(NetnsPair, OneJobAcrossTwoNamespaces) {
  auto r = run({"ip", "netns", "exec", ns1_, "ping", "-c", "1", "-W", "2", "10.213.7.1"}, 10);
  if (r.status == 127) std::printf("(ping not available; relying on the job itself)\n");
  Proc a = start_node({"ip", "netns", "exec", ns0_}, 0, 2, "10.213.7.1", 29500, {"--env", "--store"});
  Proc b = start_node({"ip", "netns", "exec", ns1_}, 1, 2, "10.213.7.1", 29500, {"--env", "--store"});
  auto n1 = finish(b, 40);
  auto n0 = finish(a, 40);
  check_job(n0, n1, "10.213.7.1");
}

// The comm layer's tcp transport across the namespaces: four ranks (two per namespace) build
// a ProcessGroup from the launcher's environment and all-reduce rank+1 over tcp pairs.
TEST_F(NetnsPair, TcpAllreduceAcrossTwoNamespaces) {
  const std::string pg = std::string(PARATRAIN_TEST_BIN_DIR) + "/pg_helper";
  Proc a = start_node({"ip", "netns", "exec", ns0_}, 0, 2, "10.213.7.1", 29501, {}, "", pg, {"PARATRAIN_BACKEND=tcp"});
  Proc b = start_node({"ip", "netns", "exec", ns1_}, 1, 2, "10.213.7.1", 29501, {}, "", pg, {"PARATRAIN_BACKEND=tcp"});
  auto n1 = finish(b, 60);
  auto n0 = finish(a, 60);
  ASSERT_EQ(n0.status, 0) << n0.err << n1.err;
  ASSERT_EQ(n1.status, 0) << n1.err << n0.err;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& out = rank < 2 ? n0.out : n1.out;
    const std::string want = "[" + std::to_string(rank) + "] PG_OK rank=" + std::to_string(rank) + " size=4 sum=10";
    EXPECT_EQ(lines_with(out, want).size(), 1u) << want << " in:\n" << out;
  }
}

}  // namespace
}  // namespace paratrain::launch
