#include "launch/attempt_supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "launch/launcher_common.h"
#include "paratrain/base/log.h"

namespace paratrain::launch {
namespace {

constexpr int kTickMs = 100;              // poll wake-up while anything is pending
constexpr double kHeartbeatEveryS = 1.0;  // multi-node heartbeat period
constexpr double kStaleAfterS = 15.0;     // a node whose heartbeat stops this long is lost

}  // namespace

AttemptResult AttemptSupervisor::run() {
  while (true) {
    wait_for_events();
    handle_signals();
    // kill -USR1 to the launcher: the flight-recorder report; the job goes on.
    if (ctx_.signals.take_usr1()) ctx_.flight.report(watched(), "the launcher received SIGUSR1; the job goes on");
    for (RankProc& p : ranks_) {
      pump(p.out, p.out_sink.get());
      pump(p.err, p.err_sink.get());
    }
    handle_exits();
    check_hang();
    // Signal the group of every rank still alive once more if the grace period is over.
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) {
      killed_ = true;
      begin_stop(SIGKILL);
    }
    watch_other_nodes();
    if (!all_exited()) continue;
    if (!ctx_.rdzv || result_.store_lost || lost_node_and_done_) break;
    if (agree_with_other_nodes()) break;
  }
  conclude();
  return result_;
}

// Waits for output, a signal or the next tick.
void AttemptSupervisor::wait_for_events() {
  std::vector<pollfd> fds;
  fds.push_back({ctx_.signals.fd(), POLLIN, 0});
  for (RankProc& p : ranks_) {
    if (p.out.valid()) fds.push_back({p.out.get(), POLLIN, 0});
    if (p.err.valid()) fds.push_back({p.err.get(), POLLIN, 0});
  }
  const int timeout = ctx_.rdzv || stopping_ ? kTickMs : ctx_.options.hang_timeout_s > 0 ? 250 : 1000;
  ::poll(fds.data(), fds.size(), timeout);
}

// Signals to the launcher: forwarded to the ranks; a second one kills at once.
void AttemptSupervisor::handle_signals() {
  const LaunchOptions& o = ctx_.options;
  for (int sig : ctx_.signals.drain()) {
    if (!stopping_) {
      say("received " + signal_name(sig) + "; stopping the ranks (SIGKILL after " +
          std::to_string(o.grace_period_s).substr(0, 4) + " s)");
      if (!have_failure_) record_failure(launcher_signalled(sig));
      begin_stop(sig);
    } else if (!killed_) {
      killed_ = true;
      begin_stop(SIGKILL);
    }
  }
}

// Ranks that exited: reaped; the first failure stops the others, after the flight recorder's
// report of what every rank was doing (gathered before anything is stopped).
void AttemptSupervisor::handle_exits() {
  for (RankProc& p : ranks_) {
    if (p.rep.exited) continue;
    int st = 0;
    if (::waitpid(p.rep.pid, &st, WNOHANG) != p.rep.pid) continue;
    reap(p, st, ctx_.error_dir);
    if (p.rep.status_code() != 0 && !stopping_) {
      if (!failure_reported_ && ctx_.flight.any_recorder(watched())) {
        failure_reported_ = true;
        ctx_.flight.report(watched(), "rank " + std::to_string(p.rep.rank) + " failed with " + describe_status(p.rep));
      }
      record_failure(
          FailureInfo{p.rep.rank, ctx_.options.node_rank, ctx_.host, p.rep.status_code(), false, describe_status(p.rep)});
      begin_stop(SIGTERM);
    }
  }
}

// No collective advanced for --hang-timeout while some wait: report, then stop the job.
void AttemptSupervisor::check_hang() {
  const LaunchOptions& o = ctx_.options;
  if (o.hang_timeout_s <= 0 || stopping_) return;
  std::vector<WatchedRank> w = watched();
  const double stalled = ctx_.flight.stalled_s(w);
  if (stalled < o.hang_timeout_s) return;
  char what[160];
  std::snprintf(what, sizeof(what), "the job is hung: no collective advanced on any rank for %.1f s (--hang-timeout %g)",
                stalled, o.hang_timeout_s);
  say(what);
  failure_reported_ = true;
  ctx_.flight.report(w, what);
  record_failure(FailureInfo{-1, o.node_rank, ctx_.host, 1, false, what});
  begin_stop(SIGTERM);
}

// Other nodes: their failures, their heartbeats (a multi-node job, every tick).
void AttemptSupervisor::watch_other_nodes() {
  if (!ctx_.rdzv || result_.store_lost || seconds_since(last_check_) * 1000 < kTickMs) return;
  last_check_ = Clock::now();
  try {
    if (!stopping_) {
      if (auto f = ctx_.rdzv->failure(ctx_.attempt)) {
        have_failure_ = true;
        result_.failure = *f;
        begin_stop(SIGTERM);
      }
    }
    if (seconds_since(last_beat_) >= kHeartbeatEveryS) {
      last_beat_ = Clock::now();
      for (int n : ctx_.rdzv->heartbeat(ctx_.attempt, kStaleAfterS)) {
        const std::string& host = ctx_.round.nodes[static_cast<size_t>(n)].host;
        record_failure(
            FailureInfo{-1, n, host, 1, false, "node " + std::to_string(n) + " (" + host + ") stopped responding"});
        if (!stopping_) begin_stop(SIGTERM);
        lost_node_and_done_ = all_exited();
      }
    }
  } catch (const Error& e) {
    store_failed(e);
  }
}

bool AttemptSupervisor::agree_with_other_nodes() {
  try {
    if (!result_published_) {
      const bool ok = std::all_of(ranks_.begin(), ranks_.end(), [](const RankProc& p) { return p.rep.status_code() == 0; });
      ctx_.rdzv->publish_result(ctx_.attempt, ok && !have_failure_);
      result_published_ = true;
    }
    if (auto all = ctx_.rdzv->results(ctx_.attempt)) {
      if (!have_failure_ && std::find(all->begin(), all->end(), false) != all->end()) {
        have_failure_ = true;
        auto f = ctx_.rdzv->failure(ctx_.attempt);
        result_.failure = f ? *f : FailureInfo{-1, -1, "?", 1, false, "another node failed"};
      }
      return true;
    }
    return false;
  } catch (const Error& e) {
    store_failed(e);
    return true;
  }
}

bool AttemptSupervisor::all_exited() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const RankProc& p) { return p.rep.exited; });
}

std::vector<WatchedRank> AttemptSupervisor::watched() const {
  std::vector<WatchedRank> w;
  for (const RankProc& p : ranks_) w.push_back({p.rep.rank, p.rep.pid, p.rep.exited, describe_status(p.rep)});
  return w;
}

void AttemptSupervisor::begin_stop(int sig) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(ctx_.options.grace_period_s * 1e6));
  }
  for (RankProc& p : ranks_) {
    if (p.rep.exited) continue;
    PT_LOG_DEBUG(kLaunch, "sending ", signal_name(sig), " to rank ", p.rep.rank, " (pid ", p.rep.pid, ")");
    signal_child(p.rep.pid, sig);
    p.rep.stopped = true;
  }
}

void AttemptSupervisor::store_failed(const Error& e) {
  if (result_.store_lost) return;
  result_.store_lost = true;
  say(std::string("lost node 0's store at ") + ctx_.where + ": " + e.what());
  if (!have_failure_) {
    have_failure_ = true;
    result_.failure = FailureInfo{-1, 0, ctx_.round.nodes.front().host, 1, false,
                                  std::string("lost contact with node 0's store (") + e.what() + ")"};
  }
  begin_stop(SIGTERM);
}

void AttemptSupervisor::record_failure(const FailureInfo& f) {
  if (have_failure_) return;
  have_failure_ = true;
  result_.failure = f;
  if (ctx_.rdzv && !result_.store_lost) {
    try {
      result_.failure = ctx_.rdzv->publish_failure(ctx_.attempt, f);
    } catch (const Error& e) {
      store_failed(e);
    }
  }
}

// This node's launcher received `sig`: the failure it stands for (code 128 + sig).
FailureInfo AttemptSupervisor::launcher_signalled(int sig) const {
  const int node = ctx_.options.node_rank;
  return FailureInfo{-1, node, ctx_.host, 128 + sig, true,
                     "launcher on node " + std::to_string(node) + " received " + signal_name(sig)};
}

// The outcome: an interrupted launcher never restarts, and a failure that came first keeps
// its code.
void AttemptSupervisor::conclude() {
  const int interrupt = ctx_.signals.interrupt();
  if (interrupt != 0) {
    if (!have_failure_) result_.failure = launcher_signalled(interrupt);
    result_.failure.interrupted = true;
    have_failure_ = true;
  }
  if (!have_failure_) result_.outcome = Outcome::kSuccess;
  else result_.outcome = result_.failure.interrupted ? Outcome::kInterrupted : Outcome::kFailure;
}

}  // namespace paratrain::launch
