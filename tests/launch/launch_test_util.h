// Running the launcher (and other programs) from the launch tests: a subprocess with a
// deadline, its stdout and stderr captured.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "support/free_port.h"

namespace paratrain::launch::testing {

struct Proc {
  pid_t pid = -1;
  int out = -1, err = -1;
};

struct RunResult {
  int status = -1;      // exit code, or 128 + signal
  bool timed_out = false;
  std::string out, err;
  double seconds = 0;
};

// Starts argv with extra environment variables (KEY=VALUE; "KEY=" unsets KEY).
inline Proc start(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  int o[2], e[2];
  if (::pipe2(o, O_CLOEXEC) != 0 || ::pipe2(e, O_CLOEXEC) != 0) return {};
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(o[1], 1);
    ::dup2(e[1], 2);
    int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, 0);
    for (const auto& kv : env) {
      auto eq = kv.find('=');
      std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (v.empty()) ::unsetenv(k.c_str());
      else ::setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(o[1]);
  ::close(e[1]);
  return Proc{pid, o[0], e[0]};
}

// Collects the output of p until it exits (or the deadline: SIGKILL to its group).
inline RunResult finish(Proc p, double timeout_s) {
  RunResult r;
  auto t0 = std::chrono::steady_clock::now();
  auto deadline = t0 + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  int fds[2] = {p.out, p.err};
  std::string* bufs[2] = {&r.out, &r.err};
  while (fds[0] >= 0 || fds[1] >= 0) {
    pollfd pf[2];
    int n = 0;
    int idx[2];
    for (int i = 0; i < 2; ++i)
      if (fds[i] >= 0) {
        pf[n] = {fds[i], POLLIN, 0};
        idx[n++] = i;
      }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(-p.pid, SIGKILL);
      ::kill(p.pid, SIGKILL);
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      left = std::chrono::milliseconds(100);
    }
    ::poll(pf, static_cast<nfds_t>(n), static_cast<int>(std::min<int64_t>(left.count(), 200)));
    for (int j = 0; j < n; ++j) {
      if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t k = ::read(pf[j].fd, buf, sizeof(buf));
      if (k > 0) {
        bufs[idx[j]]->append(buf, static_cast<size_t>(k));
      } else if (k == 0 || errno != EINTR) {
        ::close(fds[idx[j]]);
        fds[idx[j]] = -1;
      }
    }
  }
  int st = 0;
  while (true) {
    pid_t w = ::waitpid(p.pid, &st, WNOHANG);
    if (w == p.pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &st, 0);
      break;
    }
    ::usleep(2000);
  }
  r.status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline RunResult run(const std::vector<std::string>& argv, double timeout_s, const std::vector<std::string>& env = {}) {
  return finish(start(argv, env), timeout_s);
}

// True while pid exists and is not a zombie.
inline bool alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  char state = line[close_paren + 2];
  return state != 'Z' && state != 'X';
}

// Lines of `text` that start with `prefix`.
inline std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return out;
}

// For each "[r] KEY=VALUE" line: vars[r][KEY] = VALUE.
inline std::map<int, std::map<std::string, std::string>> rank_vars(const std::string& text) {
  std::map<int, std::map<std::string, std::string>> out;
  for (const auto& line : lines_with(text, "[")) {
    auto close = line.find("] ");
    if (close == std::string::npos) continue;
    int r = std::atoi(line.substr(1, close - 1).c_str());
    std::string rest = line.substr(close + 2);
    auto eq = rest.find('=');
    if (eq == std::string::npos) continue;
    out[r][rest.substr(0, eq)] = rest.substr(eq + 1);
  }
  return out;
}

// The torchrun variables of rank `rank` of an n-rank job on one node (v: rank_vars()'s map).
inline void expect_one_node_rank_vars(std::map<std::string, std::string>& v, int rank, int n) {
  EXPECT_EQ(v["RANK"], std::to_string(rank));
  EXPECT_EQ(v["LOCAL_RANK"], std::to_string(rank));
  EXPECT_EQ(v["WORLD_SIZE"], std::to_string(n));
  EXPECT_EQ(v["LOCAL_WORLD_SIZE"], std::to_string(n));
  EXPECT_EQ(v["GROUP_RANK"], "0");
  EXPECT_EQ(v["GROUP_WORLD_SIZE"], "1");
  EXPECT_EQ(v["ROLE_RANK"], std::to_string(rank));
  EXPECT_EQ(v["ROLE_WORLD_SIZE"], std::to_string(n));
}

// A TCP port P such that P and P + 1 are this test's alone (support/free_port.h): the
// launcher uses --master-port for the job's store and --master-port + 1 for the launchers'
// rendezvous.
inline int free_port() { return paratrain::test::free_port(2); }

// Two network namespaces joined by a veth pair, for a two-node job on one machine (root
// only): namespace ns[i] holds dev[i] with addr[i] = <subnet>.<i+1>/24, and its loopback up.
// Names carry `tag` and this process's pid, so concurrent tests do not collide; the
// destructor deletes both namespaces (and with them the pair).
class NetnsPairSetup {
 public:
  NetnsPairSetup() = default;
  NetnsPairSetup(const NetnsPairSetup&) = delete;
  NetnsPairSetup& operator=(const NetnsPairSetup&) = delete;
  ~NetnsPairSetup() {
    if (!made_) return;
    run({"ip", "netns", "del", ns[0]}, 10);
    run({"ip", "netns", "del", ns[1]}, 10);
  }
  // "" once made; otherwise why they cannot be made here (not root, a command that failed).
  std::string make(const std::string& tag, const std::string& subnet) {
    if (::geteuid() != 0) return "network namespaces need root (euid " + std::to_string(::geteuid()) + ")";
    const std::string id = tag + std::to_string(::getpid());
    for (int i = 0; i < 2; ++i) {
      ns[i] = id + "_ns" + std::to_string(i);
      dev[i] = (tag + std::to_string(i) + "_" + std::to_string(::getpid())).substr(0, 15);  // IFNAMSIZ - 1
      addr[i] = subnet + "." + std::to_string(i + 1);
    }
    std::vector<std::vector<std::string>> cmds = {
        {"ip", "netns", "add", ns[0]},
        {"ip", "netns", "add", ns[1]},
        {"ip", "link", "add", dev[0], "type", "veth", "peer", "name", dev[1]},
        {"ip", "link", "set", dev[0], "netns", ns[0]},
        {"ip", "link", "set", dev[1], "netns", ns[1]},
        {"ip", "-n", ns[0], "addr", "add", addr[0] + "/24", "dev", dev[0]},
        {"ip", "-n", ns[1], "addr", "add", addr[1] + "/24", "dev", dev[1]},
        {"ip", "-n", ns[0], "link", "set", dev[0], "up"},
        {"ip", "-n", ns[1], "link", "set", dev[1], "up"},
        {"ip", "-n", ns[0], "link", "set", "lo", "up"},
        {"ip", "-n", ns[1], "link", "set", "lo", "up"},
    };
    for (size_t c = 0; c < cmds.size(); ++c) {
      auto r = run(cmds[c], 10);
      if (c < 2 && r.status == 0) made_ = true;
      if (r.status != 0) {
        std::string cmd;
        for (const auto& a : cmds[c]) cmd += a + " ";
        return "cannot make network namespaces here (" + cmd + "failed: " + r.err + ")";
      }
    }
    return "";
  }
  // The prefix that runs a command in namespace i.
  std::vector<std::string> exec(int i) const { return {"ip", "netns", "exec", ns[i]}; }
  std::string ns[2], dev[2], addr[2];

 private:
  bool made_ = false;
};

}  // namespace paratrain::launch::testing
