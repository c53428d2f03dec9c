// AttemptSupervisor: one attempt of a launch, from its ranks' start to its end (Launcher::run's
// steps 3 and 4), in one poll loop on the calling thread. It wakes on a rank's output, a signal
// (SignalScope's pipe, SIGCHLD included) or a tick, and
//   - cuts the ranks' output into prefixed lines (their LineSinks) and reaps their exits;
//   - forwards SIGINT/SIGTERM/SIGHUP to every live rank (a second one: SIGKILL at once), and
//     answers SIGUSR1 with the flight recorder's report (the job goes on);
//   - on the first failure (a rank's non-zero exit or signal, another node's published
//     failure, a node that stopped responding, the lost store of node 0, or --hang-timeout
//     with no collective advancing) records it (published to the other nodes), reports what
//     every rank was doing where the flight recorder can tell, SIGTERMs every live rank and
//     SIGKILLs what is left after the grace period;
//   - on a multi-node job bumps this node's heartbeat and watches the others';
//   - once every local rank is reaped, publishes this node's result and waits until every
//     node's is in (not for a lost node or a lost store).
// run() returns how the attempt ended; the RankProcs hold each rank's report.
// Thread-safety: the launcher's thread only. The context's references outlive the supervisor.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "launch/flight_watch.h"
#include "launch/local_ranks.h"
#include "launch/signal_scope.h"
#include "paratrain/base/error.h"
#include "paratrain/launch/options.h"
#include "paratrain/launch/rendezvous.h"

namespace paratrain::launch {

// What the supervisor of an attempt reads (owned by Launcher::run).
struct AttemptContext {
  const LaunchOptions& options;
  const std::string& host;       // this node's name
  const std::string& where;      // the launchers' store, for messages
  NodeRendezvous* rdzv;          // a multi-node job's; null on one node
  const RoundInfo& round;        // this attempt's nodes
  int attempt;
  const std::string& error_dir;  // where ranks write TORCHELASTIC_ERROR_FILEs ("" = none)
  SignalScope& signals;
  FlightWatch& flight;
};

enum class Outcome { kSuccess, kFailure, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSuccess;
  FailureInfo failure;      // the first failure of any node (outcome != kSuccess)
  bool store_lost = false;  // node 0's store stopped answering: no restart
};

class AttemptSupervisor {
 public:
  AttemptSupervisor(const AttemptContext& ctx, std::vector<RankProc>& ranks) : ctx_(ctx), ranks_(ranks) {}
  AttemptSupervisor(const AttemptSupervisor&) = delete;
  AttemptSupervisor& operator=(const AttemptSupervisor&) = delete;
  // Supervises until the attempt is over (above); an interrupted launcher's attempt is
  // kInterrupted, keeping a failure that came first (and its code).
  AttemptResult run();

 private:
  using Clock = std::chrono::steady_clock;
  void wait_for_events();
  void handle_signals();
  void handle_exits();
  void check_hang();
  void watch_other_nodes();
  // Step 4, every local rank reaped: true when the attempt is over.
  bool agree_with_other_nodes();
  bool all_exited() const;
  std::vector<WatchedRank> watched() const;
  void begin_stop(int sig);
  void store_failed(const Error& e);
  void record_failure(const FailureInfo& f);
  FailureInfo launcher_signalled(int sig) const;
  void conclude();

  const AttemptContext& ctx_;
  std::vector<RankProc>& ranks_;
  AttemptResult result_;
  bool have_failure_ = false;
  bool failure_reported_ = false;  // the flight recorder's report was printed
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_{};
  bool result_published_ = false;
  bool lost_node_and_done_ = false;  // a lost node never posts its result: stop waiting for it
  Clock::time_point last_beat_ = Clock::now() - std::chrono::hours(1);
  Clock::time_point last_check_ = last_beat_;
};

}  // namespace paratrain::launch
