// This node's ranks of one attempt: starting them (start_local_ranks: a process each, its
// environment, its log file and its "[rank] " prefixed output) and what the launcher keeps of
// each while it runs (RankProc): its pipes, its line sinks, its report.
//
// A rank's stdout and stderr are non-blocking pipes; pump() moves what is in one into its
// sink (and closes it at the end of the stream); reap() takes a rank's exit status, drains
// its pipes and fills its report. Used from the launcher's thread only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/launch/child_env.h"
#include "paratrain/launch/launcher.h"
#include "paratrain/launch/output.h"
#include "paratrain/launch/process.h"
#include "paratrain/launch/rendezvous.h"

namespace paratrain::launch {

// One local rank while it runs.
struct RankProc {
  RankReport rep;
  Fd out, err, log;
  std::unique_ptr<LineSink> out_sink, err_sink;
  std::chrono::steady_clock::time_point start;
};

// What start_local_ranks needs to start an attempt's ranks.
struct LocalRanksSpec {
  std::string exe;                    // the program, resolved
  std::vector<std::string> argv;      // its argv (argv[0] as given)
  std::vector<std::string> base_env;  // the launcher's environment
  JobEnv job;                         // what every rank's environment says of the job
  RoundInfo round;                    // this attempt's ranks: rank_base, world_size
  int nproc = 1;                      // local ranks
  int node_rank = 0, nnodes = 1;
  std::string host;                   // this node's name, for the reports
  std::string log_dir;                // rank_<r>.log files there ("" = none)
  std::string flight_dir;             // PARATRAIN_FR_DUMP_DIR of every rank
  int attempt = 0;                    // 0: logs truncated; later: appended, under a restart line
};

// Starts spec.nproc ranks (global ranks rank_base ..), each with its environment
// (build_child_env), its log and its prefixed output; a stale error file of each is removed.
std::vector<RankProc> start_local_ranks(const LocalRanksSpec& spec);

// "exit code 3" or "signal 9 (SIGKILL)".
std::string describe_status(const RankReport& r);

// Reads everything available on fd into sink; closes fd on end of stream.
void pump(Fd& fd, LineSink* sink);

// The rank exited with waitpid status `status`: its output up to now is taken and its pipes
// closed (a subprocess of the rank may hold them open), its report says how and when it
// ended, its stderr tail and, in error_dir, its TORCHELASTIC_ERROR_FILE if it wrote one.
void reap(RankProc& p, int status, const std::string& error_dir);

}  // namespace paratrain::launch
