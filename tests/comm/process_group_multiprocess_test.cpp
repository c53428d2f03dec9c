// Multi-process ProcessGroup tests: real ranks (process_group_helper) over shm, tcp and
// mpi (under a real mpirun), plus the failure cases. Every spawned process has a deadline
// and is killed if it passes it; the tests check that a job leaves no segment of its own in
// /dev/shm (other tests running at the same time may have theirs there).
#include <dirent.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <filesystem>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/free_port.h"

namespace {

const std::string kHelper = std::string(PARATRAIN_TEST_BIN_DIR) + "/process_group_helper";

struct Result {
  std::vector<pid_t> pids;  // one per process
  std::vector<int> codes;  // exit code per process (-signal if killed)
  std::string output;
  bool timed_out = false;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

using paratrain::test::free_port;

// Starts `procs` processes (argv each), with per-process env additions; waits up to timeout_s.
Result spawn(const std::vector<std::vector<std::string>>& argvs, const std::vector<std::vector<std::string>>& envs,
             double timeout_s) {
  Result res;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (size_t i = 0; i < argvs.size(); ++i) {
    std::string log = "/tmp/paratrain_comm_test_" + std::to_string(::getpid()) + "_" + std::to_string(i) + ".log";
    logs.push_back(log);
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setpgid(0, 0);
      for (const auto& kv : envs[i]) ::putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> args;
      for (const auto& a : argvs[i]) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  res.pids = pids;
  res.codes.assign(pids.size(), -1000);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (res.codes[i] != -1000) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        res.codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      res.timed_out = true;
      for (size_t i = 0; i < pids.size(); ++i)
        if (res.codes[i] == -1000) {
          ::kill(-pids[i], SIGKILL);
          ::kill(pids[i], SIGKILL);
          int st;
          ::waitpid(pids[i], &st, 0);
          res.codes[i] = -SIGKILL;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < logs.size(); ++i) {
    res.output += "--- process " + std::to_string(i) + " (exit " + std::to_string(res.codes[i]) + ")\n" +
                  read_file(logs[i]);
    ::unlink(logs[i].c_str());
  }
  return res;
}

Result run_ranks(int n, const std::string& mode, const std::vector<std::string>& extra_env, double timeout_s = 90,
                 const std::string& program = kHelper) {
  int port = free_port();
  std::vector<std::vector<std::string>> argvs, envs;
  for (int r = 0; r < n; ++r) {
    argvs.push_back({program, mode});
    std::vector<std::string> env = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                    "WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port), "PARATRAIN_TOKEN=test-token"};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    envs.push_back(env);
  }
  return spawn(argvs, envs, timeout_s);
}

// The job's segments left in /dev/shm: a segment is named paratrain-<creator pid>-r<rank>-...
// (shm_transport.cpp), so these are the ones created by the job's processes.
int job_shm_segments(const Result& job) {
  int count = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      for (pid_t pid : job.pids)
        if (name.rfind("paratrain-" + std::to_string(pid) + "-", 0) == 0) ++count;
    }
    ::closedir(d);
  }
  return count;
}

void expect_all_ok(const Result& r) {
  EXPECT_FALSE(r.timed_out) << r.output;
  for (int c : r.codes) EXPECT_EQ(c, 0) << r.output;
}

struct Param {
  const char* backend;
  int n;
};
class MultiProcess : public ::testing::TestWithParam<Param> {};

TEST_P(MultiProcess, EveryOpDtypeAndCount) {
  auto [backend, n] = GetParam();
  Result r = run_ranks(n, "ops", {std::string("PARATRAIN_BACKEND=") + backend});
  expect_all_ok(r);
  EXPECT_EQ(job_shm_segments(r), 0);
}

TEST_P(MultiProcess, RankOrderedAllreduceIsBitIdentical) {
  auto [backend, n] = GetParam();
  expect_all_ok(run_ranks(n, "deterministic", {std::string("PARATRAIN_BACKEND=") + backend}));
}

INSTANTIATE_TEST_SUITE_P(Comm, MultiProcess,
                         ::testing::Values(Param{"shm", 1}, Param{"shm", 2}, Param{"shm", 3}, Param{"shm", 4},
                                           Param{"tcp", 2}, Param{"tcp", 3}, Param{"tcp", 4}),
                         [](const auto& info) {
                           return std::string(info.param.backend) + "_n" + std::to_string(info.param.n);
                         });

// Non-blocking send/recv between real processes: both ranks send 64 MiB to each other before
// either receives (a large send waits for nothing but its own recv), and a ring where every
// rank sends to both neighbours at once, around the eager, slot and staging sizes.
class P2p : public ::testing::TestWithParam<const char*> {};

TEST_P(P2p, TwoRanksBothSend64MiBFirstThenReceive) {
  Result r = run_ranks(2, "p2p_swap", {std::string("PARATRAIN_BACKEND=") + GetParam()}, 120);
  expect_all_ok(r);
  EXPECT_EQ(job_shm_segments(r), 0);
}

TEST_P(P2p, FourRanksSendToBothNeighboursThenReceive) {
  Result r = run_ranks(4, "p2p_ring", {std::string("PARATRAIN_BACKEND=") + GetParam()}, 120);
  expect_all_ok(r);
  EXPECT_EQ(job_shm_segments(r), 0);
}

// A recv waiting for a rank that dies fails naming it, within the peer timeout (the group's
// deadline is 60 s here).
TEST_P(P2p, ARecvFromARankThatDiesFailsNamingIt) {
  Result r = run_ranks(2, "p2p_kill",
                       {std::string("PARATRAIN_BACKEND=") + GetParam(), "PARATRAIN_PEER_TIMEOUT_S=5",
                        "PARATRAIN_COMM_TIMEOUT_S=60"},
                       60);
  EXPECT_FALSE(r.timed_out) << r.output;
  ASSERT_EQ(r.codes.size(), 2u);
  EXPECT_EQ(r.codes[0], 0) << r.output;
  EXPECT_EQ(r.codes[1], -SIGKILL) << r.output;
  EXPECT_EQ(job_shm_segments(r), 0) << "segments the job left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(Comm, P2p, ::testing::Values("shm", "tcp"));

class KilledRank : public ::testing::TestWithParam<const char*> {};

TEST_P(KilledRank, SurvivorsFailNamingTheDeadRankAndShmIsClean) {
  Result r = run_ranks(3, "kill", {std::string("PARATRAIN_BACKEND=") + GetParam(), "PARATRAIN_PEER_TIMEOUT_S=10"}, 60);
  EXPECT_FALSE(r.timed_out) << r.output;
  ASSERT_EQ(r.codes.size(), 3u);
  EXPECT_EQ(r.codes[0], 0) << r.output;
  EXPECT_EQ(r.codes[1], 0) << r.output;
  EXPECT_EQ(r.codes[2], -SIGKILL) << r.output;
  EXPECT_NE(r.output.find("rank 2"), std::string::npos) << r.output;
  EXPECT_EQ(job_shm_segments(r), 0) << "segments the job left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(Comm, KilledRank, ::testing::Values("shm", "tcp"));

// The end of a run (shm_shutdown_helper): rank 0 finishes its part of the last collective
// (the root of a chain broadcast only sends), destroys its group and exits, while rank 2
// still waits for rank 1's data. Rank 1 enters only after rank 0's process is gone and twice
// the peer timeout has passed: a clean exit is neither a death nor a silent peer.
class RankExits : public ::testing::TestWithParam<const char*> {};

TEST_P(RankExits, ARankThatLeftAndExitedFailsNoWaitForAnotherRanksData) {
  Result r = run_ranks(3, "", {std::string("PARATRAIN_BACKEND=") + GetParam(), "PARATRAIN_PEER_TIMEOUT_S=1"}, 60,
                       std::string(PARATRAIN_TEST_BIN_DIR) + "/shm_shutdown_helper");
  expect_all_ok(r);
  EXPECT_EQ(job_shm_segments(r), 0) << "segments the job left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(Comm, RankExits, ::testing::Values("shm", "tcp"));

TEST(MultiProcessFailures, MismatchedCollectiveInDebugMode) {
  Result r = run_ranks(3, "mismatch", {"PARATRAIN_DEBUG=detail", "PARATRAIN_BACKEND=shm"}, 60);
  expect_all_ok(r);
}

TEST(MultiProcessFailures, DeadlinePassesNamingTheMissingRank) {
  Result r = run_ranks(2, "deadline", {"PARATRAIN_COMM_TIMEOUT_S=5", "PARATRAIN_BACKEND=shm"}, 60);
  expect_all_ok(r);
  EXPECT_NE(r.output.find("allreduce #0"), std::string::npos) << r.output;
}

TEST(MultiProcessMpi, EveryOpUnderMpirun) {
  ASSERT_EQ(::access("/usr/bin/mpirun", X_OK), 0) << "mpirun is missing: scripts/install_deps.sh installs openmpi-bin";
  for (int n : {1, 2, 3, 4}) {
    std::vector<std::vector<std::string>> argvs = {{"mpirun", "-np", std::to_string(n), "--oversubscribe",
                                                    "--allow-run-as-root", "--mca", "btl", "self,vader",
                                                    "-x", "PARATRAIN_BACKEND=mpi", kHelper, "ops"}};
    Result r = spawn(argvs, {{"OMPI_MCA_rmaps_base_oversubscribe=1"}}, 120);
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.codes[0], 0) << r.output;
    EXPECT_NE(r.output.find("(mpi)"), std::string::npos) << r.output;
  }
}

// The flight recorder under mpirun: both ranks' dumps (on SIGUSR1) hold the mpi group and
// its three completed allreduces.
TEST(MultiProcessMpi, FlightRecorderDumpsUnderMpirun) {
  ASSERT_EQ(::access("/usr/bin/mpirun", X_OK), 0) << "mpirun is missing: scripts/install_deps.sh installs openmpi-bin";
  std::string dir = (std::filesystem::temp_directory_path() / "pt_fr_mpi_XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  std::vector<std::vector<std::string>> argvs = {{"mpirun", "-np", "2", "--oversubscribe", "--allow-run-as-root", "--mca",
                                                  "btl", "self,vader", "-x", "PARATRAIN_BACKEND=mpi", "-x",
                                                  "PARATRAIN_FR_DUMP_DIR=" + dir, kHelper, "fr_usr1"}};
  Result r = spawn(argvs, {{"OMPI_MCA_rmaps_base_oversubscribe=1"}}, 120);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.codes[0], 0) << r.output;
  for (int rank : {0, 1}) {
    std::ifstream f(dir + "/rank_" + std::to_string(rank) + ".fr.json");
    ASSERT_TRUE(f) << "rank " << rank << ": no dump\n" << r.output;
    const nlohmann::json d = nlohmann::json::parse(f);
    EXPECT_EQ(d["format"], "paratrain-flight-recorder/1");
    EXPECT_EQ(d["rank"], rank);
    EXPECT_EQ(d["reason"], "sigusr1");
    ASSERT_FALSE(d["groups"].empty());
    EXPECT_EQ(d["groups"][0]["backend"], "mpi");
    int allreduces = 0;
    for (const auto& rec : d["records"])
      allreduces += rec["op"] == "allreduce" && rec["state"] == "completed" && rec["count"] == 256;
    EXPECT_EQ(allreduces, 3) << d.dump();
  }
  std::filesystem::remove_all(dir);
}

// The same non-blocking pattern under mpirun (MPI_Isend / MPI_Irecv, completed in the
// background).
TEST(MultiProcessMpi, SendRecvDoNotBlockEachOtherUnderMpirun) {
  ASSERT_EQ(::access("/usr/bin/mpirun", X_OK), 0) << "mpirun is missing: scripts/install_deps.sh installs openmpi-bin";
  for (const char* mode : {"p2p_swap", "p2p_ring"}) {
    std::vector<std::vector<std::string>> argvs = {{"mpirun", "-np", mode == std::string("p2p_swap") ? "2" : "4",
                                                    "--oversubscribe", "--allow-run-as-root", "--mca", "btl",
                                                    "self,vader", "-x", "PARATRAIN_BACKEND=mpi", kHelper, mode}};
    Result r = spawn(argvs, {{"OMPI_MCA_rmaps_base_oversubscribe=1"}}, 120);
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.codes[0], 0) << r.output;
    EXPECT_NE(r.output.find("(mpi)"), std::string::npos) << r.output;
  }
}

}  // namespace
