// The command line of `paratrain launch` (docs/launch.md).
//
// parse_launch_args() turns the arguments after "launch" into LaunchOptions and checks
// everything that can be checked without side effects: unknown or malformed flags, a
// --node-rank outside --nnodes, a missing program. Problems are InputError with one line
// naming the flag. It does not touch the network or start anything; the port and the
// program's executability are checked by Launcher before any child starts.
//
// Thread-safety: plain functions over values.
#pragma once

#include <string>
#include <vector>

namespace paratrain::launch {

constexpr int kDefaultMasterPort = 29500;   // multi-node default, as torchrun
constexpr double kDefaultRdzvTimeoutS = 300;
constexpr double kDefaultGracePeriodS = 5;

struct LaunchOptions {
  int nproc_per_node = 1;         // local ranks on this node (resolved when nproc_auto)
  bool nproc_auto = false;        // --nproc-per-node auto: one per GPU, else one per core group
  int nnodes = 1;                 // nodes in the job
  int node_rank = 0;              // this node's index, 0..nnodes-1 (node 0 hosts the store)
  std::string master_addr = "127.0.0.1";  // where node 0's store listens
  int master_port = -1;           // -1 = not given: a free port on one node, 29500 on many
  int max_restarts = 0;           // whole-group restarts after a failure
  std::string log_dir;            // "" = no per-rank log files
  double rdzv_timeout_s = kDefaultRdzvTimeoutS;  // deadline for all nodes to meet
  double grace_period_s = kDefaultGracePeriodS;  // SIGTERM -> SIGKILL delay when stopping
  double hang_timeout_s = 0;      // no collective progress for this long = hung (0 = off)
  bool help = false;              // --help: print usage, run nothing
  std::vector<std::string> program;  // PROGRAM ARGS..., program[0] as given
};

// Parses the arguments after "launch" (argv[1..]). Throws InputError for bad usage.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// The usage text of `paratrain launch --help`.
std::string launch_usage();

}  // namespace paratrain::launch
