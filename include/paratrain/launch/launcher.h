// The launcher: starts the local ranks of a job, watches them, restarts or stops them
// (docs/launch.md). The engine behind `paratrain launch`.
//
// Launcher::run() checks what can be checked before any child starts (the program exists
// and is executable, node 0's ports are free; InputError otherwise), hosts the paratrain
// ranks' TcpStoreServer on node 0 on a port the kernel picks (PARATRAIN_STORE_PORT, a fresh
// one for every attempt; MASTER_PORT is left to the program's rank 0, e.g. PyTorch's
// TCPStore) and, on a multi-node job, the launchers' rendezvous store at MASTER_PORT+1,
// meets the other nodes there, then for each
// attempt starts nproc_per_node children (spawn_child) and supervises them in one poll
// loop on the calling thread: output is cut into prefixed lines, exits are reaped, and
// SIGINT/SIGTERM/SIGHUP received by the launcher are forwarded to every child. The first
// child that exits non-zero or by a signal (on any node) stops the others: SIGTERM, then
// SIGKILL after the grace period. With restarts left, the whole group starts again (a new
// rendezvous round, the same token); otherwise run() prints the summary table to stderr and
// returns the first failure's exit code (a signal s gives 128 + s). A job where every rank
// exits 0 returns 0.
//
// run() installs handlers for SIGINT, SIGTERM, SIGHUP, SIGCHLD and ignores SIGPIPE while it
// runs, restoring the previous dispositions when it returns. It reaps only its own
// children (waitpid by pid). Call it from the thread that will outlive the children
// (PR_SET_PDEATHSIG, see process.h). One run() at a time per process.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "paratrain/launch/options.h"

namespace paratrain::launch {

// How one rank of the last attempt ended.
struct RankReport {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  std::string host;
  bool exited = false;        // reaped
  int exit_code = 0;          // when it exited normally
  int term_signal = 0;        // when it died by a signal
  bool stopped = false;       // we signalled it (stopping the group)
  double run_s = 0;           // seconds from start to exit
  std::vector<std::string> stderr_tail;  // its last stderr lines
  std::string error_file;     // the TORCHELASTIC_ERROR_FILE it wrote (with --log-dir), or ""
  // 0 for success, the code for a non-zero exit, 128 + signal for a signal.
  int status_code() const { return term_signal ? 128 + term_signal : exit_code; }
};

struct LaunchReport {
  int exit_code = 0;
  int restarts_used = 0;
  int first_failed_rank = -1;        // global rank of the first failure (any node), -1: none
  std::string failure;               // one line describing the first failure
  std::vector<RankReport> ranks;     // this node's ranks in the last attempt
  double startup_s = 0;              // last attempt: launcher start -> all children forked
};

class Launcher {
 public:
  explicit Launcher(LaunchOptions options);
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  // Runs the job; returns the launcher's exit code. Throws InputError for bad usage
  // found before any child starts, Error for a failed rendezvous.
  int run();
  const LaunchReport& report() const { return report_; }

 private:
  LaunchOptions options_;
  LaunchReport report_;
};

// Formats the summary table printed after a failure.
std::string format_summary(const LaunchReport& report, int max_restarts);

// `paratrain launch ARGS...`: parses (args exclude "launch"), prints usage for --help,
// runs. Returns the exit code; throws InputError for bad usage.
int run_launch_command(const std::vector<std::string>& args);

}  // namespace paratrain::launch
