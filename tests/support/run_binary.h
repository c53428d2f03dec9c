// Test support: run a command (usually the `paratrain` binary) with a timeout and capture
// its output and exit code.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace paratrain::test {

struct CommandResult {
  int rc = -1;          // exit code, or 128 + signal
  std::string out;      // stdout and stderr, interleaved
};

// Runs the shell command line `cmd` (already quoted for sh; stdout and stderr together).
inline CommandResult run_shell_line(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs `PARATRAIN_BIN args` through the shell under `timeout timeout_s`.
inline CommandResult run_paratrain(const std::string& args, int timeout_s = 120) {
  return run_shell_line("timeout " + std::to_string(timeout_s) + " " + PARATRAIN_BIN + " " + args + " 2>&1");
}

}  // namespace paratrain::test
