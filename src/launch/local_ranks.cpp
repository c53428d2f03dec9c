#include "launch/local_ranks.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "launch/launcher_common.h"
#include "paratrain/base/log.h"

namespace paratrain::launch {
namespace {

constexpr size_t kTailLines = 5;  // stderr lines kept per rank for the summary

// rank_<r>.log in log_dir: truncated on the first attempt, appended to (under a line naming
// the restart) on later ones. An invalid Fd (and a line saying why) if it cannot be opened.
Fd open_rank_log(const std::string& log_dir, int rank, int attempt) {
  std::string path = log_dir + "/rank_" + std::to_string(rank) + ".log";
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (attempt == 0 ? O_TRUNC : O_APPEND);
  Fd log(::open(path.c_str(), flags, 0644));
  if (!log.valid()) say("cannot open " + path + ": " + std::strerror(errno));
  if (attempt > 0 && log.valid()) {
    std::string h = "--- paratrain launch: restart " + std::to_string(attempt) + " ---\n";
    write_all(log.get(), h.data(), h.size());
  }
  return log;
}

}  // namespace

std::vector<RankProc> start_local_ranks(const LocalRanksSpec& spec) {
  std::vector<RankProc> ranks(static_cast<size_t>(spec.nproc));
  for (int i = 0; i < spec.nproc; ++i) {
    RankProc& p = ranks[static_cast<size_t>(i)];
    RankAssignment who;
    who.rank = spec.round.rank_base + i;
    who.local_rank = i;
    who.world_size = spec.round.world_size;
    who.local_world_size = spec.nproc;
    who.group_rank = spec.node_rank;
    who.group_world_size = spec.nnodes;
    p.rep.rank = who.rank;
    p.rep.local_rank = i;
    p.rep.host = spec.host;
    if (!spec.log_dir.empty()) p.log = open_rank_log(spec.log_dir, who.rank, spec.attempt);
    const std::string prefix = std::string("[").append(std::to_string(who.rank)).append("] ");
    p.out_sink = std::make_unique<LineSink>(prefix, 1, p.log.get(), 0);
    p.err_sink = std::make_unique<LineSink>(prefix, 2, p.log.get(), kTailLines);
    SpawnSpec s;
    s.path = spec.exe;
    s.argv = spec.argv;
    if (!spec.job.error_dir.empty()) ::unlink(error_file_path(spec.job.error_dir, who.rank).c_str());  // a stale one
    s.env = build_child_env(spec.base_env, who, spec.job);
    std::erase_if(s.env, [](const std::string& kv) { return kv.rfind("PARATRAIN_FR_DUMP_DIR=", 0) == 0; });
    s.env.push_back("PARATRAIN_FR_DUMP_DIR=" + spec.flight_dir);
    Spawned child = spawn_child(s);
    p.start = std::chrono::steady_clock::now();
    p.rep.pid = child.pid;
    p.out = std::move(child.out);
    p.err = std::move(child.err);
    PT_LOG_DEBUG(kLaunch, "spawned rank ", who.rank, " (local rank ", i, ", pid ", child.pid, "): ", spec.exe);
  }
  return ranks;
}

std::string describe_status(const RankReport& r) {
  if (r.term_signal) return "signal " + std::to_string(r.term_signal) + " (" + signal_name(r.term_signal) + ")";
  return "exit code " + std::to_string(r.exit_code);
}

void pump(Fd& fd, LineSink* sink) {
  if (!fd.valid()) return;
  char buf[65536];
  while (true) {
    ssize_t r = ::read(fd.get(), buf, sizeof(buf));
    if (r > 0) {
      sink->feed(buf, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return;
    sink->finish();  // EOF or error
    fd.reset();
    return;
  }
}

void reap(RankProc& p, int status, const std::string& error_dir) {
  p.rep.exited = true;
  p.rep.run_s = seconds_since(p.start);
  if (WIFSIGNALED(status)) p.rep.term_signal = WTERMSIG(status);
  else p.rep.exit_code = WEXITSTATUS(status);
  // What it wrote before exiting is in the pipes: take it, then stop listening (a
  // subprocess of the rank may hold the pipe open).
  pump(p.out, p.out_sink.get());
  pump(p.err, p.err_sink.get());
  p.out_sink->finish();
  p.err_sink->finish();
  p.out.reset();
  p.err.reset();
  p.rep.stderr_tail.assign(p.err_sink->tail().begin(), p.err_sink->tail().end());
  PT_LOG_DEBUG(kLaunch, "rank ", p.rep.rank, " (pid ", p.rep.pid, ") exited: ", describe_status(p.rep), " after ",
               p.rep.run_s, " s");
  if (!error_dir.empty()) {
    std::string ef = error_file_path(error_dir, p.rep.rank);
    if (::access(ef.c_str(), F_OK) == 0) p.rep.error_file = ef;
  }
}

}  // namespace paratrain::launch
