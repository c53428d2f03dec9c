#include "launch/job_setup.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "launch/launcher_common.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/launch/host.h"
#include "paratrain/launch/process.h"

namespace paratrain::launch {
namespace {

constexpr double kStoreOpTimeoutS = 30.0;  // one store request of the launcher

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

// A port for the program's MASTER_PORT, free now. Rank 0 binds it only once the program has
// started (seconds later for `import torch`), so it is picked between 20000 and the start of
// the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): there no other
// process's outgoing connection is given it meanwhile, as one may be given a port of the
// kernel's own pick (bind to port 0), which lies inside that range. The kernel's pick where
// the range leaves no room below it.
int free_tcp_port() {
  int low = 32768, high = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> low >> high;
  constexpr int kFirst = 20000;
  if (low - 1 > kFirst) {
    std::mt19937 pick(std::random_device{}());
    std::uniform_int_distribution<int> port_in(kFirst, low - 1);
    for (int tries = 0; tries < 64; ++tries)
      if (const int port = port_in(pick); tcp_port_unavailable(port).empty()) return port;
  }
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

// Node 0: MASTER_PORT checked free (or picked), and on a multi-node job the launchers'
// rendezvous store hosted at MASTER_PORT+1.
void set_up_node0_ports(const LaunchOptions& o, JobSetup& job) {
  if (job.port < 0) {
    job.port = free_tcp_port();
  } else if (std::string why = tcp_port_unavailable(job.port); !why.empty()) {
    PT_THROW(InputError, "launch: --master-port ", job.port, " cannot be used on this host (", why,
             "); MASTER_PORT is for the program's rank 0");
  }
  if (o.nnodes > 1) {
    if (job.port >= 65535) PT_THROW(InputError, "launch: --master-port must be below 65535 on a multi-node job");
    try {
      job.rdzv_server = std::make_unique<comm::TcpStoreServer>("", job.port + 1, job.token);
    } catch (const Error& e) {
      PT_THROW(InputError, "launch: port ", job.port + 1,
               " (--master-port + 1, the launchers' rendezvous) cannot be used on this host (", e.what(), ")");
    }
  }
}

// A multi-node job's rendezvous: the launchers' store (node 0's, at MASTER_PORT+1) and this
// node's NodeRendezvous over it.
std::unique_ptr<NodeRendezvous> join_launchers_store(const LaunchOptions& o, const JobSetup& job) {
  std::shared_ptr<comm::Store> store;
  try {
    store = std::make_shared<comm::TcpStore>(
        o.node_rank == 0 ? std::string("127.0.0.1") : o.master_addr, job.port + 1, job.token,
        std::chrono::milliseconds(static_cast<int64_t>(kStoreOpTimeoutS * 1000)),
        std::chrono::milliseconds(static_cast<int64_t>(o.rdzv_timeout_s * 1000)));
  } catch (const TimeoutError& e) {
    PT_THROW(TimeoutError, "launch: rendezvous failed: node 0 (the store at ", job.where, ") did not arrive within ",
             o.rdzv_timeout_s, " s; this is node ", o.node_rank, " (", e.what(), ")");
  } catch (const Error& e) {
    PT_THROW(CommError, "launch: rendezvous failed: cannot use node 0's store at ", job.where, ": ", e.what());
  }
  return std::make_unique<NodeRendezvous>(store, o.nnodes, o.node_rank, job.where);
}

}  // namespace

JobSetup set_up_job(const LaunchOptions& o) {
  JobSetup job;
  job.nproc = o.nproc_per_node;
  if (o.nproc_auto) {
    NprocChoice c = auto_nproc_per_node();
    job.nproc = c.nproc;
    say("--nproc-per-node auto: " + std::to_string(job.nproc) + " (" + c.reason + ")");
  }
  job.exe = resolve_program(o.program[0]);
  job.token = env::get_string("PARATRAIN_TOKEN");
  if (job.token.empty()) {
    if (o.nnodes > 1)
      PT_THROW(InputError, "launch: a multi-node job needs PARATRAIN_TOKEN set to the same secret on every node "
                           "(e.g. export PARATRAIN_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'))");
    job.token = make_token();
  }
  if (!o.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec || !std::filesystem::is_directory(o.log_dir))
      PT_THROW(InputError, "launch: cannot create --log-dir '", o.log_dir, "': ", ec ? ec.message() : "not a directory");
  }
  job.host = host_name();
  job.threads = threads_per_rank(usable_cpu_count(), job.nproc);

  job.port = o.master_port;
  if (o.node_rank == 0) set_up_node0_ports(o, job);
  job.where = o.master_addr + ":" + std::to_string(job.port + 1);
  job.run_id = o.master_addr + ":" + std::to_string(job.port);
  if (o.nnodes > 1) job.rdzv = join_launchers_store(o, job);

  // OMP_NUM_THREADS as torchrun sets it: 1 for each rank when the caller left it unset and
  // there are several ranks here, said once; paratrain's own ranks size their compute
  // threads by PARATRAIN_THREADS instead.
  if (!env::raw("OMP_NUM_THREADS") && job.nproc > 1) {
    job.omp_threads = 1;
    say("OMP_NUM_THREADS is not set: each of the " + std::to_string(job.nproc) +
        " ranks gets OMP_NUM_THREADS=1 (as torchrun sets it); set it to choose (paratrain's own ranks use "
        "PARATRAIN_THREADS=" + env::raw("PARATRAIN_THREADS").value_or(std::to_string(job.threads)) + ")");
  }
  return job;
}

std::unique_ptr<comm::TcpStoreServer> host_attempt_store(const JobSetup& job, int attempt) {
  std::unique_ptr<comm::TcpStoreServer> s;
  try {
    s = std::make_unique<comm::TcpStoreServer>("", 0, job.token);
    if (s->port() == job.port) {
      auto other = std::make_unique<comm::TcpStoreServer>("", 0, job.token);  // s holds MASTER_PORT meanwhile
      s = std::move(other);
    }
  } catch (const Error& e) {
    PT_THROW(IoError, "launch: cannot host the ranks' store", attempt > 0 ? " for restart " + std::to_string(attempt) : "",
             ": ", e.what());
  }
  if (job.rdzv) {
    try {
      job.rdzv->publish_ranks_store_port(attempt, s->port());
    } catch (const Error& e) {
      PT_THROW(CommError, "launch: rendezvous failed: cannot use the launchers' store at ", job.where, ": ", e.what());
    }
  }
  return s;
}

}  // namespace paratrain::launch
