// The launcher's engine (paratrain/launch/launcher.h): the job is set up once (job_setup.h:
// checks, ports, the multi-node rendezvous), then each attempt
//   (0) node 0 hosts a fresh store for the paratrain ranks;
//   (1) meets the other nodes (NodeRendezvous, multi-node only);
//   (2) starts the local ranks (local_ranks.h);
//   (3) supervises them in one poll loop until every one is reaped, and (4) on a multi-node
//       job agrees with the other nodes on the attempt's result (attempt_supervisor.h).
// Then it restarts (a failure, restarts left, not interrupted, node 0's store still there) or
// returns, printing the summary table after a failure or a restart.
#include "paratrain/launch/launcher.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "launch/attempt_supervisor.h"
#include "launch/flight_watch.h"
#include "launch/job_setup.h"
#include "launch/local_ranks.h"
#include "launch/launcher_common.h"
#include "launch/signal_scope.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "paratrain/launch/child_env.h"
#include "paratrain/launch/process.h"
#include "paratrain/launch/rendezvous.h"

namespace paratrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kAckTimeoutS = 10.0;  // node 0 keeps its store up this long for the others

// Step (1): the attempt's round of the rendezvous (multi-node), or this node alone. nullopt
// when a signal interrupted the rendezvous (no rank was started).
std::optional<RoundInfo> meet(const LaunchOptions& o, const JobSetup& job, int attempt, SignalScope& signals) {
  if (!job.rdzv) {
    RoundInfo round;
    round.attempt = attempt;
    round.nodes = {NodeInfo{0, job.nproc, job.host}};
    round.rank_base = 0;
    round.world_size = job.nproc;
    return round;
  }
  try {
    return job.rdzv->join(attempt, job.nproc, job.host, o.rdzv_timeout_s, [&] {
      signals.drain();
      return signals.interrupt() != 0;
    });
  } catch (const Error&) {
    if (signals.interrupt() == 0) throw;
    return std::nullopt;
  }
}

// What every rank's environment says of the job in this attempt.
JobEnv job_env(const LaunchOptions& o, const JobSetup& job, int attempt, int store_port) {
  JobEnv env;
  env.master_addr = o.master_addr;
  env.master_port = job.port;
  env.token = job.token;
  env.restart_count = attempt;
  env.max_restarts = o.max_restarts;
  env.run_id = job.run_id;
  env.store_port = store_port;
  env.error_dir = o.log_dir;
  env.omp_threads = job.omp_threads;
  env.paratrain_threads = job.threads;
  return env;
}

// The report's lines of how an attempt ended.
void note_outcome(LaunchReport& report, const AttemptResult& result) {
  const bool failed = result.outcome != Outcome::kSuccess;
  report.first_failed_rank = failed ? result.failure.rank : -1;
  report.failure.clear();
  if (failed) {
    report.failure = result.failure.rank >= 0
                         ? "rank " + std::to_string(result.failure.rank) + " (node " +
                               std::to_string(result.failure.node) + ", " + result.failure.host + ") failed with " +
                               result.failure.what
                         : result.failure.what;
  }
  report.exit_code = failed ? std::max(1, result.failure.exit_code) : 0;
}

}  // namespace

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

int Launcher::run() {
  const auto t_start = Clock::now();
  const LaunchOptions& o = options_;
  PT_CHECK(!o.program.empty(), "launch: no program");
  JobSetup job = set_up_job(o);

  SignalScope signals;
  const std::vector<std::string> base_env = current_environment();
  // The ranks' flight records (dumps, progress files) go beside the logs.
  FlightWatch flight(o.log_dir);
  report_ = LaunchReport{};
  std::unique_ptr<comm::TcpStoreServer> ranks_server;

  for (int attempt = 0;; ++attempt) {
    // (0) node 0: a fresh store for the paratrain ranks; nothing of the last attempt's keys
    // survives (every rank of every node has exited by now).
    if (o.node_rank == 0) {
      ranks_server.reset();
      ranks_server = host_attempt_store(job, attempt);
    }
    // (1) meet
    const std::optional<RoundInfo> round = meet(o, job, attempt, signals);
    if (!round) {
      say("received " + signal_name(signals.interrupt()) + " during the rendezvous; no rank was started");
      report_.exit_code = 128 + signals.interrupt();
      return report_.exit_code;
    }
    const int store_port = job.rdzv ? job.rdzv->ranks_store_port(attempt) : ranks_server->port();
    PT_LOG_DEBUG(kLaunch, "attempt ", attempt, " (restart ", attempt, " of at most ", o.max_restarts, "): ", job.nproc,
                 " local ranks of ", round->world_size, ", the ranks' store on port ", store_port);

    // (2) start the local ranks
    const auto t_attempt = attempt == 0 ? t_start : Clock::now();
    {
      std::vector<WatchedRank> mine(static_cast<size_t>(job.nproc));
      for (int i = 0; i < job.nproc; ++i) mine[static_cast<size_t>(i)].rank = round->rank_base + i;
      flight.reset(mine);  // the last attempt's records
    }
    LocalRanksSpec spec;
    spec.exe = job.exe;
    spec.argv = o.program;
    spec.base_env = base_env;
    spec.job = job_env(o, job, attempt, store_port);
    spec.round = *round;
    spec.nproc = job.nproc;
    spec.node_rank = o.node_rank;
    spec.nnodes = o.nnodes;
    spec.host = job.host;
    spec.log_dir = o.log_dir;
    spec.flight_dir = flight.dir();
    spec.attempt = attempt;
    std::vector<RankProc> ranks = start_local_ranks(spec);
    report_.startup_s = seconds_since(t_attempt);

    // (3) supervise, (4) agree
    const AttemptContext ctx{o, job.host, job.where, job.rdzv.get(), *round, attempt, spec.job.error_dir, signals,
                             flight};
    const AttemptResult result = AttemptSupervisor(ctx, ranks).run();
    for (RankProc& p : ranks) {
      if (p.log.valid()) p.log.reset();
    }
    report_.ranks.clear();
    for (RankProc& p : ranks) report_.ranks.push_back(p.rep);
    note_outcome(report_, result);

    const bool restart = result.outcome == Outcome::kFailure && !result.store_lost && attempt < o.max_restarts;
    if (restart) {
      report_.restarts_used = attempt + 1;
      say(report_.failure + "; restarting the group (restart " + std::to_string(attempt + 1) + " of " +
          std::to_string(o.max_restarts) + ")");
      PT_LOG_DEBUG(kLaunch, "restart ", attempt + 1, ": every local rank is reaped; starting the group again");
      continue;
    }
    if (job.rdzv && !result.store_lost) {
      try {
        if (o.node_rank == 0) {
          job.rdzv->wait_acks(attempt, kAckTimeoutS);
        } else {
          job.rdzv->ack(attempt);
        }
      } catch (const Error&) {
      }
    }
    if (result.outcome != Outcome::kSuccess || report_.restarts_used > 0) {
      std::string s = format_summary(report_, o.max_restarts);
      write_all(2, s.data(), s.size());
    }
    return report_.exit_code;
  }
}

std::string format_summary(const LaunchReport& report, int max_restarts) {
  auto fmt = [](const char* f, auto... a) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), f, a...);
    return std::string(buf);
  };
  std::string s = "paratrain launch: summary: ";
  if (report.exit_code == 0) s += "every rank succeeded";
  else s += report.failure + "; exit code " + std::to_string(report.exit_code);
  s += "; restarts used: " + std::to_string(report.restarts_used) + " of " + std::to_string(max_restarts) + "\n";
  s += fmt("  %-1s %-6s %-8s %-16s %-26s %-9s %s\n", " ", "rank", "pid", "host", "result", "time", "last stderr");
  for (const RankReport& r : report.ranks) {
    std::string result;
    if (!r.exited) result = "not reaped";
    else if (r.term_signal) result = (r.stopped ? "stopped by " : "killed by ") + signal_name(r.term_signal);
    else if (r.exit_code == 0) result = "ok";
    else result = "exit code " + std::to_string(r.exit_code) + (r.stopped ? " (stopped)" : "");
    std::string last = r.stderr_tail.empty() ? "" : r.stderr_tail.back();
    if (last.size() > 60) last = last.substr(0, 57) + "...";
    std::string host = r.host.size() > 16 ? r.host.substr(0, 16) : r.host;
    std::string row = fmt("  %-1s %-6d %-8d %-16s %-26s %-9s %s", r.rank == report.first_failed_rank ? "*" : " ",
                          r.rank, static_cast<int>(r.pid), host.c_str(), result.c_str(),
                          fmt("%.2fs", r.run_s).c_str(), last.c_str());
    while (!row.empty() && row.back() == ' ') row.pop_back();
    s += row + "\n";
  }
  for (const RankReport& r : report.ranks) {
    if (r.rank != report.first_failed_rank || r.stderr_tail.empty()) continue;
    s += "  last stderr lines of rank " + std::to_string(r.rank) + ":\n";
    for (const auto& line : r.stderr_tail) s += "    [" + std::to_string(r.rank) + "] " + line + "\n";
  }
  for (const RankReport& r : report.ranks)
    if (r.rank == report.first_failed_rank && !r.error_file.empty())
      s += "  error file of rank " + std::to_string(r.rank) + " (TORCHELASTIC_ERROR_FILE): " + r.error_file + "\n";
  if (report.first_failed_rank >= 0 &&
      std::none_of(report.ranks.begin(), report.ranks.end(),
                   [&](const RankReport& r) { return r.rank == report.first_failed_rank; }))
    s += "  * first failure on another node: " + report.failure + "\n";
  return s;
}

int run_launch_command(const std::vector<std::string>& args) {
  LaunchOptions o = parse_launch_args(args);
  if (o.help) {
    std::string u = launch_usage();
    write_all(1, u.data(), u.size());
    return 0;
  }
  Launcher l(std::move(o));
  return l.run();
}

}  // namespace paratrain::launch
