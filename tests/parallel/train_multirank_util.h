// Shared by the multi-rank training tests of tests/parallel: real `paratrain` processes
// started one by one, under `paratrain launch`, under a real mpirun, or with Slurm's
// variables set by hand, each in its own process group with a deadline past which all are
// killed; a fixture with a fresh directory holding the structured token file t.bin.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "support/weights_compare.h"
#include "support/free_port.h"

namespace paratrain::test {

namespace fs = std::filesystem;

inline const std::string kBin = PARATRAIN_BIN;


struct Result {
  std::vector<int> codes;  // exit code per process (-signal if killed)
  std::string output;
  bool timed_out = false;
  bool ok() const {
    if (timed_out) return false;
    for (int c : codes)
      if (c != 0) return false;
    return true;
  }
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs each argv (with its env additions) as its own process group, in `dir`; kills all past
// timeout_s.
inline Result spawn(const std::vector<std::vector<std::string>>& argvs, const std::vector<std::vector<std::string>>& envs,
             const std::string& dir, double timeout_s) {
  Result res;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (size_t i = 0; i < argvs.size(); ++i) {
    std::string log = dir + "/proc" + std::to_string(i) + ".log";
    logs.push_back(log);
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setpgid(0, 0);
      if (::chdir(dir.c_str()) != 0) ::_exit(126);
      for (const auto& kv : envs[i]) ::putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> args;
      for (const auto& a : argvs[i]) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  res.codes.assign(pids.size(), -1000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
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
          int st;
          ::waitpid(pids[i], &st, 0);
          res.codes[i] = -SIGKILL;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < logs.size(); ++i)
    res.output += "--- process " + std::to_string(i) + " (exit " + std::to_string(res.codes[i]) + ")\n" +
                  read_text(logs[i]);
  return res;
}

inline std::vector<std::string> split(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> out;
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

class TrainMultiRank : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_ddp_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    paratrain::test::write_structured_token_file(dir_ + "/t.bin");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string train_args(const std::string& extra) const {
    return "train --model gpt-nano --data t.bin --steps 10 --micro-batch 4 --threads 1 --quiet " + extra;
  }
  // One process.
  Result single(const std::string& args, double timeout_s = 60) {
    std::vector<std::string> argv = {kBin};
    for (auto& a : split(args)) argv.push_back(a);
    return spawn({argv}, {{}}, dir_, timeout_s);
  }
  // Under `paratrain launch --nproc-per-node n`.
  Result launch(int n, const std::string& args, double timeout_s = 90) {
    std::vector<std::string> argv = {kBin, "launch", "--nproc-per-node", std::to_string(n), "--", kBin};
    for (auto& a : split(args)) argv.push_back(a);
    return spawn({argv}, {{}}, dir_, timeout_s);
  }
  // Under a real mpirun.
  Result mpirun(int n, const std::string& args, double timeout_s = 90) {
    std::vector<std::string> argv = {"mpirun", "-np", std::to_string(n), "--oversubscribe", "--allow-run-as-root", kBin};
    for (auto& a : split(args)) argv.push_back(a);
    return spawn({argv}, {{}}, dir_, timeout_s);
  }
  // n processes with Slurm's variables set by hand (as srun would), plus MASTER_ADDR/PORT.
  Result slurm(int n, const std::string& args, double timeout_s = 90) {
    const int port = free_port();
    std::vector<std::vector<std::string>> argvs, envs;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> argv = {kBin};
      for (auto& a : split(args)) argv.push_back(a);
      argvs.push_back(argv);
      envs.push_back({"SLURM_PROCID=" + std::to_string(r), "SLURM_NTASKS=" + std::to_string(n),
                      "SLURM_LOCALID=" + std::to_string(r), "MASTER_ADDR=127.0.0.1",
                      "MASTER_PORT=" + std::to_string(port), "PARATRAIN_TOKEN=slurm-test"});
    }
    return spawn(argvs, envs, dir_, timeout_s);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The step lines (not the evaluation lines) of a metrics file.
  std::vector<nlohmann::json> steps_of(const std::string& metrics) const {
    std::vector<nlohmann::json> out;
    std::ifstream f(path(metrics));
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("eval")) out.push_back(j);
    }
    return out;
  }
  // Every weight of `a` within `tol` relative of `b` (per tensor, ||a-b||/||b||); with
  // `one_d_tol` > 0, 1-D tensors are held to that instead. Prints the worst.
  void expect_weights_near(const std::string& a, const std::string& b, double tol, double one_d_tol = 0) {
    const Weights wa = load_weights(path(a)), wb = load_weights(path(b));
    ASSERT_EQ(wa.size(), wb.size()) << a << " and " << b << " hold different tensors";
    const auto shapes = checkpoint::load_safetensors(path(b));
    double worst = 0;
    std::string worst_name;
    for (const auto& [name, vb] : wb) {
      ASSERT_TRUE(wa.count(name)) << a << " lacks " << name;
      ASSERT_EQ(wa.at(name).size(), vb.size()) << name;
      const double d = max_rel_diff(Weights{{name, wa.at(name)}}, Weights{{name, vb}});
      const bool one_d = shapes.at(name).dim() == 1;
      const double limit = one_d && one_d_tol > 0 ? one_d_tol : tol;
      EXPECT_LE(d, limit) << name << " of " << a << " vs " << b;
      if (d > worst) worst = d, worst_name = name;
    }
    std::printf("  %s vs %s: worst relative difference %.2e (%s)\n", a.c_str(), b.c_str(), worst, worst_name.c_str());
  }
  void expect_losses_near(const std::string& a, const std::string& b, double tol) {
    const auto la = steps_of(a), lb = steps_of(b);
    ASSERT_EQ(la.size(), lb.size());
    double worst = 0;
    for (size_t i = 0; i < la.size(); ++i) {
      const double x = la[i]["loss"].get<double>(), y = lb[i]["loss"].get<double>();
      worst = std::max(worst, std::fabs(x - y) / std::fabs(y));
      EXPECT_NEAR(x, y, tol * std::fabs(y)) << "step " << i;
    }
    std::printf("  losses %s vs %s: worst relative difference %.2e over %zu steps\n", a.c_str(), b.c_str(), worst,
                la.size());
  }
  std::string dir_;
};

}  // namespace paratrain::test
