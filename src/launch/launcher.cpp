// The launcher's engine: one poll loop on the calling thread supervises every local rank.
//
// Per attempt: (1) meet the other nodes (NodeRendezvous, multi-node only), (2) fork the
// local ranks, (3) loop: wake on output, SIGCHLD (self-pipe) or a 100 ms tick; cut output
// into prefixed lines; reap exits; on the first failure (local, or published by another
// node) SIGTERM every live rank and SIGKILL what is left after the grace period; on
// multi-node jobs bump a heartbeat, watch the others' and the round's "failed" key;
// (4) once every local rank is reaped, publish this node's result and wait until every
// node's result is in. Then restart (failure, restarts left, not interrupted) or return.
#include "paratrain/launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "launch/flight_watch.h"
#include "paratrain/comm/store.h"
#include "paratrain/launch/child_env.h"
#include "paratrain/launch/host.h"
#include "paratrain/launch/output.h"
#include "paratrain/launch/process.h"
#include "paratrain/launch/rendezvous.h"

namespace paratrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kTailLines = 5;            // stderr lines kept per rank for the summary
constexpr int kTickMs = 100;                // poll wake-up while anything is pending
constexpr double kHeartbeatEveryS = 1.0;    // multi-node heartbeat period
constexpr double kStaleAfterS = 15.0;       // a node whose heartbeat stops this long is lost
constexpr double kAckTimeoutS = 10.0;       // node 0 keeps its store up this long for the others
constexpr double kStoreOpTimeoutS = 30.0;   // one store request of the launcher

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const std::string& line) {
  std::string s = "paratrain launch: " + line + "\n";
  write_all(2, s.data(), s.size());
}

// ---- signals: a self-pipe written by the handlers, read by the poll loop.
int g_signal_pipe_w = -1;
pid_t g_launcher_pid = -1;

extern "C" void on_launcher_signal(int sig) {
  if (::getpid() != g_launcher_pid) return;  // a forked rank before exec: not ours to report
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe_w >= 0) {
    ssize_t r = ::write(g_signal_pipe_w, &b, 1);
    (void)r;
  }
  errno = saved;
}

class SignalScope {
 public:
  SignalScope() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) PT_THROW(IoError, "launch: pipe(): ", std::strerror(errno));
    read_.reset(p[0]);
    write_.reset(p[1]);
    g_signal_pipe_w = write_.get();
    g_launcher_pid = ::getpid();
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < kCaught.size(); ++i) ::sigaction(kCaught[i], &sa, &old_[i]);
    struct sigaction ign;
    std::memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalScope() {
    for (size_t i = 0; i < kCaught.size(); ++i) ::sigaction(kCaught[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_signal_pipe_w = -1;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int fd() const { return read_.get(); }
  // Reads the pipe; remembers the first interrupting signal. Returns interrupting signals seen now.
  std::vector<int> drain() {
    std::vector<int> out;
    unsigned char buf[64];
    while (true) {
      ssize_t r = ::read(read_.get(), buf, sizeof(buf));
      if (r <= 0) break;
      for (ssize_t i = 0; i < r; ++i) {
        if (buf[i] == SIGUSR1) usr1_ = true;
        else if (buf[i] != SIGCHLD) out.push_back(buf[i]);
      }
    }
    if (!out.empty() && interrupt_ == 0) interrupt_ = out.front();
    return out;
  }
  int interrupt() const { return interrupt_; }
  // Whether SIGUSR1 (a request for the flight-recorder report) came since the last call.
  bool take_usr1() {
    bool u = usr1_;
    usr1_ = false;
    return u;
  }

 private:
  static constexpr std::array<int, 5> kCaught = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1};
  Fd read_, write_;
  std::array<struct sigaction, 5> old_{};
  struct sigaction old_pipe_{};
  int interrupt_ = 0;
  bool usr1_ = false;
};

// One local rank while it runs.
struct RankProc {
  RankReport rep;
  Fd out, err, log;
  std::unique_ptr<LineSink> out_sink, err_sink;
  Clock::time_point start;
  bool signalled_term = false;
};

std::string describe_status(const RankReport& r) {
  if (r.term_signal) return "signal " + std::to_string(r.term_signal) + " (" + signal_name(r.term_signal) + ")";
  return "exit code " + std::to_string(r.exit_code);
}

// Reads everything available on fd into sink; closes fd on end of stream.
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

// Why `port` cannot be listened on (on every interface, as a TCPStore would), or "".
std::string tcp_port_unavailable(int port) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return std::string("socket(): ") + std::strerror(errno);
  int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s.get(), 1) != 0)
    return std::strerror(errno);
  return "";
}

// A port that was free a moment ago (the kernel's pick), for the program's MASTER_PORT.
int free_tcp_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  if (!s.valid() || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    PT_THROW(IoError, "launch: cannot find a free TCP port for MASTER_PORT: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

// The paratrain ranks' store on a port the kernel picks, never `master_port` (the program's).
std::unique_ptr<comm::TcpStoreServer> host_ranks_store(const std::string& token, int master_port) {
  auto s = std::make_unique<comm::TcpStoreServer>("", 0, token);
  if (s->port() == master_port) {
    auto other = std::make_unique<comm::TcpStoreServer>("", 0, token);  // s holds master_port meanwhile
    s = std::move(other);
  }
  return s;
}

enum class Outcome { kSuccess, kFailure, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSuccess;
  FailureInfo failure;
  bool store_lost = false;
};

}  // namespace

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

int Launcher::run() {
  const auto t_start = Clock::now();
  const LaunchOptions& o = options_;
  PT_CHECK(!o.program.empty(), "launch: no program");

  // ---- checks before anything starts
  int nproc = o.nproc_per_node;
  if (o.nproc_auto) {
    NprocChoice c = auto_nproc_per_node();
    nproc = c.nproc;
    say("--nproc-per-node auto: " + std::to_string(nproc) + " (" + c.reason + ")");
  }
  const std::string exe = resolve_program(o.program[0]);
  std::string token = env::get_string("PARATRAIN_TOKEN");
  if (token.empty()) {
    if (o.nnodes > 1)
      PT_THROW(InputError, "launch: a multi-node job needs PARATRAIN_TOKEN set to the same secret on every node "
                           "(e.g. export PARATRAIN_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'))");
    token = make_token();
  }
  if (!o.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec || !std::filesystem::is_directory(o.log_dir))
      PT_THROW(InputError, "launch: cannot create --log-dir '", o.log_dir, "': ", ec ? ec.message() : "not a directory");
  }
  const std::string host = host_name();
  const int threads = threads_per_rank(usable_cpu_count(), nproc);

  // ---- ports. MASTER_PORT is the program's: its rank 0 hosts its own store there (PyTorch's
  // TCPStore under env://), so no launcher binds it; node 0 only checks that it is free (or,
  // on one node without --master-port, picks a free one). Node 0 hosts the paratrain ranks'
  // store on a port the kernel picks (PARATRAIN_STORE_PORT), made fresh for every attempt,
  // and on a multi-node job the launchers' rendezvous store on MASTER_PORT+1 (it lives as
  // long as the job and tells the other nodes the ranks' store's port each round).
  std::unique_ptr<comm::TcpStoreServer> ranks_server, rdzv_server;
  int port = o.master_port;
  if (o.node_rank == 0) {
    if (port < 0) {
      port = free_tcp_port();
    } else if (std::string why = tcp_port_unavailable(port); !why.empty()) {
      PT_THROW(InputError, "launch: --master-port ", port, " cannot be used on this host (", why,
               "); MASTER_PORT is for the program's rank 0");
    }
    if (o.nnodes > 1) {
      if (port >= 65535) PT_THROW(InputError, "launch: --master-port must be below 65535 on a multi-node job");
      try {
        rdzv_server = std::make_unique<comm::TcpStoreServer>("", port + 1, token);
      } catch (const Error& e) {
        PT_THROW(InputError, "launch: port ", port + 1, " (--master-port + 1, the launchers' rendezvous) cannot be used on this host (",
                 e.what(), ")");
      }
    }
  }
  const std::string where = o.master_addr + ":" + std::to_string(port + 1);
  const std::string run_id = o.master_addr + ":" + std::to_string(port);

  std::shared_ptr<comm::Store> store;
  std::unique_ptr<NodeRendezvous> rdzv;
  if (o.nnodes > 1) {
    try {
      store = std::make_shared<comm::TcpStore>(
          o.node_rank == 0 ? std::string("127.0.0.1") : o.master_addr, port + 1, token,
          std::chrono::milliseconds(static_cast<int64_t>(kStoreOpTimeoutS * 1000)),
          std::chrono::milliseconds(static_cast<int64_t>(o.rdzv_timeout_s * 1000)));
    } catch (const TimeoutError& e) {
      PT_THROW(TimeoutError, "launch: rendezvous failed: node 0 (the store at ", where, ") did not arrive within ",
               o.rdzv_timeout_s, " s; this is node ", o.node_rank, " (", e.what(), ")");
    } catch (const Error& e) {
      PT_THROW(CommError, "launch: rendezvous failed: cannot use node 0's store at ", where, ": ", e.what());
    }
    rdzv = std::make_unique<NodeRendezvous>(store, o.nnodes, o.node_rank, where);
  }

  // OMP_NUM_THREADS as torchrun sets it: 1 for each rank when the caller left it unset and
  // there are several ranks here, said once; paratrain's own ranks size their compute
  // threads by PARATRAIN_THREADS instead.
  int omp_threads = 0;
  if (!env::raw("OMP_NUM_THREADS") && nproc > 1) {
    omp_threads = 1;
    say("OMP_NUM_THREADS is not set: each of the " + std::to_string(nproc) +
        " ranks gets OMP_NUM_THREADS=1 (as torchrun sets it); set it to choose (paratrain's own ranks use "
        "PARATRAIN_THREADS=" + env::raw("PARATRAIN_THREADS").value_or(std::to_string(threads)) + ")");
  }

  SignalScope signals;
  const std::vector<std::string> base_env = current_environment();
  // The ranks' flight records (dumps, progress files) go beside the logs.
  FlightWatch flight(o.log_dir);
  report_ = LaunchReport{};

  for (int attempt = 0;; ++attempt) {
    // ---- (0) node 0: a fresh store for the paratrain ranks; nothing of the last attempt's
    // keys survives (every rank of every node has exited by now).
    if (o.node_rank == 0) {
      ranks_server.reset();
      try {
        ranks_server = host_ranks_store(token, port);
      } catch (const Error& e) {
        PT_THROW(IoError, "launch: cannot host the ranks' store", attempt > 0 ? " for restart " + std::to_string(attempt) : "",
                 ": ", e.what());
      }
      if (rdzv) {
        try {
          rdzv->publish_ranks_store_port(attempt, ranks_server->port());
        } catch (const Error& e) {
          PT_THROW(CommError, "launch: rendezvous failed: cannot use the launchers' store at ", where, ": ", e.what());
        }
      }
    }
    // ---- (1) meet
    RoundInfo round;
    if (rdzv) {
      try {
        round = rdzv->join(attempt, nproc, host, o.rdzv_timeout_s, [&] {
          signals.drain();
          return signals.interrupt() != 0;
        });
      } catch (const Error&) {
        if (signals.interrupt() == 0) throw;
        say("received " + signal_name(signals.interrupt()) + " during the rendezvous; no rank was started");
        report_.exit_code = 128 + signals.interrupt();
        return report_.exit_code;
      }
    } else {
      round.attempt = attempt;
      round.nodes = {NodeInfo{0, nproc, host}};
      round.rank_base = 0;
      round.world_size = nproc;
    }
    const int store_port = rdzv ? rdzv->ranks_store_port(attempt) : ranks_server->port();
    PT_LOG_DEBUG(kLaunch, "attempt ", attempt, " (restart ", attempt, " of at most ", o.max_restarts, "): ", nproc,
                 " local ranks of ", round.world_size, ", the ranks' store on port ", store_port);

    // ---- (2) start the local ranks
    JobEnv job;
    job.master_addr = o.master_addr;
    job.master_port = port;
    job.token = token;
    job.restart_count = attempt;
    job.max_restarts = o.max_restarts;
    job.run_id = run_id;
    job.store_port = store_port;
    job.error_dir = o.log_dir;
    job.omp_threads = omp_threads;
    job.paratrain_threads = threads;
    const auto t_attempt = attempt == 0 ? t_start : Clock::now();
    std::vector<RankProc> ranks(static_cast<size_t>(nproc));
    {
      std::vector<WatchedRank> mine(static_cast<size_t>(nproc));
      for (int i = 0; i < nproc; ++i) mine[static_cast<size_t>(i)].rank = round.rank_base + i;
      flight.reset(mine);  // the last attempt's records
    }
    for (int i = 0; i < nproc; ++i) {
      RankProc& p = ranks[static_cast<size_t>(i)];
      RankAssignment who;
      who.rank = round.rank_base + i;
      who.local_rank = i;
      who.world_size = round.world_size;
      who.local_world_size = nproc;
      who.group_rank = o.node_rank;
      who.group_world_size = o.nnodes;
      p.rep.rank = who.rank;
      p.rep.local_rank = i;
      p.rep.host = host;
      if (!o.log_dir.empty()) {
        std::string path = o.log_dir + "/rank_" + std::to_string(who.rank) + ".log";
        int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (attempt == 0 ? O_TRUNC : O_APPEND);
        p.log.reset(::open(path.c_str(), flags, 0644));
        if (!p.log.valid()) say("cannot open " + path + ": " + std::strerror(errno));
        if (attempt > 0 && p.log.valid()) {
          std::string h = "--- paratrain launch: restart " + std::to_string(attempt) + " ---\n";
          write_all(p.log.get(), h.data(), h.size());
        }
      }
      std::string prefix = "[" + std::to_string(who.rank) + "] ";
      p.out_sink = std::make_unique<LineSink>(prefix, 1, p.log.get(), 0);
      p.err_sink = std::make_unique<LineSink>(prefix, 2, p.log.get(), kTailLines);
      SpawnSpec spec;
      spec.path = exe;
      spec.argv = o.program;
      if (!job.error_dir.empty()) ::unlink(error_file_path(job.error_dir, who.rank).c_str());  // a stale one
      spec.env = build_child_env(base_env, who, job);
      std::erase_if(spec.env, [](const std::string& kv) { return kv.rfind("PARATRAIN_FR_DUMP_DIR=", 0) == 0; });
      spec.env.push_back("PARATRAIN_FR_DUMP_DIR=" + flight.dir());
      Spawned s = spawn_child(spec);
      p.start = Clock::now();
      p.rep.pid = s.pid;
      p.out = std::move(s.out);
      p.err = std::move(s.err);
      PT_LOG_DEBUG(kLaunch, "spawned rank ", who.rank, " (local rank ", i, ", pid ", s.pid, "): ", exe);
    }
    report_.startup_s = seconds_since(t_attempt);

    // ---- (3) supervise
    AttemptResult result;
    bool stopping = false;
    bool killed = false;
    Clock::time_point kill_at{};
    bool have_failure = false;
    bool result_published = false;
    auto last_beat = Clock::now() - std::chrono::hours(1);
    auto last_check = last_beat;
    bool lost_node_and_done = false;  // a lost node never posts its result: stop waiting for it

    auto watched = [&] {
      std::vector<WatchedRank> w;
      for (const RankProc& p : ranks) w.push_back({p.rep.rank, p.rep.pid, p.rep.exited, describe_status(p.rep)});
      return w;
    };
    bool failure_reported = false;
    auto begin_stop = [&](int sig) {
      if (!stopping) {
        stopping = true;
        kill_at = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(o.grace_period_s * 1e6));
      }
      for (RankProc& p : ranks) {
        if (p.rep.exited) continue;
        PT_LOG_DEBUG(kLaunch, "sending ", signal_name(sig), " to rank ", p.rep.rank, " (pid ", p.rep.pid, ")");
        signal_child(p.rep.pid, sig);
        p.rep.stopped = true;
      }
    };
    auto store_failed = [&](const Error& e) {
      if (result.store_lost) return;
      result.store_lost = true;
      say(std::string("lost node 0's store at ") + where + ": " + e.what());
      if (!have_failure) {
        have_failure = true;
        result.failure = FailureInfo{-1, 0, round.nodes.front().host, 1, false,
                                     std::string("lost contact with node 0's store (") + e.what() + ")"};
      }
      begin_stop(SIGTERM);
    };
    auto record_failure = [&](const FailureInfo& f) {
      if (have_failure) return;
      have_failure = true;
      result.failure = f;
      if (rdzv && !result.store_lost) {
        try {
          result.failure = rdzv->publish_failure(attempt, f);
        } catch (const Error& e) {
          store_failed(e);
        }
      }
    };

    while (true) {
      // Wait for output, a signal or the next tick.
      std::vector<pollfd> fds;
      fds.push_back({signals.fd(), POLLIN, 0});
      for (RankProc& p : ranks) {
        if (p.out.valid()) fds.push_back({p.out.get(), POLLIN, 0});
        if (p.err.valid()) fds.push_back({p.err.get(), POLLIN, 0});
      }
      int timeout = rdzv || stopping ? kTickMs : o.hang_timeout_s > 0 ? 250 : 1000;
      ::poll(fds.data(), fds.size(), timeout);

      // Signals to the launcher: forward; a second one kills at once.
      for (int sig : signals.drain()) {
        if (!stopping) {
          say("received " + signal_name(sig) + "; stopping the ranks (SIGKILL after " +
              std::to_string(o.grace_period_s).substr(0, 4) + " s)");
          if (!have_failure) {
            FailureInfo f{-1, o.node_rank, host, 128 + sig, true, "launcher on node " + std::to_string(o.node_rank) +
                                                                  " received " + signal_name(sig)};
            record_failure(f);
          }
          begin_stop(sig);
        } else if (!killed) {
          killed = true;
          begin_stop(SIGKILL);
        }
      }

      // kill -USR1 to the launcher: the flight-recorder report; the job goes on.
      if (signals.take_usr1()) flight.report(watched(), "the launcher received SIGUSR1; the job goes on");

      // Output.
      for (RankProc& p : ranks) {
        pump(p.out, p.out_sink.get());
        pump(p.err, p.err_sink.get());
      }

      // Exits.
      for (RankProc& p : ranks) {
        if (p.rep.exited) continue;
        int st = 0;
        pid_t r = ::waitpid(p.rep.pid, &st, WNOHANG);
        if (r != p.rep.pid) continue;
        p.rep.exited = true;
        p.rep.run_s = seconds_since(p.start);
        if (WIFSIGNALED(st)) p.rep.term_signal = WTERMSIG(st);
        else p.rep.exit_code = WEXITSTATUS(st);
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
        if (!job.error_dir.empty()) {
          std::string ef = error_file_path(job.error_dir, p.rep.rank);
          if (::access(ef.c_str(), F_OK) == 0) p.rep.error_file = ef;
        }
        if (p.rep.status_code() != 0 && !stopping) {
          // What every rank was doing, gathered before anything is stopped.
          if (!failure_reported && flight.any_recorder(watched())) {
            failure_reported = true;
            flight.report(watched(), "rank " + std::to_string(p.rep.rank) + " failed with " + describe_status(p.rep));
          }
          record_failure(FailureInfo{p.rep.rank, o.node_rank, host, p.rep.status_code(), false, describe_status(p.rep)});
          begin_stop(SIGTERM);
        }
      }
      // No collective advanced for --hang-timeout while some wait: report, then stop the job.
      if (o.hang_timeout_s > 0 && !stopping) {
        std::vector<WatchedRank> w = watched();
        const double stalled = flight.stalled_s(w);
        if (stalled >= o.hang_timeout_s) {
          char what[160];
          std::snprintf(what, sizeof(what), "the job is hung: no collective advanced on any rank for %.1f s (--hang-timeout %g)",
                        stalled, o.hang_timeout_s);
          say(what);
          failure_reported = true;
          flight.report(w, what);
          record_failure(FailureInfo{-1, o.node_rank, host, 1, false, what});
          begin_stop(SIGTERM);
        }
      }

      // Signal the group of every rank still alive once more if the grace period is over.
      if (stopping && !killed && Clock::now() >= kill_at) {
        killed = true;
        begin_stop(SIGKILL);
      }

      // Other nodes: their failures, their heartbeats.
      if (rdzv && !result.store_lost && seconds_since(last_check) * 1000 >= kTickMs) {
        last_check = Clock::now();
        try {
          if (!stopping) {
            if (auto f = rdzv->failure(attempt)) {
              have_failure = true;
              result.failure = *f;
              begin_stop(SIGTERM);
            }
          }
          if (seconds_since(last_beat) >= kHeartbeatEveryS) {
            last_beat = Clock::now();
            for (int n : rdzv->heartbeat(attempt, kStaleAfterS)) {
              record_failure(FailureInfo{-1, n, round.nodes[static_cast<size_t>(n)].host, 1, false,
                                         "node " + std::to_string(n) + " (" + round.nodes[static_cast<size_t>(n)].host +
                                             ") stopped responding"});
              if (!stopping) begin_stop(SIGTERM);
              lost_node_and_done = std::all_of(ranks.begin(), ranks.end(), [](const RankProc& p) { return p.rep.exited; });
            }
          }
        } catch (const Error& e) {
          store_failed(e);
        }
      }

      if (!std::all_of(ranks.begin(), ranks.end(), [](const RankProc& p) { return p.rep.exited; })) continue;
      if (!rdzv || result.store_lost || lost_node_and_done) break;
      // ---- (4) every local rank is done: agree with the other nodes.
      try {
        if (!result_published) {
          bool ok = std::all_of(ranks.begin(), ranks.end(), [](const RankProc& p) { return p.rep.status_code() == 0; });
          rdzv->publish_result(attempt, ok && !have_failure);
          result_published = true;
        }
        if (auto all = rdzv->results(attempt)) {
          if (!have_failure && std::find(all->begin(), all->end(), false) != all->end()) {
            have_failure = true;
            auto f = rdzv->failure(attempt);
            result.failure = f ? *f : FailureInfo{-1, -1, "?", 1, false, "another node failed"};
          }
          break;
        }
      } catch (const Error& e) {
        store_failed(e);
        break;
      }
    }

    for (RankProc& p : ranks) {
      if (p.log.valid()) p.log.reset();
    }
    report_.ranks.clear();
    for (RankProc& p : ranks) report_.ranks.push_back(p.rep);
    if (signals.interrupt() != 0) {
      // An interrupted launcher never restarts; a failure that came first keeps its code.
      if (!have_failure) {
        result.failure = FailureInfo{-1, o.node_rank, host, 128 + signals.interrupt(), true,
                                     "launcher on node " + std::to_string(o.node_rank) + " received " +
                                         signal_name(signals.interrupt())};
      }
      result.failure.interrupted = true;
      have_failure = true;
    }
    if (!have_failure) {
      result.outcome = Outcome::kSuccess;
    } else {
      result.outcome = result.failure.interrupted ? Outcome::kInterrupted : Outcome::kFailure;
    }
    report_.first_failed_rank = have_failure ? result.failure.rank : -1;
    report_.failure.clear();
    if (have_failure) {
      report_.failure = result.failure.rank >= 0
                            ? "rank " + std::to_string(result.failure.rank) + " (node " +
                                  std::to_string(result.failure.node) + ", " + result.failure.host + ") failed with " +
                                  result.failure.what
                            : result.failure.what;
    }
    report_.exit_code = have_failure ? std::max(1, result.failure.exit_code) : 0;

    bool restart = result.outcome == Outcome::kFailure && !result.store_lost && attempt < o.max_restarts;
    if (restart) {
      report_.restarts_used = attempt + 1;
      say(report_.failure + "; restarting the group (restart " + std::to_string(attempt + 1) + " of " +
          std::to_string(o.max_restarts) + ")");
      PT_LOG_DEBUG(kLaunch, "restart ", attempt + 1, ": every local rank is reaped; starting the group again");
      continue;
    }
    if (rdzv && !result.store_lost) {
      try {
        if (o.node_rank == 0) {
          rdzv->wait_acks(attempt, kAckTimeoutS);
        } else {
          rdzv->ack(attempt);
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
