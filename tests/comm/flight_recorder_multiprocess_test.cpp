// Real ranks (flight_recorder_helper): SIGUSR1 to a rank writes its flight-recorder dump and
// the rank keeps running; over tcp a rank stopped with SIGSTOP is noticed within the peer
// timeout and named. Every process has a deadline and is killed if it passes it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/flight_recorder.h"
#include "support/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;
const std::string kHelper = std::string(PARATRAIN_TEST_BIN_DIR) + "/flight_recorder_helper";

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

using paratrain::test::free_port;

// n ranks of the helper in `mode`; each rank's output goes to a log file.
struct Job {
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  std::vector<int> codes;  // exit code, -signal, or -1000 while running

  Job(int n, const std::string& mode, const std::vector<std::string>& extra_env) {
    int port = free_port();
    for (int r = 0; r < n; ++r) {
      std::string log = "/tmp/paratrain_fr_test_" + std::to_string(::getpid()) + "_" + std::to_string(r) + ".log";
      logs.push_back(log);
      std::vector<std::string> env = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                      "WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                                      "MASTER_PORT=" + std::to_string(port), "PARATRAIN_TOKEN=test-token"};
      env.insert(env.end(), extra_env.begin(), extra_env.end());
      pid_t pid = ::fork();
      if (pid == 0) {
        int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        for (auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
        ::execl(kHelper.c_str(), kHelper.c_str(), mode.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      pids.push_back(pid);
    }
    codes.assign(pids.size(), -1000);
  }
  ~Job() {
    for (size_t i = 0; i < pids.size(); ++i)
      if (codes[i] == -1000) {
        ::kill(pids[i], SIGKILL);
        int st;
        ::waitpid(pids[i], &st, 0);
      }
    for (auto& l : logs) ::unlink(l.c_str());
  }
  // Reaps the ranks in `which` (all if empty) until they exited or timeout_s passed.
  bool wait(double timeout_s, std::vector<size_t> which = {}) {
    if (which.empty())
      for (size_t i = 0; i < pids.size(); ++i) which.push_back(i);
    auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      bool all = true;
      for (size_t i : which) {
        if (codes[i] != -1000) continue;
        int st = 0;
        if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        else all = false;
      }
      if (all) return true;
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::string output() const {
    std::string s;
    for (size_t i = 0; i < logs.size(); ++i)
      s += "--- rank " + std::to_string(i) + " (exit " + std::to_string(codes[i]) + ")\n" + slurp(logs[i]);
    return s;
  }
};

std::string temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("paratrain_fr_mp_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

TEST(FlightRecorderProcesses, Sigusr1WritesADumpAndTheRankContinues) {
  const std::string dir = temp_dir();
  Job job(2, "usr1", {"PARATRAIN_BACKEND=shm", "PARATRAIN_FR_DUMP_DIR=" + dir, "PARATRAIN_COMM_TIMEOUT_S=60"});
  // Once rank 0 finished its 5 allreduces (its progress file says so), ask it for a dump.
  auto until = Clock::now() + std::chrono::seconds(30);
  std::optional<paratrain::comm::FlightProgressSnapshot> prog;
  while (Clock::now() < until) {
    prog = paratrain::comm::read_flight_progress(paratrain::comm::flight_progress_path(dir, 0));
    if (prog && prog->finished >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(prog && prog->finished >= 5) << job.output();
  EXPECT_EQ(prog->pid, job.pids[0]);
  ASSERT_EQ(::kill(job.pids[0], SIGUSR1), 0);
  ASSERT_TRUE(job.wait(60)) << job.output();
  EXPECT_EQ(job.codes[0], 0) << job.output();
  EXPECT_EQ(job.codes[1], 0) << job.output();
  EXPECT_NE(job.output().find("rank 0 continued"), std::string::npos) << job.output();

  auto j = nlohmann::json::parse(slurp(paratrain::comm::flight_dump_path(dir, 0)));
  EXPECT_EQ(j["reason"], "sigusr1");
  EXPECT_EQ(j["rank"], 0);
  EXPECT_EQ(j["pid"], job.pids[0]);
  ASSERT_EQ(j["groups"].size(), 1u);
  EXPECT_EQ(j["groups"][0]["name"], "world");
  EXPECT_EQ(j["groups"][0]["backend"], "shm");
  EXPECT_EQ(j["groups"][0]["ranks"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(j["groups"][0]["last_completed"]["op"], "allreduce");
  EXPECT_EQ(j["groups"][0]["last_completed"]["seq"], 4);
  int completed = 0;
  for (const auto& r : j["records"])
    if (r["op"] == "allreduce" && r["state"] == "completed") {
      ++completed;
      EXPECT_EQ(r["count"], 16);
      EXPECT_EQ(r["bytes"], 64);
    }
  EXPECT_EQ(completed, 5);
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorderProcesses, TcpNamesAStoppedRankWithinThePeerTimeout) {
  std::string meet = (std::filesystem::temp_directory_path() / "pt_fr_meet_XXXXXX").string();
  ASSERT_NE(::mkdtemp(meet.data()), nullptr);
  Job job(3, "stop",
          {"PARATRAIN_BACKEND=tcp", "PARATRAIN_PEER_TIMEOUT_S=2", "PARATRAIN_COMM_TIMEOUT_S=60", "FR_MEET_DIR=" + meet});
  // Ranks 0 and 2 must fail long before the 60 s deadline (rank 1 stays stopped).
  const bool done = job.wait(30, {0, 2});
  std::string out = job.output();
  ASSERT_TRUE(done) << out;
  for (size_t r : {size_t(0), size_t(2)}) {
    EXPECT_EQ(job.codes[r], 3) << out;
    const std::string line = slurp(job.logs[r]);
    EXPECT_NE(line.find("rank 1 stopped responding"), std::string::npos) << out;
  }
  ::kill(job.pids[1], SIGKILL);
  job.wait(10, {1});
  std::filesystem::remove_all(meet);
}

}  // namespace
