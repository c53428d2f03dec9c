// `paratrain launch` as a drop-in for torchrun: a PyTorch program (Debian's python3-torch,
// /usr/bin/python3) that uses the default env:// rendezvous runs under it unchanged. Its
// rank 0 hosts its own TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=False); the
// launcher's store for paratrain ranks is elsewhere (PARATRAIN_STORE_PORT). Checked: 1, 2 and
// 4 ranks (each rank's all-reduce result, every torchrun variable), a rank exiting 3, a
// restart, --nproc-per-node auto, two launchers in two network namespaces (root only), and
// that programs that are not PyTorch keep working: a shell script, paratrain's own training,
// and paratrain's store refusing a rank with the wrong token.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "launch/launch_test_util.h"
#include "paratrain/launch/child_env.h"
#include "paratrain/launch/host.h"
#include "paratrain/launch/launcher.h"
#include "support/weights_compare.h"

namespace paratrain::launch {
namespace {

using namespace paratrain::launch::testing;
namespace fs = std::filesystem;

const std::string kLauncher = std::string(PARATRAIN_TEST_BIN_DIR) + "/launch_main_helper";
const std::string kPython = "/usr/bin/python3";
const std::string kProg = std::string(PARATRAIN_SOURCE_DIR) + "/tests/launch/torch_gloo_prog.py";

// Where python3-torch is missing the PyTorch tests say so and skip.
std::string torch_missing() {
  if (::access(kPython.c_str(), X_OK) != 0) return kPython + " is not installed";
  for (const char* d : {"/usr/lib/python3/dist-packages/torch/distributed/__init__.py",
                        "/usr/local/lib/python3/dist-packages/torch/distributed/__init__.py"})
    if (::access(d, R_OK) == 0) return "";
  return "python3-torch is not installed (no torch/distributed in /usr/lib/python3/dist-packages)";
}
#define SKIP_WITHOUT_TORCH()                                                   \
  do {                                                                         \
    if (std::string why = torch_missing(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// The environment every launcher here starts with: torchrun's OMP_NUM_THREADS rule applies.
const std::vector<std::string> kEnv = {"OMP_NUM_THREADS=", "PARATRAIN_TOKEN=", "PARATRAIN_STORE_PORT="};

std::string torch_ok(int rank, int world, int restart = 0) {
  const int s1 = world * (world + 1) / 2, s2 = world * (world + 1) * (2 * world + 1) / 6;
  return "[" + std::to_string(rank) + "] TORCH_OK rank=" + std::to_string(rank) + " world=" + std::to_string(world) +
         " sum=" + std::to_string(s1) + "," + std::to_string(s2) + " restart=" + std::to_string(restart);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every rank of an n-rank job on one node printed the right sums and torchrun's variables.
void check_torch_job(const RunResult& r, int n) {
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank)
    EXPECT_EQ(lines_with(r.out, torch_ok(rank, n)).size(), 1u) << torch_ok(rank, n) << " in:\n" << r.out << r.err;
  auto vars = rank_vars(r.out);
  ASSERT_EQ(static_cast<int>(vars.size()), n) << r.out;
  std::set<std::string> master_ports;
  for (int rank = 0; rank < n; ++rank) {
    auto& v = vars[rank];
    expect_one_node_rank_vars(v, rank, n);
    EXPECT_EQ(v["ROLE_NAME"], "default");
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(v["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(v["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(v["TORCHELASTIC_RUN_ID"], "127.0.0.1:" + v["MASTER_PORT"]);
    EXPECT_EQ(v["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(v["NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(v["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(v["TORCHELASTIC_ERROR_FILE"], "<unset>");  // only with --log-dir
    // torchrun: OMP_NUM_THREADS=1 when unset and several ranks per node, else left alone.
    EXPECT_EQ(v["OMP_NUM_THREADS"], n > 1 ? "1" : "<unset>");
    if (n > 1) EXPECT_EQ(v["TORCH_THREADS"], "1");
    // MASTER_PORT is the program's; the launcher's own store is on another port.
    EXPECT_NE(v["PARATRAIN_STORE_PORT"], v["MASTER_PORT"]);
    EXPECT_GT(std::atoi(v["PARATRAIN_STORE_PORT"].c_str()), 0);
    master_ports.insert(v["MASTER_PORT"]);
  }
  EXPECT_EQ(master_ports.size(), 1u);
  // What the launcher says of its own on success: at most torchrun's OMP_NUM_THREADS note.
  if (n > 1) {
    EXPECT_EQ(count(r.err, "paratrain launch: OMP_NUM_THREADS is not set"), 1) << r.err;
    EXPECT_EQ(lines_with(r.err, "paratrain launch:").size(), 1u) << r.err;
  } else {
    EXPECT_EQ(lines_with(r.err, "paratrain launch:").size(), 0u) << r.err;
  }
}

// build_child_env's torchrun side, without a job: the store port, the error file, the
// OMP_NUM_THREADS rule and what it keeps of the caller's.
TEST(LaunchTorchrunEnv, ChildEnvIsTorchrunsPlusTheStorePort) {
  RankAssignment who{3, 1, 4, 2, 1, 2};
  JobEnv job;
  job.master_addr = "h0";
  job.master_port = 29500;
  job.store_port = 41234;
  job.error_dir = "/logs";
  job.omp_threads = 0;  // one rank per node: torchrun leaves OMP_NUM_THREADS alone
  job.run_id = "h0:29500";
  auto as_map = [](const std::vector<std::string>& env) {
    std::map<std::string, std::string> m;
    for (auto& kv : env) m[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    return m;
  };
  auto m = as_map(build_child_env({"PATH=/bin", "NCCL_ASYNC_ERROR_HANDLING=0", "TORCHELASTIC_ERROR_FILE=/parent.json",
                                   "PARATRAIN_STORE_PORT=1"},
                                  who, job));
  EXPECT_EQ(m["MASTER_PORT"], "29500");
  EXPECT_EQ(m["PARATRAIN_STORE_PORT"], "41234");
  EXPECT_EQ(m["PARATRAIN_STORE_EXTERNAL"], "1");
  EXPECT_EQ(m["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(m["TORCHELASTIC_ERROR_FILE"], "/logs/rank_3.error.json");
  EXPECT_EQ(m["NCCL_ASYNC_ERROR_HANDLING"], "0");  // the caller's, as torchrun keeps it
  EXPECT_EQ(m["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(m["ROLE_NAME"], "default");
  EXPECT_EQ(m["GROUP_RANK"], "1");
  EXPECT_EQ(m["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(m["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(m.count("OMP_NUM_THREADS"), 0u);
  // Several ranks per node: 1 unless the caller chose; no error directory: no error file.
  job.omp_threads = 1;
  job.error_dir.clear();
  m = as_map(build_child_env({"TORCHELASTIC_ERROR_FILE=/parent.json"}, who, job));
  EXPECT_EQ(m["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(m.count("TORCHELASTIC_ERROR_FILE"), 0u);
  EXPECT_EQ(as_map(build_child_env({"OMP_NUM_THREADS=6"}, who, job))["OMP_NUM_THREADS"], "6");
}

// The summary names the error file a failed PyTorch rank wrote (torch's @record).
TEST(LaunchTorchrunEnv, SummaryNamesTheErrorFile) {
  LaunchReport rep;
  rep.exit_code = 3;
  rep.first_failed_rank = 1;
  rep.failure = "rank 1 (node 0, h) failed with exit code 3";
  RankReport a, b;
  a.rank = 0, a.exited = true, a.stopped = true, a.term_signal = 15;
  b.rank = 1, b.exited = true, b.exit_code = 3, b.error_file = "/logs/rank_1.error.json";
  rep.ranks = {a, b};
  std::string s = format_summary(rep, 0);
  EXPECT_NE(s.find("error file of rank 1 (TORCHELASTIC_ERROR_FILE): /logs/rank_1.error.json\n"), std::string::npos) << s;
  rep.ranks[1].error_file.clear();
  EXPECT_EQ(format_summary(rep, 0).find("error file"), std::string::npos);
}

class LaunchTorchrun : public ::testing::TestWithParam<int> {};

TEST_P(LaunchTorchrun, PyTorchGlooAllReduceUnchanged) {
  SKIP_WITHOUT_TORCH();
  const int n = GetParam();
  auto r = run({kLauncher, "--nproc-per-node", std::to_string(n), "--grace-period", "2", "--", kPython, kProg}, 120,
               kEnv);
  check_torch_job(r, n);
}

INSTANTIATE_TEST_SUITE_P(Ranks, LaunchTorchrun, ::testing::Values(1, 2, 4));

TEST(LaunchTorchruns, PyTorchRankExitingThreeStopsTheOthers) {
  SKIP_WITHOUT_TORCH();
  auto r = run({kLauncher, "--nproc-per-node", "4", "--grace-period", "5", "--", kPython, kProg, "--fail-rank", "3",
                "--code", "3"},
               120, kEnv);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 3) << r.out << r.err;
  // Every rank's all-reduce was right before rank 3 failed ...
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(lines_with(r.out, torch_ok(rank, 4)).size(), 1u) << r.out << r.err;
  // ... then the launcher stopped the three others (asleep for 120 s) with SIGTERM.
  EXPECT_NE(r.err.find("summary: rank 3 (node 0, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed with exit code 3; exit code 3"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "stopped by SIGTERM"), 3) << r.err;
  EXPECT_EQ(r.err.find("by SIGKILL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[3] rank 3 failing on purpose with exit code 3"), std::string::npos) << r.err;
}

TEST(LaunchTorchruns, PyTorchRestartCountsUp) {
  SKIP_WITHOUT_TORCH();
  const int port = free_port();
  std::string logs = (fs::temp_directory_path() / ("pt_torchrun_" + std::to_string(::getpid()))).string();
  auto r = run({kLauncher, "--nproc-per-node", "2", "--max-restarts", "1", "--master-port", std::to_string(port),
                "--grace-period", "5", "--log-dir", logs, "--", kPython, kProg, "--fail-rank", "1", "--code", "3",
                "--first-attempt-only"},
               180, kEnv);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("restarts used: 1 of 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 (node 0, "), std::string::npos) << r.err;  // the first attempt's failure
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "] ";
    // Both attempts met in the program's own store on the same MASTER_PORT and reduced right.
    EXPECT_EQ(lines_with(r.out, torch_ok(rank, 2, 0)).size(), 1u) << r.out << r.err;
    EXPECT_EQ(lines_with(r.out, torch_ok(rank, 2, 1)).size(), 1u) << r.out << r.err;
    EXPECT_EQ(lines_with(r.out, p + "TORCHELASTIC_RESTART_COUNT=0").size(), 1u) << r.out;
    EXPECT_EQ(lines_with(r.out, p + "TORCHELASTIC_RESTART_COUNT=1").size(), 1u) << r.out;
    EXPECT_EQ(lines_with(r.out, p + "TORCHELASTIC_MAX_RESTARTS=1").size(), 2u) << r.out;
    EXPECT_EQ(lines_with(r.out, p + "MASTER_PORT=" + std::to_string(port)).size(), 2u) << r.out;
    EXPECT_EQ(lines_with(r.out, p + "TORCHELASTIC_ERROR_FILE=" + logs + "/rank_" + std::to_string(rank) + ".error.json")
                  .size(),
              2u)
        << r.out;
  }
  fs::remove_all(logs);
}

TEST(LaunchTorchruns, PyTorchWithNprocAuto) {
  SKIP_WITHOUT_TORCH();
  const int n = auto_nproc_per_node().nproc;
  auto r = run({kLauncher, "--nproc-per-node", "auto", "--grace-period", "2", "--", kPython, kProg}, 180, kEnv);
  // The launcher names its choice on stderr; the rest is as for a number.
  EXPECT_EQ(count(r.err, "--nproc-per-node auto: " + std::to_string(n) + " ("), 1) << r.err;
  RunResult without_choice = r;
  std::string err;
  for (const auto& line : lines_with(r.err, ""))
    if (line.rfind("paratrain launch: --nproc-per-node auto", 0) != 0) err += line + "\n";
  without_choice.err = err;
  check_torch_job(without_choice, n);
}

// A program that is no PyTorch and does not rendezvous at all: a shell script, as before.
TEST(LaunchTorchruns, ShellScriptWithoutRendezvousStillRuns) {
  const std::string script = "echo \"hello from $RANK of $WORLD_SIZE on port $MASTER_PORT\"; exit ${CODE:-0}";
  auto ok = run({kLauncher, "--nproc-per-node", "2", "--", "/bin/sh", "-c", script}, 30, kEnv);
  ASSERT_FALSE(ok.timed_out) << ok.err;
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(lines_with(ok.out, "[0] hello from 0 of 2 on port ").size(), 1u) << ok.out;
  EXPECT_EQ(lines_with(ok.out, "[1] hello from 1 of 2 on port ").size(), 1u) << ok.out;
  auto bad = run({kLauncher, "--nproc-per-node", "2", "--", "/bin/sh", "-c", script}, 30,
                 {"OMP_NUM_THREADS=1", "PARATRAIN_TOKEN=", "CODE=3"});
  ASSERT_FALSE(bad.timed_out) << bad.err;
  EXPECT_EQ(bad.status, 3) << bad.err;
  EXPECT_NE(bad.err.find("failed with exit code 3; exit code 3"), std::string::npos) << bad.err;
}

// paratrain's own ranks still meet in the launcher's (authenticated) store, and a rank with
// the wrong token is refused by it: rank 1 replaces the job's token before it joins.
TEST(LaunchTorchruns, ParatrainStoreRefusesAWrongToken) {
  const std::string pg = std::string(PARATRAIN_TEST_BIN_DIR) + "/pg_helper";
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then PARATRAIN_TOKEN=not-the-jobs-token; export PARATRAIN_TOKEN; fi; exec " + pg;
  auto r = run({kLauncher, "--nproc-per-node", "2", "--grace-period", "2", "--", "/bin/sh", "-c", script}, 60, kEnv);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("[1] pg_helper: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("refused this client"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("summary: rank 1 (node 0, "), std::string::npos) << r.err;
  EXPECT_EQ(lines_with(r.out, "[0] PG_OK").size(), 0u) << r.out;  // rank 0 never got a group of 2
  // And with the job's token both join, over the store's port, not MASTER_PORT.
  auto good = run({kLauncher, "--nproc-per-node", "2", "--", pg}, 60, kEnv);
  ASSERT_EQ(good.status, 0) << good.out << good.err;
  EXPECT_EQ(lines_with(good.out, "[0] PG_OK rank=0 size=2 sum=3").size(), 1u) << good.out;
  EXPECT_EQ(lines_with(good.out, "[1] PG_OK rank=1 size=2 sum=3").size(), 1u) << good.out;
}

// paratrain's own multi-rank training under the launcher: the real binary, two ranks.
TEST(LaunchTorchruns, ParatrainTrainTwoRanks) {
  std::string dir = (fs::temp_directory_path() / ("pt_torchrun_train_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  paratrain::test::write_structured_token_file(dir + "/t.bin");
  auto r = run({PARATRAIN_BIN, "launch", "--nproc-per-node", "2", "--", PARATRAIN_BIN, "train", "--model", "gpt-nano",
                "--data", dir + "/t.bin", "--steps", "3", "--micro-batch", "4", "--threads", "1", "--quiet", "--metrics",
                dir + "/m.jsonl"},
               240, {"OMP_NUM_THREADS=1", "PARATRAIN_TOKEN=", "PARATRAIN_STORE_PORT="});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  std::ifstream f(dir + "/m.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(f, line))
    if (line.find("\"eval\"") == std::string::npos && line.find("\"step\"") != std::string::npos) ++steps;
  EXPECT_EQ(steps, 3) << r.out << r.err;
  fs::remove_all(dir);
}

// Two launchers (--nnodes 2) in two network namespaces joined by a veth pair, each with its
// own GLOO_SOCKET_IFNAME (gloo otherwise takes the host name's address, which is not in the
// namespace). Root only; skipped with a message elsewhere.
class LaunchTorchrunNetns : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_TORCH();
    if (std::string why = net_.make("ptt", "10.213.9"); !why.empty()) GTEST_SKIP() << why << "; two-node test skipped";
  }
  Proc start_node(int node, int nproc, const std::vector<std::string>& prog_args) {
    std::vector<std::string> argv = net_.exec(node);
    std::vector<std::string> l = {kLauncher, "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node",
                                  std::to_string(nproc), "--master-addr", net_.addr[0], "--master-port", "29500",
                                  "--rdzv-timeout", "60", "--grace-period", "5", "--", kPython, kProg};
    argv.insert(argv.end(), l.begin(), l.end());
    argv.insert(argv.end(), prog_args.begin(), prog_args.end());
    return start(argv, {"PARATRAIN_TOKEN=shared-secret-of-the-job", "GLOO_SOCKET_IFNAME=" + net_.dev[node],
                        "OMP_NUM_THREADS=", "PARATRAIN_STORE_PORT="});
  }
  NetnsPairSetup net_;
};

TEST_F(LaunchTorchrunNetns, PyTorchGlooAcrossTwoNamespaces) {
  Proc a = start_node(0, 2, {});
  Proc b = start_node(1, 2, {});
  auto n1 = finish(b, 180);
  auto n0 = finish(a, 180);
  ASSERT_FALSE(n0.timed_out || n1.timed_out) << n0.err << n1.err;
  ASSERT_EQ(n0.status, 0) << n0.out << n0.err << n1.err;
  ASSERT_EQ(n1.status, 0) << n1.out << n1.err << n0.err;
  for (int rank = 0; rank < 4; ++rank) {
    const RunResult& node = rank < 2 ? n0 : n1;
    EXPECT_EQ(lines_with(node.out, torch_ok(rank, 4)).size(), 1u) << torch_ok(rank, 4) << " in:\n" << node.out;
    auto v = rank_vars(node.out)[rank];
    EXPECT_EQ(v["RANK"], std::to_string(rank));
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(v["GROUP_RANK"], std::to_string(rank / 2));
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(v["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(v["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(v["MASTER_ADDR"], net_.addr[0]);
    EXPECT_EQ(v["MASTER_PORT"], "29500");  // node 0's rank 0 hosted PyTorch's store there
    EXPECT_EQ(v["TORCHELASTIC_RUN_ID"], net_.addr[0] + ":29500");
    EXPECT_EQ(v["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(v["OMP_NUM_THREADS"], "1");
  }
}

TEST_F(LaunchTorchrunNetns, PyTorchRankExitingThreeOnNodeOneStopsBoth) {
  Proc a = start_node(0, 1, {"--fail-rank", "1", "--code", "3"});
  Proc b = start_node(1, 1, {"--fail-rank", "1", "--code", "3"});
  auto n1 = finish(b, 180);
  auto n0 = finish(a, 180);
  ASSERT_FALSE(n0.timed_out || n1.timed_out) << n0.err << n1.err;
  EXPECT_EQ(n1.status, 3) << n1.out << n1.err;
  EXPECT_EQ(n0.status, 3) << n0.out << n0.err;
  EXPECT_EQ(lines_with(n0.out, torch_ok(0, 2)).size(), 1u) << n0.out << n0.err;
  EXPECT_EQ(lines_with(n1.out, torch_ok(1, 2)).size(), 1u) << n1.out << n1.err;
  // Node 0's rank (asleep) was stopped because of node 1's failure.
  EXPECT_NE(n0.err.find("first failure on another node: rank 1 (node 1"), std::string::npos) << n0.err;
  EXPECT_EQ(count(n0.err, "stopped by SIGTERM"), 1) << n0.err;
  EXPECT_NE(n1.err.find("* 1 "), std::string::npos) << n1.err;
}

}  // namespace
}  // namespace paratrain::launch
